//! The HTTP surface: the OpenSandbox lifecycle API under `/v1`, the execd data
//! plane under `/sandboxes/{id}/proxy/{port}` (direct, token only) and
//! `/v1/sandboxes/{id}/proxy/{port}` (server proxy, API key and token), and
//! a small pvisor admin API for the CLI. Port 18080 of the data plane and
//! `/v1/sandboxes/{id}/networkpolicy` are the egress policy API ([`egress`]).
pub mod admin;
pub mod auth;
pub mod diagnostics;
pub mod egress;
pub mod error;
pub mod lifecycle;
pub mod limits;
pub mod models;
pub mod query;
pub mod request_id;
pub mod snapshots;

use crate::execd;
use crate::server::Ctx;
use axum::extract::DefaultBodyLimit;
use axum::routing::{any, get, post};
use axum::Router;
use error::ApiError;
use std::sync::Arc;

async fn not_found() -> ApiError {
    ApiError::new(axum::http::StatusCode::NOT_FOUND, "NOT_FOUND", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "method not allowed on this route")
}

async fn health() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "healthy"}))
}

async fn version() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "name": "pvisor"}))
}

/// Largest buffered request body (JSON); uploads stream and have no limit.
pub const MAX_BODY: usize = 16 << 20;

pub fn router(ctx: Arc<Ctx>) -> Router {
    let data_plane = execd::dispatch_router(ctx.clone());
    let v1 = Router::new()
        .route("/sandboxes", post(lifecycle::create).get(lifecycle::list))
        .route("/sandboxes/{id}", get(lifecycle::get_one).delete(lifecycle::delete))
        .route("/sandboxes/{id}/renew-expiration", post(lifecycle::renew))
        .route("/sandboxes/{id}/endpoints/{port}", get(lifecycle::endpoint))
        .route("/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(lifecycle::resume))
        .route("/sandboxes/{id}/metadata", axum::routing::patch(lifecycle::patch_metadata))
        .route(
            "/sandboxes/{id}/networkpolicy",
            get(egress::lifecycle).put(egress::lifecycle).patch(egress::lifecycle).delete(egress::lifecycle),
        )
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route("/snapshots/{sid}", get(snapshots::get_one).delete(snapshots::delete))
        .route("/snapshots/{sid}/{*rest}", any(snapshots::unsupported))
        .route("/templates", any(lifecycle::unsupported))
        .route("/templates/{*rest}", any(lifecycle::unsupported))
        .route("/sandboxes/{id}/diagnostics/logs", get(diagnostics::logs))
        .route("/sandboxes/{id}/diagnostics/events", get(diagnostics::events))
        .route("/metrics/events", post(lifecycle::metrics_event))
        .merge(data_plane.clone())
        .route_layer(axum::middleware::from_fn_with_state(ctx.clone(), auth::require_api_key));
    Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .nest("/v1", v1)
        .nest(
            "/pvisor",
            admin::router().route_layer(axum::middleware::from_fn_with_state(ctx.clone(), auth::require_api_key)),
        )
        .merge(data_plane)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(request_id::layer))
        .with_state(ctx)
}

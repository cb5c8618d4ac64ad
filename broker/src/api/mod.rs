//! The HTTP surface: the OpenSandbox lifecycle API under `/v1`, the execd data
//! plane under `/sandboxes/{id}/proxy/{port}` (direct, token only) and
//! `/v1/sandboxes/{id}/proxy/{port}` (server proxy, API key and token), the
//! signed endpoints `/sandboxes/{id}/signed/{port}/{expires}/{signature}`
//! (the route is the credential, [`signing`]), and
//! a small pvisor admin API for the CLI. Port 18080 of the data plane and
//! `/v1/sandboxes/{id}/networkpolicy` are the egress policy API ([`egress`]).
pub mod admin;
pub mod auth;
pub mod create_fields;
pub mod diagnostics;
pub mod egress;
pub mod error;
pub mod hooks;
pub mod lifecycle;
pub mod limits;
pub mod models;
pub mod openapi;
pub mod prom;
pub mod pty;
pub mod query;
pub mod request_id;
pub mod signing;
pub mod snapshots;
pub mod templates;

use crate::execd;
use crate::server::Ctx;
use axum::extract::DefaultBodyLimit;
use axum::routing::any;
use axum::Router;
use error::ApiError;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

async fn not_found() -> ApiError {
    ApiError::new(axum::http::StatusCode::NOT_FOUND, "NOT_FOUND", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "method not allowed on this route")
}

/// `GET /health`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `healthy` while the server answers.
    pub status: &'static str,
}

#[utoipa::path(get, path = "/health", tag = "pvisor", responses((status = 200, body = Health)))]
async fn health() -> axum::Json<Health> {
    axum::Json(Health { status: "healthy" })
}

/// `GET /version`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Version {
    pub version: &'static str,
    pub name: &'static str,
}

#[utoipa::path(get, path = "/version", tag = "pvisor", responses((status = 200, body = Version)))]
async fn version() -> axum::Json<Version> {
    axum::Json(Version { version: env!("CARGO_PKG_VERSION"), name: "pvisor" })
}

/// A router of the shared state, documented as it is built.
pub type ApiRouter = OpenApiRouter<Arc<Ctx>>;

/// Every route: the documented ones through `routes!` (route and operation
/// at once, see [`openapi`]), the others ([`openapi::UNDOCUMENTED`]) plain.
/// `gate` puts the API-key check on the `/v1` and `/pvisor` routes.
pub fn routes(gate: &dyn Fn(ApiRouter) -> ApiRouter) -> ApiRouter {
    let data_plane = ApiRouter::from(execd::dispatch_router());
    let v1 = ApiRouter::new()
        .routes(routes!(lifecycle::create, lifecycle::list))
        .routes(routes!(lifecycle::get_one, lifecycle::delete))
        .routes(routes!(lifecycle::renew))
        .routes(routes!(lifecycle::endpoint))
        .routes(routes!(lifecycle::pause))
        .routes(routes!(lifecycle::resume))
        .routes(routes!(lifecycle::patch_metadata))
        .routes(routes!(egress::lifecycle))
        .routes(routes!(snapshots::create))
        .routes(routes!(snapshots::list))
        .routes(routes!(snapshots::get_one, snapshots::delete))
        .route("/snapshots/{sid}/{*rest}", any(snapshots::unsupported))
        .routes(routes!(templates::create, templates::list))
        .routes(routes!(templates::get_one, templates::delete))
        .routes(routes!(diagnostics::logs))
        .routes(routes!(diagnostics::events))
        .routes(routes!(lifecycle::metrics_event))
        .merge(data_plane.clone());
    ApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(version))
        .routes(routes!(openapi::serve))
        .nest("/v1", gate(v1))
        .nest("/pvisor", gate(admin::router()))
        .merge(gate(ApiRouter::new().route("/metrics", axum::routing::get(prom::metrics))))
        .merge(data_plane)
        .merge(ApiRouter::from(execd::signed::router()))
}

pub fn router(ctx: Arc<Ctx>) -> Router {
    let key = ctx.clone();
    let gate =
        move |r: ApiRouter| r.route_layer(axum::middleware::from_fn_with_state(key.clone(), auth::require_api_key));
    let (router, doc) = routes(&gate).split_for_parts();
    openapi::publish(doc);
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The guard bounds every body (crate::http::guard) and answers in JSON.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(ctx.guard.clone(), crate::http::guard::layer))
        .layer(axum::middleware::from_fn(request_id::layer))
        .with_state(ctx)
}

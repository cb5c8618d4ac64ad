//! `/v1/isolated/*` (OSEP-0013, namespace-isolated sessions inside a
//! sandbox): not built yet. `capabilities` says so the way the SDK expects
//! (`{"available": false}`), every other route answers a JSON 503.
use crate::api::error::ApiError;
use axum::http::StatusCode;
use axum::routing::{any, get};
use axum::{Json, Router};
use serde_json::{json, Value};

async fn capabilities() -> Json<Value> {
    Json(json!({
        "available": false,
        "message": "isolated sessions are not supported by this server yet",
    }))
}

async fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "ISOLATION_UNAVAILABLE",
        "isolated sessions are not available on this server (see /v1/isolated/capabilities)",
    )
}

pub fn routes() -> Router {
    Router::new()
        .route("/v1/isolated/capabilities", get(capabilities))
        .route("/v1/isolated", any(unavailable))
        .route("/v1/isolated/{*rest}", any(unavailable))
}

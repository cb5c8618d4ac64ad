//! pvisor's own admin API for the CLI (`/pvisor/...`): images.
use super::error::ApiResult;
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

pub fn router() -> Router<Arc<Ctx>> {
    Router::new().route("/images", get(images))
}

async fn images(State(ctx): State<Arc<Ctx>>) -> ApiResult<Json<serde_json::Value>> {
    let list = ctx.images.list().map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(serde_json::to_value(list).map_err(|e| ApiError::internal(e.to_string()))?))
}

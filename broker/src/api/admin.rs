//! pvisor's own admin API for the CLI (`/pvisor/...`): images.
use super::error::ApiResult;
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::extract::State;
use axum::Json;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<Arc<Ctx>> {
    OpenApiRouter::new().routes(routes!(images))
}

/// The images of the pool.
#[utoipa::path(get, path = "/images", tag = "pvisor",
    responses((status = 200, description = "the pool's images", body = Vec<Object>)))]
async fn images(State(ctx): State<Arc<Ctx>>) -> ApiResult<Json<serde_json::Value>> {
    let list = ctx.images.list().map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(serde_json::to_value(list).map_err(|e| ApiError::internal(e.to_string()))?))
}

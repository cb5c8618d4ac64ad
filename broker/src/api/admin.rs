//! pvisor's own admin API for the CLI (`/pvisor/...`): images, memory merging.
use super::error::ApiResult;
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::extract::State;
use axum::Json;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<Arc<Ctx>> {
    OpenApiRouter::new().routes(routes!(images)).routes(routes!(memory_merge))
}

/// The images of the pool.
#[utoipa::path(get, path = "/images", tag = "pvisor",
    responses((status = 200, description = "the pool's images", body = Vec<Object>)))]
async fn images(State(ctx): State<Arc<Ctx>>) -> ApiResult<Json<serde_json::Value>> {
    let list = ctx.images.list().map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(serde_json::to_value(list).map_err(|e| ApiError::internal(e.to_string()))?))
}

/// Kernel same-page merging (`--memory-merge`): the host's ksmd (settings,
/// who set them, merged and sharing pages) and each running sandbox's merged
/// pages. `enabled` false: the server does not make sandboxes mergeable (the
/// host's counters are still shown).
#[utoipa::path(get, path = "/memory-merge", tag = "pvisor",
    responses((status = 200, description = "the host's KSM and each sandbox's merged pages", body = Object)))]
async fn memory_merge(State(ctx): State<Arc<Ctx>>) -> ApiResult<Json<serde_json::Value>> {
    use crate::sandbox::ksm;
    use pvisor_proto::worker::worker_client::WorkerClient;
    let page = ksm::page_size();
    let mut sandboxes = Vec::new();
    for sb in ctx.registry.list() {
        // A sandbox that is not running (or whose worker does not answer) is left out.
        let Ok(channel) = sb.channel() else { continue };
        let Ok(m) = WorkerClient::new(channel).metrics(pvisor_proto::worker::Empty {}).await else { continue };
        let m = m.into_inner();
        sandboxes.push(serde_json::json!({
            "id": sb.id,
            "merging_pages": m.ksm_merging_pages,
            "merging_bytes": m.ksm_merging_pages * page,
            "profit_bytes": m.ksm_profit_bytes,
            "mem_used_bytes": m.mem_used_bytes,
        }));
    }
    let (control, totals) = match &ctx.memory_merge {
        Some(k) => (serde_json::to_value(&k.control).unwrap_or_default(), k.totals()),
        None => (serde_json::Value::Null, ksm::HostKsm::observe(std::path::Path::new(ksm::KSM_DIR))),
    };
    Ok(Json(serde_json::json!({
        "enabled": ctx.memory_merge.is_some(),
        "control": control,
        "page_size": page,
        "host": totals,
        "saved_bytes": totals.pages_sharing * page,
        "sandboxes": sandboxes,
    })))
}

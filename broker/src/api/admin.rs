//! pvisor's own admin API for the CLI (`/pvisor/...`): images, the
//! sandboxes with what an operator needs to find them on the host (backend,
//! worker pid, cgroup) for `pvisor ps`, their figures for `pvisor stats`,
//! memory merging, and the templates' warm sandboxes.
use super::error::ApiResult;
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::extract::State;
use axum::Json;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn router() -> OpenApiRouter<Arc<Ctx>> {
    OpenApiRouter::new()
        .routes(routes!(images))
        .routes(routes!(sandboxes))
        .routes(routes!(stats))
        .routes(routes!(memory_merge))
        .routes(routes!(templates))
        .route("/sandboxes/{id}/pty", axum::routing::get(super::pty::pty))
}

/// A sandbox started ahead for a template, not handed out yet.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmSandboxView {
    /// The id it will have once handed out.
    pub id: String,
    pub worker_pid: Option<u32>,
    pub started_at: String,
}

/// A template of the API and its warm sandboxes.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateWarmView {
    pub template_id: String,
    pub image: String,
    /// How many it keeps (`--template-warm`).
    pub want: usize,
    /// Those ready to be handed out (past the template's readiness gate).
    pub ready: Vec<WarmSandboxView>,
}

/// The templates (newest first) with the sandboxes started ahead for each.
#[utoipa::path(get, path = "/templates", tag = "pvisor",
    responses((status = 200, description = "the templates' warm sandboxes", body = Vec<TemplateWarmView>)))]
async fn templates(State(ctx): State<Arc<Ctx>>) -> Json<Vec<TemplateWarmView>> {
    let warm = &ctx.catalog.warm;
    let list = ctx
        .catalog
        .store
        .list()
        .into_iter()
        .map(|t| TemplateWarmView {
            ready: warm
                .ready_of(&t.id)
                .into_iter()
                .map(|(id, worker_pid, at)| WarmSandboxView {
                    id,
                    worker_pid,
                    started_at: crate::sandbox::record::rfc3339(&at),
                })
                .collect(),
            template_id: t.id,
            image: t.image,
            want: warm.want(),
        })
        .collect();
    Json(list)
}

/// One sandbox as `pvisor ps` shows it.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxProcess {
    pub id: String,
    pub image: String,
    pub state: String,
    /// `ns` or `vm` (empty for records older than backends).
    pub backend: String,
    /// The worker's pid (absent once the sandbox no longer runs).
    pub worker_pid: Option<u32>,
    /// The sandbox's cgroup directory: the cgroup2 one, else the v1 memory
    /// controller's (absent without cgroups or once it no longer runs).
    pub cgroup: Option<String>,
    /// Every cgroup directory of the sandbox, by controller (`unified`: cgroup2).
    pub cgroups: std::collections::BTreeMap<String, String>,
    pub created_at: String,
    pub expires_at: Option<String>,
}

/// The broker's sandboxes with their backend, worker pid and cgroup, oldest first.
#[utoipa::path(get, path = "/sandboxes", tag = "pvisor",
    responses((status = 200, description = "the sandboxes", body = Vec<SandboxProcess>)))]
async fn sandboxes(State(ctx): State<Arc<Ctx>>) -> Json<Vec<SandboxProcess>> {
    let rfc3339 = crate::sandbox::record::rfc3339;
    let list = ctx
        .registry
        .list()
        .iter()
        .map(|e| {
            let (worker_pid, group) = e.process().map(|(p, g)| (Some(p), g)).unwrap_or_default();
            let mut cgroups = std::collections::BTreeMap::new();
            if let Some(g) = &group {
                if let Some(d) = &g.v2 {
                    cgroups.insert("unified".to_string(), d.display().to_string());
                }
                for (c, d) in &g.v1 {
                    cgroups.insert(c.clone(), d.display().to_string());
                }
            }
            let cgroup = cgroups.get("unified").or_else(|| cgroups.get("memory")).cloned();
            let status = e.status();
            SandboxProcess {
                id: e.id.clone(),
                image: e.image_uri.clone(),
                state: status.state.as_str().to_string(),
                backend: e.backend_name().to_string(),
                worker_pid,
                cgroup,
                cgroups,
                created_at: rfc3339(&e.created_at),
                expires_at: status.expires_at.as_ref().map(rfc3339),
            }
        })
        .collect();
    Json(list)
}

/// The images of the pool.
#[utoipa::path(get, path = "/images", tag = "pvisor",
    responses((status = 200, description = "the pool's images", body = Vec<Object>)))]
async fn images(State(ctx): State<Arc<Ctx>>) -> ApiResult<Json<serde_json::Value>> {
    let list = ctx.images.list().map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(serde_json::to_value(list).map_err(|e| ApiError::internal(e.to_string()))?))
}

/// One sandbox's figures now, as `pvisor stats` samples them (counters are
/// totals: the CLI turns two samples into rates). Absent: not known (no
/// cgroup, no network, not live).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStats {
    pub id: String,
    pub state: String,
    pub backend: String,
    /// CPU time of the sandbox's cgroup since its start.
    pub cpu_seconds: Option<f64>,
    pub memory_bytes: Option<u64>,
    /// Processes in the sandbox's cgroup (its worker included).
    pub pids: Option<u64>,
    /// Bytes from the sandbox through its network process.
    pub net_tx_bytes: Option<u64>,
    /// Bytes to the sandbox.
    pub net_rx_bytes: Option<u64>,
    /// Milliseconds since the Unix epoch of this sample.
    pub timestamp_ms: i64,
}

/// CPU, memory, processes and network bytes of every sandbox, oldest first.
#[utoipa::path(get, path = "/stats", tag = "pvisor",
    responses((status = 200, description = "one sample per sandbox", body = Vec<SandboxStats>)))]
async fn stats(State(ctx): State<Arc<Ctx>>) -> Json<Vec<SandboxStats>> {
    let now = chrono::Utc::now().timestamp_millis();
    let list = crate::metrics::sample::live(&ctx)
        .await
        .into_iter()
        .map(|s| SandboxStats {
            id: s.id,
            state: s.state.to_string(),
            backend: s.backend.to_string(),
            cpu_seconds: s.cpu_seconds,
            memory_bytes: s.memory_bytes,
            pids: s.tasks,
            net_tx_bytes: s.net.map(|n| n.0),
            net_rx_bytes: s.net.map(|n| n.1),
            timestamp_ms: now,
        })
        .collect();
    Json(list)
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

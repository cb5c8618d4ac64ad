//! `/metrics`: the sandbox's cgroup as execd metrics. The OpenSandbox fields
//! as execd has them, then pvisor's: kernel same-page merging of the
//! sandbox (`ksm_*`, crate::sandbox::ksm; zero without `--memory-merge`).
use super::{sse, Sandbox};
use crate::api::error::ApiResult;
use crate::sandbox::SandboxEntry;
use axum::response::Response;
use axum::{Extension, Json};
use pvisor_proto::worker::worker_client::WorkerClient;
use serde_json::{json, Value};
use std::sync::Arc;

async fn sample(sb: &SandboxEntry, merge: bool) -> ApiResult<Value> {
    let m = WorkerClient::new(sb.channel()?).metrics(pvisor_proto::worker::Empty {}).await?.into_inner();
    const MIB: f64 = 1024.0 * 1024.0;
    Ok(json!({
        "cpu_count": m.cpu_count,
        "cpu_used_pct": m.cpu_used_pct,
        "mem_total_mib": m.mem_total_bytes as f64 / MIB,
        "mem_used_mib": m.mem_used_bytes as f64 / MIB,
        "timestamp": pvisor_proto::now_ms(),
        "memory_merge": merge,
        "ksm_merging_pages": m.ksm_merging_pages,
        "ksm_merging_mib": (m.ksm_merging_pages * crate::sandbox::ksm::page_size()) as f64 / MIB,
        "ksm_profit_mib": m.ksm_profit_bytes as f64 / MIB,
    }))
}

/// Whether the server runs with `--memory-merge` (an extension `dispatch` adds).
#[derive(Clone, Copy)]
pub struct MemoryMerge(pub bool);

pub async fn get(
    Extension(MemoryMerge(merge)): Extension<MemoryMerge>,
    Extension(sb): Sandbox,
) -> ApiResult<Json<Value>> {
    Ok(Json(sample(&sb, merge).await?))
}

/// One metrics event a second until the client goes away.
pub async fn watch(
    Extension(MemoryMerge(merge)): Extension<MemoryMerge>,
    Extension(sb): Sandbox,
) -> ApiResult<Response> {
    sample(&sb, merge).await?;
    let sb: Arc<SandboxEntry> = sb;
    let stream = async_stream::stream! {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            match sample(&sb, merge).await {
                Ok(v) => yield Ok(sse::frame(&v)),
                Err(_) => break,
            }
        }
    };
    Ok(sse::response(stream))
}

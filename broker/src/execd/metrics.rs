//! `/metrics`: the sandbox's cgroup as execd metrics.
use super::{sse, Sandbox};
use crate::api::error::ApiResult;
use crate::sandbox::SandboxEntry;
use axum::response::Response;
use axum::{Extension, Json};
use pvisor_proto::worker::worker_client::WorkerClient;
use serde_json::{json, Value};
use std::sync::Arc;

async fn sample(sb: &SandboxEntry) -> ApiResult<Value> {
    let m = WorkerClient::new(sb.channel()?).metrics(pvisor_proto::worker::Empty {}).await?.into_inner();
    const MIB: f64 = 1024.0 * 1024.0;
    Ok(json!({
        "cpu_count": m.cpu_count,
        "cpu_used_pct": m.cpu_used_pct,
        "mem_total_mib": m.mem_total_bytes as f64 / MIB,
        "mem_used_mib": m.mem_used_bytes as f64 / MIB,
        "timestamp": pvisor_proto::now_ms(),
    }))
}

pub async fn get(Extension(sb): Sandbox) -> ApiResult<Json<Value>> {
    Ok(Json(sample(&sb).await?))
}

/// One metrics event a second until the client goes away.
pub async fn watch(Extension(sb): Sandbox) -> ApiResult<Response> {
    sample(&sb).await?;
    let sb: Arc<SandboxEntry> = sb;
    let stream = async_stream::stream! {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            match sample(&sb).await {
                Ok(v) => yield Ok(sse::frame(&v)),
                Err(_) => break,
            }
        }
    };
    Ok(sse::response(stream))
}

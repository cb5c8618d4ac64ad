//! One sample of every sandbox the broker holds: state and backend, and for
//! a live one its CPU time, memory and task count (from its cgroup, no round
//! trip) and network bytes (its worker's `NetStats`, bounded by
//! [`NET_TIMEOUT`]). Used by the scrape and by `pvisor stats`
//! (`GET /pvisor/stats`).
use crate::server::Ctx;
use pvisor_proto::worker::worker_client::WorkerClient;
use std::time::Duration;

/// Longest wait for one worker's network counters (a wedged worker must not
/// hold up the sample; its sandbox then has no network figures this time).
const NET_TIMEOUT: Duration = Duration::from_secs(1);

/// One sandbox's figures (None where not known: no cgroup, no network, not live).
pub struct Sample {
    pub id: String,
    pub state: &'static str,
    pub backend: &'static str,
    pub cpu_seconds: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub tasks: Option<u64>,
    /// (tx, rx) bytes through its netd.
    pub net: Option<(u64, u64)>,
}

async fn net_bytes(channel: tonic::transport::Channel) -> Option<(u64, u64)> {
    let mut client = WorkerClient::new(channel);
    let s = tokio::time::timeout(NET_TIMEOUT, client.net_stats(pvisor_proto::worker::Empty {})).await.ok()?.ok()?;
    let s = s.into_inner();
    Some((s.tx_bytes, s.rx_bytes))
}

/// Every sandbox, oldest first; the workers are asked concurrently.
pub async fn live(ctx: &Ctx) -> Vec<Sample> {
    let pending = ctx.registry.list().into_iter().map(|e| async move {
        let state = e.status().state.as_str();
        let cgroup = e.process().and_then(|(_, g)| g);
        let cpu_seconds = cgroup.as_ref().and_then(|g| g.cpu_usage_us()).map(|us| us as f64 / 1e6);
        let memory_bytes = cgroup.as_ref().and_then(|g| g.memory_usage());
        let tasks = cgroup.as_ref().map(|g| g.pids().len() as u64);
        let net = match e.channel() {
            Ok(c) => net_bytes(c).await,
            Err(_) => None,
        };
        Sample { id: e.id.clone(), state, backend: e.backend_name(), cpu_seconds, memory_bytes, tasks, net }
    });
    futures::future::join_all(pending).await
}

//! The exposition of a scrape: the event metrics, then what is sampled now
//! (sandboxes by state and backend, each live sandbox's figures from
//! [`super::sample`], the image pool and the image servers).
use super::events;
use crate::server::Ctx;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    sandbox: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NetLabels {
    sandbox: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ImageLabels {
    image: String,
}

/// The exposition of everything, in the OpenMetrics text format or (else)
/// Prometheus' text format 0.0.4.
pub async fn render(ctx: &Ctx, openmetrics: bool) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("pvisor");
    events().register(&mut r);
    let samples = super::sample::live(ctx).await;
    let by_state: Family<StateLabels, Gauge> = Family::default();
    for s in &samples {
        by_state.get_or_create(&StateLabels { state: s.state.to_string(), backend: s.backend.to_string() }).inc();
    }
    r.register("sandboxes", "Sandboxes the broker holds, by state and backend", by_state);

    // Fresh families each scrape: a counter's `inc_by` from zero sets it.
    let cpu: Family<SandboxLabels, Counter<f64, AtomicU64>> = Family::default();
    let memory: Family<SandboxLabels, Gauge> = Family::default();
    let net: Family<NetLabels, Counter> = Family::default();
    for s in &samples {
        let labels = SandboxLabels { sandbox: s.id.clone(), backend: s.backend.to_string() };
        if let Some(v) = s.cpu_seconds {
            cpu.get_or_create(&labels).inc_by(v);
        }
        if let Some(v) = s.memory_bytes {
            memory.get_or_create(&labels).set(v as i64);
        }
        if let Some((tx, rx)) = s.net {
            for (direction, v) in [("tx", tx), ("rx", rx)] {
                net.get_or_create(&NetLabels { sandbox: s.id.clone(), direction }).inc_by(v);
            }
        }
    }
    r.register_with_unit("sandbox_cpu", "CPU time used by a sandbox's cgroup", Unit::Seconds, cpu);
    r.register_with_unit("sandbox_memory", "Memory charged to a sandbox's cgroup", Unit::Bytes, memory);
    r.register_with_unit(
        "sandbox_network",
        "Bytes through a sandbox's network process (tx: from the sandbox, rx: to it)",
        Unit::Bytes,
        net,
    );

    let images = ctx.images.list().unwrap_or_default();
    let pool_images: Gauge = Gauge::default();
    pool_images.set(images.len() as i64);
    let pool_bytes: Gauge = Gauge::default();
    pool_bytes.set(images.iter().map(|i| i.size_bytes).sum::<u64>() as i64);
    r.register("image_pool_images", "Images in the pool", pool_images);
    r.register_with_unit(
        "image_pool_logical",
        "Apparent size of the pool's images added up (before deduplication)",
        Unit::Bytes,
        pool_bytes,
    );

    let servers = ctx.mounts.running();
    let count: Gauge = Gauge::default();
    count.set(servers.len() as i64);
    let server_memory: Family<ImageLabels, Gauge> = Family::default();
    for s in &servers {
        let memory = s.cgroup.as_ref().and_then(|g| g.memory_usage()).or_else(|| s.pid.and_then(resident_bytes));
        if let Some(m) = memory {
            let image = images
                .iter()
                .find(|i| i.id == s.image_id)
                .and_then(|i| i.names.first().cloned())
                .unwrap_or_else(|| s.image_id.clone());
            server_memory.get_or_create(&ImageLabels { image }).set(m as i64);
        }
    }
    r.register("image_servers", "Image servers (pvisor-imaged) running", count);
    r.register_with_unit(
        "image_server_memory",
        "Memory of an image server (its cgroup, else its resident set)",
        Unit::Bytes,
        server_memory,
    );

    let mut out = String::new();
    if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &r)?;
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &r)?;
    }
    Ok(out)
}

/// A process's resident set (`VmRSS` of `/proc/<pid>/status`), in bytes.
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim();
    kib.parse::<u64>().ok().map(|k| k * 1024)
}

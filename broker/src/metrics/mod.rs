//! The broker's Prometheus metrics (`GET /metrics`, [`crate::api::prom`]).
//!
//! Two kinds: what happens (creates, deletes, failures, latencies) is counted
//! as it happens in the process-wide [`Events`] ([`events`]); what is (sandboxes
//! by state, per-sandbox CPU, memory and network, the image pool, image
//! servers) is sampled at each scrape ([`scrape`]) into a fresh registry, so a
//! sandbox that is gone leaves no stale series. Labels stay low-cardinality:
//! reasons are error codes, backends and states are small fixed sets; only
//! the per-sandbox figures carry a sandbox id, one series per live sandbox.
pub mod sample;
pub mod scrape;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

type HistogramFamily = Family<BackendLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 5 ms .. about 41 s, doubling.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Counters and histograms of lifecycle events, shared by the whole process.
pub struct Events {
    creates: Family<BackendLabel, Counter>,
    create_failures: Family<ReasonLabel, Counter>,
    deletes: Family<ReasonLabel, Counter>,
    failures: Family<ReasonLabel, Counter>,
    create_seconds: HistogramFamily,
    first_command_seconds: HistogramFamily,
    /// Sandboxes created by this broker that ran no command yet: their
    /// create's start and backend.
    awaiting_first: Mutex<HashMap<String, (Instant, String)>>,
}

static EVENTS: LazyLock<Events> = LazyLock::new(Events::new);

/// The process's event metrics.
pub fn events() -> &'static Events {
    &EVENTS
}

impl Events {
    /// Known label values start at zero, so their series exist (and rates
    /// work) before the first event.
    fn new() -> Events {
        let e = Events {
            creates: Family::default(),
            create_failures: Family::default(),
            deletes: Family::default(),
            failures: Family::default(),
            create_seconds: Family::new_with_constructor(latency_histogram),
            first_command_seconds: Family::new_with_constructor(latency_histogram),
            awaiting_first: Mutex::new(HashMap::new()),
        };
        for backend in ["ns", "vm"] {
            let label = BackendLabel { backend: backend.to_string() };
            let _ = e.creates.get_or_create(&label);
            let _ = e.create_seconds.get_or_create(&label);
            let _ = e.first_command_seconds.get_or_create(&label);
        }
        for reason in ["api", "expired"] {
            let _ = e.deletes.get_or_create(&ReasonLabel { reason: reason.to_string() });
        }
        e
    }

    /// A create answered 202 (`started`: when its request arrived).
    pub fn created(&self, id: &str, backend: &str, started: Instant) {
        let label = BackendLabel { backend: backend.to_string() };
        self.creates.get_or_create(&label).inc();
        self.create_seconds.get_or_create(&label).observe(started.elapsed().as_secs_f64());
        self.awaiting().insert(id.to_string(), (started, label.backend));
    }

    /// A create was refused or failed, by its error code.
    pub fn create_failed(&self, code: &str) {
        self.create_failures.get_or_create(&ReasonLabel { reason: code.to_string() }).inc();
    }

    /// A sandbox was removed: `reason` is `api` (a delete) or `expired`.
    pub fn deleted(&self, id: &str, reason: &'static str) {
        self.deletes.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc();
        self.awaiting().remove(id);
    }

    /// A live sandbox failed (its reason code: `WORKER_EXITED`, ...).
    pub fn sandbox_failed(&self, reason: Option<&str>) {
        self.failures.get_or_create(&ReasonLabel { reason: reason.unwrap_or("UNKNOWN").to_string() }).inc();
    }

    /// A command started in sandbox `id`: the first one of a sandbox this
    /// broker created records the time from its create's request.
    pub fn command_started(&self, id: &str) {
        let first = self.awaiting().remove(id);
        if let Some((started, backend)) = first {
            self.first_command_seconds
                .get_or_create(&BackendLabel { backend })
                .observe(started.elapsed().as_secs_f64());
        }
    }

    fn awaiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, String)>> {
        self.awaiting_first.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the event metrics (clones share the counts) in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register("sandbox_creates", "Sandboxes created (answered 202)", self.creates.clone());
        r.register("sandbox_create_failures", "Creates refused or failed, by error code", self.create_failures.clone());
        r.register(
            "sandbox_deletes",
            "Sandboxes removed, by reason (api: a delete, expired: the timeout)",
            self.deletes.clone(),
        );
        r.register("sandbox_failures", "Live sandboxes that failed, by reason code", self.failures.clone());
        r.register_with_unit(
            "sandbox_create_duration",
            "Time from a create's request to its 202",
            Unit::Seconds,
            self.create_seconds.clone(),
        );
        r.register_with_unit(
            "sandbox_first_command_duration",
            "Time from a create's request to the start of the sandbox's first command",
            Unit::Seconds,
            self.first_command_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(e: &Events) -> String {
        let mut r = Registry::with_prefix("pvisor");
        e.register(&mut r);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        s
    }

    #[test]
    fn events_are_counted_by_label_and_the_first_command_only_once() {
        let e = Events::new();
        let t = Instant::now();
        e.created("a", "ns", t);
        e.created("b", "ns", t);
        e.create_failed("INVALID_REQUEST");
        e.command_started("a");
        e.command_started("a");
        e.deleted("b", "api");
        e.command_started("b");
        e.sandbox_failed(Some("WORKER_EXITED"));
        let s = text(&e);
        assert!(s.contains("pvisor_sandbox_creates_total{backend=\"ns\"} 2\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_create_failures_total{reason=\"INVALID_REQUEST\"} 1\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_deletes_total{reason=\"api\"} 1\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_failures_total{reason=\"WORKER_EXITED\"} 1\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_create_duration_seconds_count{backend=\"ns\"} 2\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_first_command_duration_seconds_count{backend=\"ns\"} 1\n"), "{s}");
        assert!(s.contains("pvisor_sandbox_creates_total{backend=\"vm\"} 0\n"), "{s}");
        assert!(s.ends_with("# EOF\n"));
    }
}

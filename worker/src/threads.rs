//! The worker's threads and the seccomp filter each one runs under.
//!
//! Each backend names its threads ([`crate::backend::Backend::threads`]), in
//! the manner of Cloud Hypervisor's per-thread filters: the gRPC thread and
//! the watchers of every worker run the `worker` filter; a vm worker's vCPU
//! and device threads install their own, narrower filters before they touch
//! guest memory. The table is data, so tests and RULES.md can check it.
use pvisor_seccomp::FilterKind;

/// A role of a worker thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Thread {
    /// The main thread: the tokio runtime and the gRPC server (worker API,
    /// agent relay, reflection).
    Api,
    /// Waits on the broker's lifeline pipe.
    Lifeline,
    /// Waits for the sandbox to end; the same role reaps the sandbox's netd
    /// (`netd::Netd::watch`).
    Waiter,
    /// Runs one vCPU (vm).
    Vcpu,
    /// The device event loop: virtio queues, vsock host sockets (vm).
    Devices,
    /// Waits for the VM to end, or copies a test engine's console (vm).
    Console,
}

/// One thread's filter, and why that one.
#[derive(Clone, Copy, Debug)]
pub struct ThreadFilter {
    pub thread: Thread,
    pub filter: FilterKind,
    pub why: &'static str,
}

/// The threads every worker has, whatever its backend.
pub const COMMON: [ThreadFilter; 3] = [
    ThreadFilter {
        thread: Thread::Api,
        filter: FilterKind::Worker,
        why: "installed by the main thread once the sandbox runs; the watchers it spawns inherit it",
    },
    ThreadFilter { thread: Thread::Lifeline, filter: FilterKind::Worker, why: "inherited from the main thread" },
    ThreadFilter {
        thread: Thread::Waiter,
        filter: FilterKind::Worker,
        why: "inherited from the main thread (the sandbox's waiter and netd's)",
    },
];

/// The filter `thread` runs under in a backend's table.
pub fn filter_of(table: &[ThreadFilter], thread: Thread) -> Option<FilterKind> {
    table.iter().find(|t| t.thread == thread).map(|t| t.filter)
}

//! pvisor-worker: one process per sandbox.
//!
//! The broker forks a worker for every sandbox. The worker joins the sandbox's
//! cgroup, starts the sandbox through a [`backend::Backend`] (the namespace
//! jail of [`ns`], or the KVM microVM of [`vm`]), installs its own seccomp filter
//! and serves gRPC on a Unix socket: its own `pvisor.worker.v1.Worker`
//! service, the sandbox agent's `pvisor.agent.v1.Agent` service forwarded
//! verbatim, and server reflection.

pub mod agent_link;
pub mod backend;
pub mod cgroup;
pub mod config;
pub mod error;
pub mod expiry;
pub mod forward;
pub mod harden;
pub mod ksm;
pub mod launch;
pub mod netd;
pub mod ns;
pub mod service;
pub mod threads;
pub mod title;
pub mod vm;

/// Set once the broker asked the worker to stop: the sandbox's end is then
/// expected, not a crash.
pub static SHUTTING_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long the broker waits for a worker to report its sandbox ready unless the
/// configuration says (`WorkerConfig.ready_timeout_ms`, `pvisor serve --ready-timeout-secs`).
pub const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// How long a worker waits for its agent to answer `Configure`: 2 s below the
/// broker's ready timeout, so the worker's reason (and the guest's console)
/// reaches the broker before the broker gives up.
pub fn agent_ready_timeout(cfg: &config::WorkerConfig) -> std::time::Duration {
    let ready = match cfg.ready_timeout_ms {
        0 => READY_TIMEOUT,
        ms => std::time::Duration::from_millis(u64::from(ms)),
    };
    ready.saturating_sub(std::time::Duration::from_secs(2)).max(std::time::Duration::from_secs(1))
}

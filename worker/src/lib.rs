//! pvisor-worker: one process per sandbox.
//!
//! The broker forks a worker for every sandbox. The worker joins the sandbox's
//! cgroup, starts the sandbox through a [`backend::Backend`] (the namespace
//! jail of [`ns`] today, a KVM microVM later), installs its own seccomp filter
//! and serves gRPC on a Unix socket: its own `pvisor.worker.v1.Worker`
//! service, the sandbox agent's `pvisor.agent.v1.Agent` service forwarded
//! verbatim, and server reflection.

pub mod agent_link;
pub mod backend;
pub mod cgroup;
pub mod config;
pub mod error;
pub mod forward;
pub mod harden;
pub mod launch;
pub mod ns;
pub mod service;

/// Set once the broker asked the worker to stop: the sandbox's end is then
/// expected, not a crash.
pub static SHUTTING_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

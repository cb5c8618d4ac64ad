//! Errors of the worker.
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cgroup {path}: {source}")]
    Cgroup { path: String, source: io::Error },
    #[error("no usable cgroup hierarchy: {0}")]
    NoCgroup(String),
    #[error(
        "cgroup {0} holds other processes, so it cannot hand controllers to sandbox groups: start \
         pvisor in a group of its own (systemd: a service with Delegate=yes, or `systemd-run --user \
         --scope -p Delegate=yes pvisor serve`)"
    )]
    CgroupBusy(String),
    #[error("sandbox start failed: {0}")]
    Start(String),
    #[error("bad worker configuration: {0}")]
    Config(String),
    #[error("the {0} backend is not available: {1}")]
    Unavailable(&'static str, String),
    #[error("{what}: {source}")]
    Sys { what: String, source: io::Error },
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("agent: {0}")]
    Agent(String),
    #[error("not supported here: {0}")]
    Unsupported(String),
    #[error("snapshot: {0}")]
    Snapshot(String),
}

impl WorkerError {
    pub fn sys(what: impl Into<String>, source: impl Into<io::Error>) -> Self {
        WorkerError::Sys { what: what.into(), source: source.into() }
    }
}

pub type Result<T> = std::result::Result<T, WorkerError>;

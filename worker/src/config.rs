//! What the broker tells a worker at spawn time (`--config JSON`).
use crate::cgroup::GroupPaths;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Namespace jail (user/pid/mount/net/ipc/uts/cgroup namespaces).
    #[default]
    Ns,
    /// KVM microVM (a later issue).
    Vm,
}

/// Resource limits of the whole sandbox group (worker included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { cpu_millis: 1000, memory_bytes: 512 << 20, pids: 4096 }
    }
}

/// How sandbox ids map onto host ids: sandbox id `i` is host id `base + i`
/// for `i < count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub uid_base: u32,
    pub gid_base: u32,
    pub count: u32,
}

impl IdMap {
    /// Root maps 65536 ids from 100000 (images are stored shifted to match);
    /// anyone else maps just itself to root.
    pub fn for_current_user(shift: Option<u32>) -> Self {
        match shift {
            Some(base) => IdMap { uid_base: base, gid_base: base, count: 65536 },
            None => {
                IdMap { uid_base: nix::unistd::geteuid().as_raw(), gid_base: nix::unistd::getegid().as_raw(), count: 1 }
            }
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub sandbox_id: String,
    #[serde(default)]
    pub backend: BackendKind,
    /// Inherited listening Unix socket the worker serves gRPC on.
    pub listen_fd: i32,
    /// Inherited read end of a pipe whose write end the broker holds: EOF
    /// means the broker is gone and the sandbox must go too.
    pub lifeline_fd: i32,
    /// The sandbox's cgroup (created and limited by the broker).
    pub cgroup: Option<GroupPaths>,
    pub limits: Limits,
    /// Read-only image tree (overlay lower layer).
    pub image_root: PathBuf,
    /// Per-sandbox directory for the writable layer.
    pub state_dir: PathBuf,
    pub ids: IdMap,
    pub hostname: String,
    /// The agent binary, started as the sandbox's init.
    pub agent_path: PathBuf,
    /// Passed verbatim to the agent (image defaults and entrypoint).
    pub agent_config: serde_json::Value,
}

//! What the broker tells a worker: `pvisor.worker.v1.WorkerConfig`, one
//! encoded proto message on the configuration pipe ([`crate::launch::CONFIG_FD`]).
//! Common fields plus the backend's own part (`ns` or `vm`), so a field renamed
//! on one side is a compile error on the other, not a silent default.
//!
//! The worker's own types ([`Limits`], [`IdMap`], [`GroupPaths`]) convert to
//! and from their proto messages here, in one place.
use crate::cgroup::GroupPaths;
use crate::error::{Result, WorkerError};
use pvisor_proto::worker as pb;
pub use pvisor_proto::worker::worker_config::Backend as BackendConfig;
pub use pvisor_proto::worker::{ImageDisk, NsConfig, TemplateCapture, VmConfig, VmEngine, Volume, WorkerConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which backend runs a sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Namespace jail (user/pid/mount/net/ipc/uts/cgroup namespaces).
    #[default]
    Ns,
    /// KVM microVM.
    Vm,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Ns => "ns",
            BackendKind::Vm => "vm",
        }
    }

    /// The kind of a configuration's backend part, if it has one.
    pub fn of(cfg: &WorkerConfig) -> Option<BackendKind> {
        match cfg.backend {
            Some(BackendConfig::Ns(_)) => Some(BackendKind::Ns),
            Some(BackendConfig::Vm(_)) => Some(BackendKind::Vm),
            None => None,
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ns" => Ok(BackendKind::Ns),
            "vm" => Ok(BackendKind::Vm),
            _ => Err(format!("unknown backend {s:?} (ns or vm)")),
        }
    }
}

/// Resource limits of the whole sandbox group (worker included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u64,
    /// Writable layer and /tmp bound (0: none).
    #[serde(default)]
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { cpu_millis: 1000, memory_bytes: 512 << 20, pids: 4096, disk_bytes: 0 }
    }
}

impl From<Limits> for pb::Limits {
    fn from(l: Limits) -> Self {
        pb::Limits { cpu_millis: l.cpu_millis, memory_bytes: l.memory_bytes, pids: l.pids, disk_bytes: l.disk_bytes }
    }
}

impl From<pb::Limits> for Limits {
    fn from(l: pb::Limits) -> Self {
        Limits { cpu_millis: l.cpu_millis, memory_bytes: l.memory_bytes, pids: l.pids, disk_bytes: l.disk_bytes }
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

impl From<IdMap> for pb::IdMap {
    fn from(m: IdMap) -> Self {
        pb::IdMap { uid_base: m.uid_base, gid_base: m.gid_base, count: m.count }
    }
}

impl From<pb::IdMap> for IdMap {
    fn from(m: pb::IdMap) -> Self {
        IdMap { uid_base: m.uid_base, gid_base: m.gid_base, count: m.count }
    }
}

impl From<&GroupPaths> for pb::CgroupPaths {
    fn from(g: &GroupPaths) -> Self {
        let s = |p: &PathBuf| p.to_string_lossy().into_owned();
        pb::CgroupPaths {
            v2: g.v2.as_ref().map(s).unwrap_or_default(),
            v1: g.v1.iter().map(|(k, v)| (k.clone(), s(v))).collect(),
        }
    }
}

impl From<&pb::CgroupPaths> for GroupPaths {
    fn from(g: &pb::CgroupPaths) -> Self {
        GroupPaths {
            v2: (!g.v2.is_empty()).then(|| PathBuf::from(&g.v2)),
            v1: g.v1.iter().map(|(k, v)| (k.clone(), PathBuf::from(v))).collect(),
        }
    }
}

/// The parts of a [`WorkerConfig`] every backend uses, checked and in the
/// worker's own types.
#[derive(Clone, Debug)]
pub struct Common {
    pub sandbox_id: String,
    pub cgroup: Option<GroupPaths>,
    pub limits: Limits,
    pub hostname: String,
}

impl Common {
    pub fn of(cfg: &WorkerConfig) -> Result<Common> {
        if cfg.sandbox_id.is_empty() {
            return Err(WorkerError::Config("sandbox_id is empty".into()));
        }
        let limits = cfg.limits.ok_or_else(|| WorkerError::Config("limits missing".into()))?;
        Ok(Common {
            sandbox_id: cfg.sandbox_id.clone(),
            cgroup: cfg.cgroup.as_ref().map(GroupPaths::from),
            limits: limits.into(),
            hostname: cfg.hostname.clone(),
        })
    }
}

/// Decodes a configuration as read from the pipe, with its checked common part.
pub fn decode(bytes: &[u8]) -> Result<(WorkerConfig, Common)> {
    let cfg = <WorkerConfig as prost::Message>::decode(bytes).map_err(|e| WorkerError::Config(e.to_string()))?;
    if cfg.backend.is_none() {
        return Err(WorkerError::Config("no backend part (ns or vm)".into()));
    }
    let common = Common::of(&cfg)?;
    Ok((cfg, common))
}

/// Encodes a configuration for the pipe.
pub fn encode(cfg: &WorkerConfig) -> Vec<u8> {
    prost::Message::encode_to_vec(cfg)
}

//! What the broker tells a worker: `pvisor.worker.v1.WorkerConfig` on the
//! configuration pipe ([`crate::launch::CONFIG_FD`]), in a length-delimited
//! `PipeMessage`, after at most one `Ahead` (work a warm worker does first).
//! Common fields plus the backend's own part (`ns` or `vm`), so a field renamed
//! on one side is a compile error on the other, not a silent default.
//!
//! The worker's own types ([`Limits`], [`IdMap`], [`GroupPaths`]) convert to
//! and from their proto messages here, in one place.
use crate::cgroup::GroupPaths;
use crate::error::{Result, WorkerError};
use pvisor_proto::worker as pb;
pub use pvisor_proto::worker::pipe_message::Kind as PipeKind;
pub use pvisor_proto::worker::worker_config::Backend as BackendConfig;
pub use pvisor_proto::worker::{Ahead, ImageDisk, NsConfig, TemplateCapture, VmConfig, VmEngine, Volume, WorkerConfig};
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
    /// ns: the disk template whose copy this warm worker mounted ahead
    /// ([`Ahead`]); set by the worker, not by the configuration.
    pub disk_ahead: Option<crate::ns::disk_ahead::Mounted>,
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
            disk_ahead: None,
        })
    }
}

/// Checks a configuration as read from the pipe and derives its common part.
pub fn check(cfg: WorkerConfig) -> Result<(WorkerConfig, Common)> {
    if cfg.backend.is_none() {
        return Err(WorkerError::Config("no backend part (ns or vm)".into()));
    }
    let common = Common::of(&cfg)?;
    Ok((cfg, common))
}

/// A configuration, framed for the pipe.
pub fn encode(cfg: &WorkerConfig) -> Vec<u8> {
    frame(PipeKind::Config(cfg.clone()))
}

/// Work ahead, framed for the pipe.
pub fn encode_ahead(ahead: &Ahead) -> Vec<u8> {
    frame(PipeKind::Ahead(ahead.clone()))
}

fn frame(kind: PipeKind) -> Vec<u8> {
    prost::Message::encode_length_delimited_to_vec(&pb::PipeMessage { kind: Some(kind) })
}

/// Largest message the pipe carries (a configuration is a few KiB).
const MAX_MESSAGE: u64 = 16 << 20;

/// The next message on the pipe; None at its end.
pub fn read_message(r: &mut impl std::io::Read) -> Result<Option<PipeKind>> {
    let bad = |what: String| WorkerError::Config(format!("configuration pipe: {what}"));
    let (mut len, mut shift) = (0u64, 0u32);
    loop {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) if shift == 0 => return Ok(None),
            Ok(0) => return Err(bad("ends inside a length".into())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(bad(e.to_string())),
        }
        len |= u64::from(b[0] & 0x7f) << shift;
        if b[0] & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err(bad("length too long".into()));
        }
    }
    if len > MAX_MESSAGE {
        return Err(bad(format!("message of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).map_err(|e| bad(format!("reading a message of {len} bytes: {e}")))?;
    let msg = <pb::PipeMessage as prost::Message>::decode(buf.as_slice()).map_err(|e| bad(e.to_string()))?;
    msg.kind.map(Some).ok_or_else(|| bad("an empty message".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WorkerConfig {
        WorkerConfig {
            sandbox_id: "sb".into(),
            limits: Some(pb::Limits { cpu_millis: 1000, memory_bytes: 1 << 29, pids: 64, disk_bytes: 0 }),
            backend: Some(BackendConfig::Ns(NsConfig::default())),
            ..Default::default()
        }
    }

    #[test]
    fn the_pipe_carries_ahead_then_the_config_then_ends() {
        let ahead = Ahead { disk_template: "/t.ext4".into(), disk_dir: "/run/x.disk".into() };
        let mut bytes = encode_ahead(&ahead);
        bytes.extend(encode(&config()));
        let mut r = bytes.as_slice();
        assert_eq!(read_message(&mut r).unwrap(), Some(PipeKind::Ahead(ahead)));
        let Some(PipeKind::Config(cfg)) = read_message(&mut r).unwrap() else { panic!("no config") };
        let (_, common) = check(cfg).unwrap();
        assert_eq!(common.sandbox_id, "sb");
        assert!(common.disk_ahead.is_none());
        assert_eq!(read_message(&mut r).unwrap(), None, "then the end");
    }

    #[test]
    fn a_cut_or_oversized_message_is_an_error_not_a_config() {
        let bytes = encode(&config());
        for cut in [1, bytes.len() - 1] {
            assert!(read_message(&mut &bytes[..cut]).is_err(), "cut at {cut}");
        }
        let huge = [0xff, 0xff, 0xff, 0xff, 0x7f];
        assert!(read_message(&mut &huge[..]).is_err());
        assert!(read_message(&mut &[0u8][..]).is_err(), "an empty message");
        let no_backend = WorkerConfig { backend: None, ..config() };
        assert!(check(no_backend).is_err());
    }
}

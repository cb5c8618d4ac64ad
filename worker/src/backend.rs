//! The boundary between the worker and an execution backend.
//!
//! A backend turns a [`WorkerConfig`] into a running [`Sandbox`] whose agent
//! is reachable over byte streams, as often as the worker connects. The
//! worker's gRPC service, the broker and the agent only see this trait: the
//! ns backend passes the agent a fresh socketpair end per connection, the vm
//! backend connects through its VMM's vsock device, and nothing else changes.
use crate::config::{BackendConfig, Common, WorkerConfig};
use crate::error::{Result, WorkerError};
use crate::threads::ThreadFilter;
use std::os::unix::net::UnixStream;

/// How a sandbox ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxExit {
    /// The init (ns) or the guest (vm) exited with this code.
    Exited(i32),
    /// The init was killed by this signal.
    Signaled(String),
    /// The guest powered off or reset (vm).
    GuestShutdown,
    /// The backend failed (a guest crash, an emulation failure, a lost wait).
    Failed(String),
}

impl std::fmt::Display for SandboxExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SandboxExit::Exited(c) => write!(f, "exited with code {c}"),
            SandboxExit::Signaled(s) => write!(f, "killed by {s}"),
            SandboxExit::GuestShutdown => f.write_str("guest shut down"),
            SandboxExit::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

/// Waits for the child `pid` to end, as a [`SandboxExit`] (`code 0` of a
/// guest engine means the guest shut down, so the caller maps codes).
pub fn wait_child(pid: i32, exited: impl Fn(i32) -> SandboxExit) -> SandboxExit {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return exited(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return SandboxExit::Signaled(sig.to_string()),
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return SandboxExit::Failed(format!("wait: {e}")),
        }
    }
}

/// How often the worker calls [`Sandbox::refresh_views`].
pub const VIEW_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// A running sandbox, owned by its worker.
pub trait Sandbox: Send + Sync {
    /// Backend name reported to the broker ("ns", "vm").
    fn backend(&self) -> &'static str;
    /// Host pid of the sandbox's init (ns), or of the process running the
    /// guest (vm: the worker itself, or the QEMU engine).
    fn init_pid(&self) -> i32;
    /// A new byte stream to the agent's gRPC server; may be called again to
    /// reconnect.
    fn connect_agent(&self) -> Result<UnixStream>;
    /// Stops every process of the sandbox from running, and lets them go
    /// again. How is the backend's business (cgroup freezer, stopped vCPUs).
    fn pause(&self) -> Result<()>;
    fn resume(&self) -> Result<()>;
    /// Kills the sandbox. Idempotent.
    fn kill(&self);
    /// Blocks until the sandbox has ended.
    fn wait(&self) -> SandboxExit;
    /// The last lines the sandbox wrote to its console, for error reports.
    fn console_tail(&self) -> String {
        String::new()
    }
    /// Stops the sandbox's vCPUs, writes its whole machine state (guest memory included) to
    /// `files`, copies its scratch disk as the guest left it, and lets the vCPUs run on. Only
    /// a vm engine that can ([`WorkerError::Unsupported`] otherwise).
    fn snapshot(&self, files: &SnapshotFiles) -> Result<SnapshotTaken> {
        let _ = files;
        Err(WorkerError::Unsupported(format!("snapshots of the machine state of {} sandboxes", self.backend())))
    }
    /// Brings what the sandbox sees of its own resources up to date (ns:
    /// its `/proc/meminfo`); called about once a second
    /// ([`VIEW_REFRESH`]). Nothing by default.
    fn refresh_views(&self) -> Result<()> {
        Ok(())
    }
}

/// Where [`Sandbox::snapshot`] writes: new files, none of which may exist.
#[derive(Debug, Clone)]
pub struct SnapshotFiles {
    /// The machine's state.
    pub state: std::path::PathBuf,
    /// Guest RAM, for an engine that keeps it apart from the state (the project's VMM);
    /// others do not create it.
    pub memory: std::path::PathBuf,
    /// The copy of the scratch disk.
    pub scratch: std::path::PathBuf,
}

/// What [`Sandbox::snapshot`] wrote.
#[derive(Clone, Debug)]
pub struct SnapshotTaken {
    /// The guest kernel command line the sandbox booted with (a restore's).
    pub cmdline: String,
    pub state_bytes: u64,
    /// How long the vCPUs were stopped for it.
    pub stopped: std::time::Duration,
}

/// The sandbox's side of its network link, for the worker to hand to netd:
/// a tap device opened inside the sandbox's network namespace (ns), or the
/// far end of the virtio-net device's frame socket (vm).
pub struct NetLink {
    pub fd: std::os::fd::OwnedFd,
    pub kind: pvisor_proto::net::LinkKind,
}

/// What [`Backend::start`] produced.
pub struct Started {
    pub sandbox: Box<dyn Sandbox>,
    /// Set when the configuration asked for a network (`WorkerConfig.net`).
    pub net_link: Option<NetLink>,
}

/// A way to start sandboxes.
pub trait Backend {
    /// Starts the sandbox. Called while the worker is still single-threaded.
    fn start(&self, common: &Common, cfg: &WorkerConfig) -> Result<Started>;
    /// Every thread this backend's worker runs, and its seccomp filter.
    fn threads(&self) -> &'static [ThreadFilter];
    /// Whether the main thread installs its filter on every thread
    /// (threads the backend started install none of their own).
    fn sync_filter(&self) -> bool {
        false
    }
}

/// The backend a configuration asks for.
pub fn for_config(cfg: &WorkerConfig) -> Result<Box<dyn Backend>> {
    match &cfg.backend {
        Some(BackendConfig::Ns(_)) => Ok(Box::new(crate::ns::NsBackend)),
        Some(BackendConfig::Vm(_)) => crate::vm::backend(cfg),
        None => Err(WorkerError::Config("no backend part (ns or vm)".into())),
    }
}

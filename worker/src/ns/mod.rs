//! The ns backend: the agent as PID 1 of a namespace jail.
//!
//! * [`spawn`]: the worker side — clone into new user, pid, mount, net, ipc
//!   and uts namespaces, write the id maps, release the child (it inherited
//!   the worker's `sandbox` cgroup leaf) and learn whether it reached the agent.
//! * [`init`]: the child side — identity, cgroup namespace, root filesystem,
//!   hostname, loopback, capabilities, seccomp, exec of the agent.
//! * [`mounts`]: the root filesystem (overlay, /proc, /dev, /tmp, pivot_root).
//! * [`etc`]: `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`, written
//!   without following the image's symlinks.
//! * [`link`]: with a network, the tap `eth0` the init creates in the new
//!   network namespace and hands to the worker (for netd).
//! * [`freeze`]: pausing by the cgroup freezer.
//! * [`disk`]: the sandbox's own ext4 for its writable layer (the disk bound);
//!   [`disk_ahead`]: a warm worker's, made before it has a sandbox.
//! * [`owner`]: a distinct host uid owns each sandbox's user namespace, so
//!   per-user kernel counts are charged per sandbox.
//! * [`procfs`]: `/proc/meminfo` and `/proc/cmdline` as the sandbox sees them;
//!   [`meminfo`] keeps the former current.
//! * [`volumes`]: host directories mounted by fd (resolved beneath their
//!   root, attached at a mount point resolved inside the sandbox root).
pub mod disk;
pub mod disk_ahead;
pub mod etc;
pub mod freeze;
pub mod init;
pub mod link;
pub mod meminfo;
pub mod mounts;
pub mod owner;
pub mod procfs;
pub mod spawn;
pub mod volumes;

use crate::backend::{Backend, NetLink, Sandbox, SandboxExit, Started};
use crate::config::{BackendConfig, Common, WorkerConfig};
use crate::error::{Result, WorkerError};
use crate::threads::{ThreadFilter, COMMON};
use freeze::FreezeScope;
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

pub struct NsBackend;

impl Backend for NsBackend {
    fn start(&self, common: &Common, cfg: &WorkerConfig) -> Result<Started> {
        let Some(BackendConfig::Ns(ns)) = &cfg.backend else {
            return Err(WorkerError::Config("the ns backend needs an ns part".into()));
        };
        let s = spawn::start(common, ns, cfg.net.is_some())?;
        let sandbox = Box::new(NsSandbox {
            pid: s.pid,
            connections: s.connections,
            freeze: FreezeScope::new(common.cgroup.clone()),
            meminfo: s.meminfo,
        });
        let net_link = s.tap.map(|fd| NetLink { fd, kind: pvisor_proto::net::LinkKind::LinkTap });
        Ok(Started { sandbox, net_link })
    }

    fn threads(&self) -> &'static [ThreadFilter] {
        &COMMON
    }
}

pub struct NsSandbox {
    pid: i32,
    /// The worker's end of the agent's connection socket: each message
    /// carries a new stream for the agent to serve.
    connections: OwnedFd,
    freeze: FreezeScope,
    meminfo: meminfo::Live,
}

impl Sandbox for NsSandbox {
    fn backend(&self) -> &'static str {
        "ns"
    }

    fn init_pid(&self) -> i32 {
        self.pid
    }

    fn connect_agent(&self) -> Result<UnixStream> {
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| WorkerError::sys("socketpair", e))?;
        let fds = [theirs.as_raw_fd()];
        sendmsg::<()>(
            self.connections.as_raw_fd(),
            &[std::io::IoSlice::new(&[0])],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| WorkerError::Agent(format!("passing a connection to the agent: {e}")))?;
        Ok(UnixStream::from(ours))
    }

    fn pause(&self) -> Result<()> {
        self.freeze.freeze(true)
    }

    fn resume(&self) -> Result<()> {
        self.freeze.freeze(false)
    }

    fn kill(&self) {
        // Killing PID 1 of the pid namespace kills every process in it.
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        let _ = self.freeze.thaw_for_kill();
    }

    fn wait(&self) -> SandboxExit {
        crate::backend::wait_child(self.pid, SandboxExit::Exited)
    }

    fn refresh_views(&self) -> Result<()> {
        self.meminfo.refresh().map_err(|e| WorkerError::sys("refresh /proc/meminfo", e))
    }
}

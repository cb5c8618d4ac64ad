//! The ns backend: the agent as PID 1 of a namespace jail.
//!
//! * [`spawn`]: the worker side — clone into new user, pid, mount, net, ipc
//!   and uts namespaces, write the id maps, place the child in the sandbox
//!   cgroup, release it and learn whether it reached the agent.
//! * [`init`]: the child side — identity, cgroup namespace, root filesystem,
//!   hostname, loopback, capabilities, seccomp, exec of the agent.
//! * [`mounts`]: the root filesystem (overlay, /proc, /dev, /tmp, pivot_root).
//! * [`net`]: bringing up loopback.
pub mod init;
pub mod mounts;
pub mod net;
pub mod spawn;

use crate::backend::{Backend, Sandbox};
use crate::cgroup::{GroupPaths, SANDBOX_LEAF};
use crate::config::WorkerConfig;
use crate::error::{Result, WorkerError};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

pub struct NsBackend;

impl Backend for NsBackend {
    fn start(&self, cfg: &WorkerConfig) -> Result<Box<dyn Sandbox>> {
        let (pid, stream) = spawn::start(cfg)?;
        Ok(Box::new(NsSandbox { pid, stream: Mutex::new(Some(stream)), cgroup: cfg.cgroup.clone() }))
    }
}

pub struct NsSandbox {
    pid: i32,
    stream: Mutex<Option<UnixStream>>,
    cgroup: Option<GroupPaths>,
}

impl NsSandbox {
    fn cgroup(&self) -> Result<&GroupPaths> {
        self.cgroup.as_ref().ok_or_else(|| WorkerError::NoCgroup("sandbox has no cgroup".into()))
    }
}

impl Sandbox for NsSandbox {
    fn backend(&self) -> &'static str {
        "ns"
    }

    fn init_pid(&self) -> i32 {
        self.pid
    }

    fn connect_agent(&self) -> Result<UnixStream> {
        self.stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| WorkerError::Agent("the agent connection was already taken".into()))
    }

    fn pause(&self) -> Result<()> {
        self.cgroup()?.freeze(SANDBOX_LEAF, true)
    }

    fn resume(&self) -> Result<()> {
        self.cgroup()?.freeze(SANDBOX_LEAF, false)
    }

    fn kill(&self) {
        // Killing PID 1 of the pid namespace kills every process in it.
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        if let Some(g) = &self.cgroup {
            let _ = g.freeze(SANDBOX_LEAF, false);
        }
    }

    fn wait(&self) -> String {
        loop {
            match waitpid(Pid::from_raw(self.pid), None) {
                Ok(WaitStatus::Exited(_, code)) => return format!("exited with code {code}"),
                Ok(WaitStatus::Signaled(_, sig, _)) => return format!("killed by {sig}"),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return format!("wait failed: {e}"),
            }
        }
    }
}

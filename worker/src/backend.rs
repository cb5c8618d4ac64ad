//! The boundary between the worker and an execution backend.
//!
//! A backend turns a [`WorkerConfig`] into a running [`Sandbox`] whose agent
//! is reachable over a byte stream. The worker's gRPC service, the broker and
//! the agent only see this trait: the ns backend gives the agent a socketpair,
//! a vm backend will give it a vsock connection through its VMM, and nothing
//! else changes.
use crate::config::{BackendKind, WorkerConfig};
use crate::error::{Result, WorkerError};
use std::os::unix::net::UnixStream;

/// A running sandbox, owned by its worker.
pub trait Sandbox: Send + Sync {
    /// Backend name reported to the broker ("ns", "vm").
    fn backend(&self) -> &'static str;
    /// Host pid of the sandbox's init (the agent for ns, the VMM thread for vm).
    fn init_pid(&self) -> i32;
    /// A byte stream to the agent's gRPC server.
    fn connect_agent(&self) -> Result<UnixStream>;
    /// Stops every process of the sandbox from running, and lets them go again.
    fn pause(&self) -> Result<()>;
    fn resume(&self) -> Result<()>;
    /// Kills the sandbox. Idempotent.
    fn kill(&self);
    /// Blocks until the sandbox's init has exited; returns its wait status text.
    fn wait(&self) -> String;
}

/// A way to start sandboxes.
pub trait Backend {
    /// Starts the sandbox. Called while the worker is still single-threaded.
    fn start(&self, cfg: &WorkerConfig) -> Result<Box<dyn Sandbox>>;
}

/// The backend for `kind`.
pub fn for_kind(kind: BackendKind) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Ns => Ok(Box::new(crate::ns::NsBackend)),
        BackendKind::Vm => Err(WorkerError::Start("the vm backend is not available in this build".into())),
    }
}

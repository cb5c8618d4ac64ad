//! The vm backend: the sandbox as a KVM microVM whose VMM runs in this worker.
//!
//! * [`host`]: what the host offers (hardware virtualization, PVM, none).
pub mod host;

use crate::backend::Backend;
use crate::error::{Result, WorkerError};

/// The vm backend, where this build and host can run it.
pub fn backend() -> Result<Box<dyn Backend>> {
    Err(WorkerError::Unavailable("vm", "the VMM is not wired into this worker yet".into()))
}

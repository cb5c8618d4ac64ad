//! Assembling a microVM and running it: [`VmBuilder`] → [`Vm::run`] → [`VmExit`](crate::VmExit).
//!
//! The builder opens `/dev/kvm`, creates the VM (irqchip, PIT), guest RAM from a memfd and its
//! memory slots, the serial console (IRQ 4 through an irqfd), the i8042 reset line and, for
//! tests, the debug exit port. The caller adds its own devices (virtio-mmio transports with
//! their ioeventfds and irqfd, test devices), loads a guest (flat or PVH), and builds; `run`
//! starts one thread per vCPU and blocks until the guest ends, fails, or [`VmHandle::stop`]
//! is called from another thread.//!
//! * [`config`]: what to build ([`VmConfig`]) and what devices hand the builder.
//! * [`builder`]: [`VmBuilder`], from `/dev/kvm` to configured vCPUs.
//! * [`running`]: [`Vm::run`], its vCPU threads, and [`VmHandle`] (stop, pause, resume).

pub mod builder;
pub mod config;
pub mod running;

pub use builder::VmBuilder;
pub use config::{IoEventFd, VirtioMmioSlot, VmConfig};
pub use running::{Vm, VmHandle};

use crate::{boot, bus, kvm, memory};

/// Errors of building a VM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// KVM refused something.
    #[error(transparent)]
    Kvm(#[from] kvm::Error),
    /// Guest memory could not be set up.
    #[error(transparent)]
    Memory(#[from] memory::Error),
    /// A device could not be placed.
    #[error(transparent)]
    Bus(#[from] bus::Error),
    /// The guest could not be loaded.
    #[error(transparent)]
    Boot(#[from] boot::Error),
    /// An eventfd could not be created.
    #[error("creating an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// The vCPU seccomp filter did not compile.
    #[error("compiling the vcpu seccomp filter: {0}")]
    Seccomp(#[from] pvisor_seccomp::Error),
    /// The kick signal handler could not be installed.
    #[error("installing the vCPU kick handler: {0}")]
    KickHandler(#[source] std::io::Error),
    /// A vCPU thread could not be started.
    #[error("starting a vCPU thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The configuration is invalid.
    #[error("invalid VM configuration: {0}")]
    Config(&'static str),
    /// No guest was loaded before `build`.
    #[error("no guest loaded (call load_flat or load_pvh before build)")]
    NoGuest,
    /// The clone-identity device got no randomness.
    #[error(transparent)]
    CloneId(#[from] crate::devices::clone_id::Error),
    /// A snapshot's UART state was refused.
    #[error("restoring the serial port: {0}")]
    SerialState(#[source] std::io::Error),
    /// The device GSIs are used up.
    #[error("no interrupt line left for another device")]
    NoGsi,
}

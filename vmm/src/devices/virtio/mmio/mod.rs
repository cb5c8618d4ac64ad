//! The virtio-mmio transport, version 2 ("modern"), as a [`crate::bus::BusDevice`].
//!
//! The guest finds the device through the kernel command line
//! (`virtio_mmio.device=<size>@<addr>:<irq>`) and drives the register file in
//! [`regs`]. Queue notifications arrive as writes to `QueueNotify`; the VMM
//! registers each queue's [`vmm_sys_util::eventfd::EventFd`] as a KVM
//! ioeventfd on that address (datamatch = queue index) so they never exit to
//! user space, and a plain MMIO write signals the same fd. Used buffers are
//! announced through [`Interrupt`]: the `InterruptStatus` bits plus an
//! `EventFd` the VMM registers as irqfd.
//!
//! The device model itself lives in a [`DeviceCell`] shared with the device
//! thread ([`super::event_loop`]), which does all queue processing.
//!
//! [`snapshot`]: the transport's registers and queues saved for a VM snapshot and put back
//! into a new transport.

mod interrupt;
pub mod regs;
pub mod snapshot;
mod state;
mod transport;

pub use interrupt::Interrupt;
pub use state::DeviceCell;
pub use transport::MmioTransport;

/// A transport shared by the MMIO bus (vCPU threads) and whoever snapshots the VM.
pub type SharedTransport = std::sync::Arc<std::sync::Mutex<MmioTransport>>;

/// Size of the MMIO window of one device (registers and config space).
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;

/// Errors creating a transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("device has {0} queues, more than the transport supports")]
    TooManyQueues(usize),
    #[error("creating queue {index}: {source}")]
    Queue {
        index: usize,
        #[source]
        source: virtio_queue::Error,
    },
    #[error("the snapshot's transport does not fit this device: {0}")]
    Mismatch(&'static str),
    #[error("the device refuses to be snapshotted: {0}")]
    Unsupported(&'static str),
}

#[cfg(test)]
pub(crate) mod tests;

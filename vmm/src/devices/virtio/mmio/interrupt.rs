//! The interrupt line of one virtio-mmio device: the `InterruptStatus`
//! register and the eventfd the VMM wires to the guest's interrupt (irqfd).

use std::sync::atomic::{AtomicU32, Ordering};

use vmm_sys_util::eventfd::EventFd;

/// Shared by the transport (guest reads and acks the status) and the device
/// thread (raises it).
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    irq: EventFd,
}

impl Interrupt {
    /// A line with a fresh non-blocking eventfd.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self { status: AtomicU32::new(0), irq: EventFd::new(libc::EFD_NONBLOCK)? })
    }

    /// Sets `bits` in InterruptStatus and signals the irqfd.
    pub fn trigger(&self, bits: u32) {
        self.status.fetch_or(bits, Ordering::SeqCst);
        // An eventfd write fails only on counter overflow (EAGAIN), in which
        // case the interrupt is already pending.
        let _ = self.irq.write(1);
    }

    /// The current InterruptStatus.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// The driver acknowledged `bits` (InterruptACK).
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Puts back a snapshot's InterruptStatus; a pending interrupt is signalled again (the
    /// driver reads the status, so a repeated interrupt is harmless).
    pub fn restore(&self, bits: u32) {
        self.status.store(bits, Ordering::SeqCst);
        if bits != 0 {
            let _ = self.irq.write(1);
        }
    }

    /// Clears every bit (device reset).
    pub fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }

    /// The eventfd to register as the device's irqfd.
    pub fn irq_fd(&self) -> &EventFd {
        &self.irq
    }
}

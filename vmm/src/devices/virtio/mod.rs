//! Virtio devices: transport-independent models on `virtio-queue`, the
//! virtio-mmio transport, and vhost-user back-ends serving the same models.
//!
//! A device model implements [`VirtioDevice`]: it says what it is (device
//! type, features, config space, queues) and turns available descriptor
//! chains into used ones. It never sees how the guest reaches it: the
//! [`mmio`] transport (guests on the project's own vCPUs, driven by the
//! device thread of [`event_loop`]) and [`vhost_user`] (QEMU as front-end)
//! both hand it `virtio_queue::Queue`s over guest memory and deliver the
//! interrupts it asks for.
//!
//! * [`block`]: virtio-blk over a [`block::BlockBackend`].
//! * [`vsock`]: virtio-vsock with a user-space back-end whose host side is
//!   Unix sockets.
//! * [`balloon`]: virtio-balloon serving free page reporting (an idle
//!   guest's free memory goes back to the host).
//! * [`net`]: virtio-net whose wire is a SOCK_SEQPACKET socket to the
//!   sandbox's network process (one Ethernet frame per message).

pub mod balloon;
pub mod block;
pub mod event_loop;
pub mod mmio;
pub mod net;
pub mod vhost_user;
pub mod vsock;

use std::os::fd::RawFd;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

/// Guest memory as every device model sees it.
pub type GuestMemory = GuestMemoryMmap<()>;

/// Feature bit 32: the device is a modern (virtio 1.x) device. Every device
/// here offers it and the transports refuse a driver that does not ack it.
pub const VIRTIO_F_VERSION_1: u32 = virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// Feature bit 28: indirect descriptor tables (handled by `virtio-queue`).
pub const VIRTIO_RING_F_INDIRECT_DESC: u32 = virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;

/// Which queues a device put used buffers into, one bit per queue index.
/// The transport decides (per queue, from the driver's suppression flags)
/// whether that becomes an interrupt.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsedQueues(u64);

impl UsedQueues {
    /// No queue was used.
    pub const NONE: Self = Self(0);

    /// Marks queue `index` as used.
    pub fn set(&mut self, index: usize) {
        if index < 64 {
            self.0 |= 1 << index;
        }
    }

    /// Whether queue `index` was used.
    pub fn contains(self, index: usize) -> bool {
        index < 64 && self.0 & (1 << index) != 0
    }

    /// Whether any queue was used.
    pub fn any(self) -> bool {
        self.0 != 0
    }

    /// Both sets together.
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The indices of the used queues, lowest first.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |i| self.contains(*i))
    }
}

/// A virtio device model, independent of the transport.
///
/// The transport owns the queues (their addresses, sizes and ready flags
/// are set by the driver through it) and passes them all to the device, so
/// a device whose work on one queue produces buffers on another (vsock: a
/// guest REQUEST on tx is answered on rx) can do so.
pub trait VirtioDevice: Send {
    /// The virtio device id (1 net, 2 block, 5 balloon, 19 vsock).
    fn device_type(&self) -> u32;

    /// Features offered to the driver; must include [`VIRTIO_F_VERSION_1`].
    fn features(&self) -> u64;

    /// The features the driver accepted (a subset of [`Self::features`],
    /// checked by the transport).
    fn ack_features(&mut self, features: u64);

    /// Maximum size of each queue; the number of queues is its length.
    fn queue_max_sizes(&self) -> &[u16];

    /// Reads `data.len()` bytes of the config space at `offset`. Bytes
    /// outside the config space read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes the config space. Devices whose config is read-only ignore it.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    /// The driver notified queue `index`: consume its available chains.
    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues;

    /// A file descriptor that becomes readable when the device has host-side
    /// work (vsock: its Unix sockets), for the transport's event loop; it is
    /// level-triggered and stays the same for the device's lifetime.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }

    /// The [`Self::event_fd`] is readable: do the host-side work.
    fn handle_event(&mut self, _queues: &mut [Queue], _mem: &GuestMemory) -> UsedQueues {
        UsedQueues::NONE
    }

    /// The driver reset the device: drop all in-flight state. Queues are
    /// reset by the transport.
    fn reset(&mut self) {}

    /// Whether the device can be snapshotted through its transport alone: `Ok` if everything
    /// it keeps besides its acked features is rebuilt by whoever creates it again (a block
    /// device's backend, reopened), `Err(why not)` if it holds state a snapshot would lose
    /// (vsock's host connections). See [`mmio::snapshot`].
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Err("a virtio device without snapshot support")
    }

    /// Called once when the device is built again from a snapshot (after its features are
    /// acked, before its queues are kicked): what it must tell the guest about state it did not
    /// carry (vsock: a transport reset). Nothing by default.
    fn restored(&mut self) {}
}

/// Reads `data.len()` bytes at `offset` of a config space image; bytes past
/// its end read as zero.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in data.iter_mut().enumerate() {
        let index = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
        *byte = index.and_then(|i| config.get(i)).copied().unwrap_or(0);
    }
}

#[cfg(test)]
pub(crate) mod test_utils;

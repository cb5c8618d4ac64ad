//! What a snapshot's state file holds, split as Firecracker splits its `persist` state: the
//! VM's KVM state, one record per vCPU, one per device, and a description of the memory file.
//! Everything here is serde; the file's framing is in [`super::format`].

use serde::{Deserialize, Serialize};

use crate::devices::serial::UartState;
use crate::devices::virtio::mmio::snapshot::TransportState;
use crate::kvm::state::{VcpuState, VmState};

/// The whole state of a paused VM, except its memory (which is in the memory file).
#[derive(Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// In-kernel irqchip, PIT, kvmclock.
    pub vm: VmState,
    /// Every vCPU, in id order.
    pub vcpus: Vec<VcpuState>,
    /// The devices' state.
    pub devices: DevicesState,
    /// The guest RAM the memory file holds.
    pub memory: MemoryState,
}

/// The devices' state: the standard ones, and each virtio-mmio transport added with
/// `VmBuilder::add_virtio_transport` (a VM with an opaque virtio device refuses to be
/// snapshotted, [`super::Error::Unsupported`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesState {
    /// The COM1 UART's registers and unread input.
    pub serial: UartState,
    /// The clone-identity generation the snapshotted guest saw (a restore shows it + 1).
    pub clone_generation: u64,
    /// Whether the debug exit port was present (test guests).
    pub debug_exit: bool,
    /// The virtio-mmio transports, in placement order.
    pub virtio: Vec<VirtioSlotState>,
}

/// One virtio-mmio transport: where it sat and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioSlotState {
    /// Base address of its window.
    pub addr: u64,
    /// Its interrupt line.
    pub gsi: u32,
    /// Registers and queues.
    pub transport: TransportState,
}

/// The memory file's layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryState {
    /// Guest RAM in bytes (the memory file's size).
    pub bytes: u64,
    /// The RAM regions, `(guest address, size)`, back to back in the file.
    pub regions: Vec<(u64, u64)>,
}

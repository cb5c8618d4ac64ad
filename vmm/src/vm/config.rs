//! What a VM is built from: its configuration and the device plumbing callers hand over.

use std::fs::File;

use vmm_sys_util::eventfd::EventFd;

/// How to build a VM.
#[derive(Debug)]
pub struct VmConfig {
    /// vCPUs (1..=254).
    pub vcpus: u8,
    /// Guest RAM in bytes (a multiple of 4 KiB).
    pub memory_bytes: u64,
    /// Bytes of console output kept in memory (for failure reports).
    pub console_memory_cap: usize,
    /// A file the console is also written to, and its size cap.
    pub console_file: Option<(File, u64)>,
    /// Whether to put the debug exit port (0x501) on the PIO bus (test guests).
    pub debug_exit: bool,
    /// Whether vCPU threads install the `vcpu` seccomp filter (always, outside debugging).
    pub vcpu_seccomp: bool,
    /// Whether guest RAM is private anonymous memory marked `MADV_MERGEABLE` (KSM may merge
    /// it with identical pages of other VMs) instead of the shareable memfd. Such RAM has no fd
    /// for vhost-user back-ends. On a restore: mark the private copy-on-write mapping mergeable.
    pub mergeable: bool,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: 1,
            memory_bytes: 128 << 20,
            console_memory_cap: 64 << 10,
            console_file: None,
            debug_exit: false,
            vcpu_seccomp: true,
            mergeable: false,
        }
    }
}

/// An ioeventfd a device wants: KVM signals `fd` when the guest writes `addr` (with
/// `datamatch`, only that 32-bit value).
pub struct IoEventFd {
    /// Guest-physical address (e.g. a virtio-mmio window's `QueueNotify`, base + 0x50).
    pub addr: u64,
    /// Value to match, or any.
    pub datamatch: Option<u32>,
    /// The eventfd.
    pub fd: EventFd,
}

/// Where a virtio-mmio device was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioMmioSlot {
    /// Base address of its 4 KiB window.
    pub addr: u64,
    /// Its interrupt line.
    pub gsi: u32,
}

impl VirtioMmioSlot {
    /// The kernel command-line fragment that makes Linux probe it
    /// (`CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES`).
    pub fn cmdline(&self) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{}", self.addr, self.gsi)
    }
}

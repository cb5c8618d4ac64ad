//! VM snapshots: pause a running VM, save its state and memory, and restore VMs from them —
//! as many clones as wanted, each mapping the memory file copy-on-write.
//!
//! A snapshot is two files ([`SnapshotPaths`]): the **state file** (header with format version
//! and SHA-256, then serde JSON: [`state::Snapshot`]) and the **memory file** (guest RAM, sparse,
//! the memfd's layout). Taking one ([`Snapshotter::snapshot`]):
//!
//! 1. pause the VM at the pause gate ([`crate::pause`]); each vCPU finishes its last port or MMIO
//!    exit inside KVM before it parks, so no half-done instruction is left in `kvm_run`;
//! 2. read each vCPU's state through a second fd of it ([`crate::kvm::VcpuView`]) from the
//!    snapshotting thread (the vCPU threads keep their seccomp filter), then the irqchip, PIT
//!    and kvmclock, then the devices (UART registers, clone generation);
//! 3. write the memory file (non-zero pages of what the guest touched) and the state file;
//! 4. resume the VM, unless it was paused before.
//!
//! Restoring ([`restore`]) creates a fresh VM with the saved irqchip, PIT and clock, maps the
//! memory file **privately** (`MAP_PRIVATE`: clones of one snapshot share its untouched pages
//! through the page cache; each write gives the writer its own copy), puts the saved state into
//! new vCPUs and devices, and returns a [`Vm`] ready to run from the instruction it was paused
//! at.
//!
//! **Clone hygiene.** Every restored VM gets, before its first instruction: a fresh 32-byte seed
//! and the host's wall clock in the clone-identity device ([`crate::devices::clone_id`]), whose
//! generation is the snapshot's + 1 (the guest polls it and reseeds); and kvmclock set with
//! `KVM_CLOCK_REALTIME`, so KVM advances the guest's clock by the wall time since the snapshot.
//! The guest TSC MSR is restored to its saved value (time stands still for TSC readers until
//! they re-read kvmclock or the wall clock).
//!
//! **Virtio devices**: transports added with
//! [`VmBuilder::add_virtio_transport`] are saved (registers, queues:
//! [`crate::devices::virtio::mmio::snapshot`]) if their device declares snapshot support
//! (virtio-blk does; vsock does: a restored vsock device starts without host connections and
//! sends the guest a transport reset, so the guest drops its connections and the host connects
//! again; net does: a restored one is on a new link, the frame in flight each way is not
//! carried). While the state and memory are captured, every transport's
//! device cell is locked, so the device thread cannot touch guest memory or queues mid-capture.
//! [`restore_with_devices`] takes fresh device models in the same order (a block device over the
//! same backend), restores each transport into the same window and GSI, and kicks its queues.
//!
//! **What KVM gives here (PVM)**: everything of [`crate::kvm::state`] (XSAVE, XCRs, debug
//! registers, every listed MSR, LAPIC, events, MP state, PIC/IOAPIC, PIT, kvmclock with
//! `KVM_CLOCK_REALTIME`); pieces a KVM refuses are listed in each
//! [`VcpuState::missing`](crate::kvm::state::VcpuState::missing) and in [`SnapshotInfo`].
//! **Not captured**: a caller's own PIO/MMIO devices and opaque virtio devices (such a VM
//! refuses with [`Error::Unsupported`]); the console log (host-side; a clone starts an empty
//! one).
//!
//! * [`state`]: the serde records; [`format`]: the state file's framing; [`memory`]: the memory
//!   file; [`error`]: [`Error`].

pub mod error;
pub mod format;
pub mod memory;
pub mod state;

pub use error::Error;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::devices::clone_id::CloneId;
use crate::devices::serial::Serial;
use crate::devices::virtio::mmio::{MmioTransport, SharedTransport};
use crate::devices::virtio::VirtioDevice;
use crate::kvm::{self, Hypervisor, VcpuView};
use crate::memory::{Backing, GuestRam};
use crate::vm::builder::DeviceStart;
use crate::vm::{VirtioMmioSlot, Vm, VmBuilder, VmConfig, VmHandle};

/// Where a snapshot's two files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPaths {
    /// The state file.
    pub state: PathBuf,
    /// The memory file.
    pub memory: PathBuf,
}

impl SnapshotPaths {
    /// `DIR/state` and `DIR/memory`.
    pub fn in_dir(dir: &Path) -> Self {
        SnapshotPaths { state: dir.join("state"), memory: dir.join("memory") }
    }
}

/// What a snapshot took.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// Bytes of guest memory written into the memory file (non-zero pages).
    pub memory_written: u64,
    /// Bytes of guest memory looked at.
    pub memory_scanned: u64,
    /// What KVM refused to give, per vCPU (`vCPU n: what`), and unreadable MSRs.
    pub missing: Vec<String>,
}

/// Takes snapshots of one VM, from any thread, while or before it runs. Holds the VM's KVM fd,
/// a second fd of each vCPU and a reference to its memory, so it may outlive the VM's `run`
/// (a snapshot after the VM ended fails at the pause).
pub struct Snapshotter {
    handle: VmHandle,
    vm: Arc<kvm::Vm>,
    views: Vec<VcpuView>,
    serial: Arc<Mutex<Serial>>,
    clone_id: Arc<Mutex<CloneId>>,
    debug_exit: bool,
    memory: GuestMemoryMmap,
    backing_file: Option<File>,
    backing: Backing,
    transports: Vec<(VirtioMmioSlot, SharedTransport)>,
}

impl Vm {
    /// A [`Snapshotter`] for this VM (call before [`run`](Vm::run), which consumes the VM).
    pub fn snapshotter(&self) -> Result<Snapshotter, Error> {
        if let Some(what) = self.unsnapshottable {
            return Err(Error::Unsupported(what));
        }
        let views = self.vcpus.iter().map(|v| self.vm.vcpu_view(v)).collect::<Result<Vec<_>, _>>()?;
        let backing_file = self.ram.backing_file().map(File::try_clone).transpose().map_err(|source| Error::Io {
            what: "duplicating",
            path: "the guest memory fd".into(),
            source,
        })?;
        Ok(Snapshotter {
            handle: self.handle(),
            vm: self.vm.clone(),
            views,
            serial: self.serial.clone(),
            clone_id: self.clone_id.clone(),
            debug_exit: self.debug_exit,
            memory: self.ram.memory().clone(),
            backing_file,
            backing: self.ram.backing(),
            transports: self.transports.clone(),
        })
    }
}

impl Snapshotter {
    /// Pauses the VM, writes its snapshot to `paths`, and resumes it (unless it was paused
    /// already). The VM does not run while the files are written.
    pub fn snapshot(&self, paths: &SnapshotPaths) -> Result<SnapshotInfo, Error> {
        self.snapshot_with(paths, || Ok(()))
    }

    /// [`Snapshotter::snapshot`], running `with_devices_held` once the memory file is written
    /// and before anything runs again: the vCPUs are paused and the device thread is kept out
    /// of every device, so disks are as the saved queues left them (the worker copies the
    /// scratch disk here). Its error fails the snapshot.
    pub fn snapshot_with(
        &self,
        paths: &SnapshotPaths,
        with_devices_held: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<SnapshotInfo, Error> {
        let was_paused = self.handle.is_paused();
        self.handle.pause()?;
        let result = self.capture(paths, with_devices_held);
        if !was_paused {
            // A VM that ended meanwhile cannot resume; the snapshot's result stands.
            let _ = self.handle.resume();
        }
        result
    }

    /// Takes the snapshot of a VM that is paused (or not yet started).
    fn capture(
        &self,
        paths: &SnapshotPaths,
        with_devices_held: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<SnapshotInfo, Error> {
        let mut missing = Vec::new();
        let mut vcpus = Vec::with_capacity(self.views.len());
        for view in &self.views {
            let state = view.save_state()?;
            missing.extend(state.missing.iter().map(|m| format!("vCPU {}: {m}", state.id)));
            if !state.unreadable_msrs.is_empty() {
                missing.push(format!("vCPU {}: unreadable MSRs {:x?}", state.id, state.unreadable_msrs));
            }
            vcpus.push(state);
        }
        let vm = self.vm.save_state()?;
        if vm.clock.is_none() {
            missing.push("KVM_GET_CLOCK".into());
        }
        // Keep the device thread out of every device until the memory is written.
        let transports: Vec<_> =
            self.transports.iter().map(|(_, t)| t.lock().unwrap_or_else(|p| p.into_inner())).collect();
        let cells: Vec<_> = transports.iter().map(|t| t.cell().lock().unwrap_or_else(|p| p.into_inner())).collect();
        let mut virtio = Vec::with_capacity(cells.len());
        for ((slot, _), (transport, cell)) in self.transports.iter().zip(transports.iter().zip(&cells)) {
            virtio.push(state::VirtioSlotState {
                addr: slot.addr,
                gsi: slot.gsi,
                transport: transport.state_of(cell)?,
            });
        }
        let serial = self.serial.lock().unwrap_or_else(|p| p.into_inner()).state();
        let clone_generation = self.clone_id.lock().unwrap_or_else(|p| p.into_inner()).generation();
        let regions = {
            use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
            self.memory.iter().map(|r| (r.start_addr().0, r.len())).collect::<Vec<_>>()
        };
        let snapshot = state::Snapshot {
            vm,
            vcpus,
            devices: state::DevicesState { serial, clone_generation, debug_exit: self.debug_exit, virtio },
            memory: state::MemoryState { bytes: regions.iter().map(|r| r.1).sum(), regions },
        };
        let stats = memory::write(&self.memory, self.backing_file.as_ref(), self.backing, &paths.memory)?;
        with_devices_held().map_err(Error::WhileHeld)?;
        drop(cells);
        drop(transports);
        let state_bytes = format::write(&snapshot, &paths.state)?;
        Ok(SnapshotInfo { state_bytes, memory_written: stats.written, memory_scanned: stats.scanned, missing })
    }
}

/// Restores a VM without virtio devices from the snapshot at `paths`. From `config` only the
/// console settings and `vcpu_seccomp` are used: vCPUs, RAM and the debug port come from the
/// snapshot. The VM's clone-identity device shows generation + 1 and a fresh seed.
pub fn restore(paths: &SnapshotPaths, config: VmConfig) -> Result<Vm, Error> {
    Ok(restore_with_devices(paths, config, Vec::new())?.0)
}

/// [`restore`] for a snapshot with virtio devices: `devices` are fresh models of the snapshot's
/// devices in their order (same kind, same offered features: a block device over the same disk).
/// Returns the VM and the restored transports, to add to the device thread's event loop before
/// the VM runs (their queues are already kicked once).
pub fn restore_with_devices(
    paths: &SnapshotPaths,
    config: VmConfig,
    devices: Vec<Box<dyn VirtioDevice>>,
) -> Result<(Vm, Vec<SharedTransport>), Error> {
    let snapshot = format::read(&paths.state)?;
    let file = File::open(&paths.memory).map_err(Error::io("opening", &paths.memory))?;
    let file_len = file.metadata().map_err(Error::io("reading the size of", &paths.memory))?.len();
    if file_len != snapshot.memory.bytes {
        return Err(Error::MemorySize { file: file_len, state: snapshot.memory.bytes });
    }
    let vcpus = u8::try_from(snapshot.vcpus.len())
        .ok()
        .filter(|&n| (1..=254).contains(&n))
        .ok_or(crate::vm::Error::Config("a snapshot's vCPU count must be 1..=254"))?;
    let config =
        VmConfig { vcpus, memory_bytes: snapshot.memory.bytes, debug_exit: snapshot.devices.debug_exit, ..config };
    let kvm = Hypervisor::open().map_err(crate::vm::Error::from)?;
    let vm = kvm.create_vm()?;
    vm.restore_state(&snapshot.vm)?;
    let ram = GuestRam::from_snapshot(file, snapshot.memory.bytes)?;
    if config.mergeable {
        ram.mark_mergeable()?;
    }
    let start =
        DeviceStart { serial: Some(&snapshot.devices.serial), generation: snapshot.devices.clone_generation + 1 };
    let mut builder = VmBuilder::assemble(config, kvm, vm, ram, start)?;
    if devices.len() != snapshot.devices.virtio.len() {
        return Err(Error::VirtioCount { snapshot: snapshot.devices.virtio.len(), given: devices.len() });
    }
    let mut transports = Vec::with_capacity(devices.len());
    for (index, (device, saved)) in devices.into_iter().zip(&snapshot.devices.virtio).enumerate() {
        let mem = GuestMemoryAtomic::new(builder.memory().clone());
        let transport = MmioTransport::restore(device, mem, &saved.transport)?;
        let (slot, transport) = builder.add_virtio_transport(transport)?;
        if (slot.addr, slot.gsi) != (saved.addr, saved.gsi) {
            return Err(Error::VirtioSlot { index, saved: saved.addr, saved_gsi: saved.gsi, placed: slot.addr });
        }
        transport.lock().unwrap_or_else(|p| p.into_inner()).kick_queues();
        transports.push(transport);
    }
    builder.set_restored_vcpus(snapshot.vcpus);
    Ok((builder.build()?, transports))
}

#[cfg(test)]
mod tests;

//! The product engine: the project's own VMM (`pvisor-vmm`) in this worker.
//!
//! Guest RAM is a memfd mapped into the worker; the kernel is booted
//! directly (PVH) with the agent's initramfs; virtio-blk (image, scratch),
//! virtio-vsock and (with a network) virtio-net sit behind virtio-mmio transports whose queues are served by
//! one device thread; each vCPU runs on a thread of its own. vCPU threads
//! install the `vcpu` filter before their first `KVM_RUN`; the device thread
//! runs the `vmm_device` filter.
//!
//! **Snapshots** ([`Sandbox::snapshot`]): the VMM's own
//! ([`pvisor_vmm::snapshot`]): the vCPUs are paused, the state file and the
//! memory file (guest RAM, sparse) written, and the scratch disk copied while
//! the device thread is still kept out of the devices, then the vCPUs run on.
//! A restore ([`VmConfig::restore`]) builds the VM from the snapshot with the
//! memory file mapped privately (clones of one template share its untouched
//! pages through the page cache) and fresh device models in the same order:
//! the image and scratch disks (a copy of the snapshot's), vsock (which resets
//! the guest's transport, so the agent's port is connected again) and, with a
//! network, virtio-net on the clone's own link.
use super::cmdline::{cmdline, AGENT_PORT};
use super::console::{Console, FILE_CAP, MEMORY_CAP};
use super::disks;
use super::net;
use crate::backend::{Sandbox, SandboxExit, SnapshotFiles, SnapshotTaken};
use crate::config::VmConfig;
use crate::error::{Result, WorkerError};
use pvisor_vmm::devices::virtio::balloon::{self, Balloon};
use pvisor_vmm::devices::virtio::block::{Block, BlockBackend};
use pvisor_vmm::devices::virtio::event_loop::EventLoop;
use pvisor_vmm::devices::virtio::mmio::MmioTransport;
use pvisor_vmm::devices::virtio::vsock::{Vsock, VsockHandle};
use pvisor_vmm::devices::virtio::VirtioDevice;
use pvisor_vmm::snapshot::{SnapshotPaths, Snapshotter};
use pvisor_vmm::{Vm, VmBuilder, VmExit, VmHandle};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryAtomic;

pub struct KvmSandbox {
    handle: VmHandle,
    vsock: VsockHandle,
    console: Console,
    exit: Arc<(Mutex<Option<VmExit>>, Condvar)>,
    boot_deadline: Instant,
    /// Takes the VM's snapshots, or why it cannot.
    snapshotter: std::result::Result<Snapshotter, String>,
    /// The scratch disk's file (a snapshot copies it).
    scratch: PathBuf,
    /// The guest kernel command line (a restore's is its source's).
    cmdline: String,
}

fn vmm_err(what: &'static str) -> impl Fn(pvisor_vmm::vm::Error) -> WorkerError {
    move |e| WorkerError::Start(format!("{what}: {e}"))
}

fn loop_err(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Start(format!("device loop: {e}"))
}

/// The sandbox's virtio devices, in the order the guest finds them (a restore's must be its
/// source's): the image disk (vda), the scratch disk (vdb), vsock, with a network net, and the
/// balloon through which the guest reports its free pages (they go back to the host).
fn devices(
    vm: &VmConfig,
    root: Arc<dyn BlockBackend>,
    net_end: Option<OwnedFd>,
) -> Result<(Vec<Box<dyn VirtioDevice>>, VsockHandle)> {
    let vsock = Vsock::new(u64::from(vm.guest_cid), None).map_err(|e| WorkerError::Start(format!("vsock: {e}")))?;
    let handle = vsock.handle();
    let mut devices: Vec<Box<dyn VirtioDevice>> = vec![
        Box::new(Block::new(root, disks::ROOT_ID)),
        Box::new(Block::new(disks::open_scratch(&vm.scratch_disk)?, disks::SCRATCH_ID)),
        Box::new(vsock),
    ];
    if let Some(end) = net_end {
        devices.push(Box::new(net::device(end)?));
    }
    devices.push(Box::new(Balloon::new()));
    Ok((devices, handle))
}

/// Fits fresh devices to a snapshot that has `saved` of them: one taken before VMs had their
/// balloon (the last device) is restored without one, so older snapshots and templates restore.
fn fit_to_snapshot(devices: &mut Vec<Box<dyn VirtioDevice>>, saved: usize) {
    let balloon_last = devices.last().is_some_and(|d| d.device_type() == balloon::DEVICE_TYPE);
    if balloon_last && saved + 1 == devices.len() {
        devices.pop();
    }
}

/// A new VM booting the guest kernel with `devices`.
fn boot(
    vm: &VmConfig,
    config: pvisor_vmm::VmConfig,
    hostname: &str,
    devices: Vec<Box<dyn VirtioDevice>>,
    events: &mut EventLoop,
) -> Result<(Vm, String)> {
    // virtio device id 1: net.
    let has_net = devices.iter().any(|d| d.device_type() == 1);
    let mut b = VmBuilder::new(config).map_err(vmm_err("vm"))?;
    for device in devices {
        let mem = GuestMemoryAtomic::new(b.memory().clone());
        let transport = MmioTransport::new(device, mem).map_err(|e| WorkerError::Start(format!("virtio-mmio: {e}")))?;
        events.add(&transport).map_err(loop_err)?;
        b.add_virtio_transport(transport).map_err(vmm_err("virtio-mmio slot"))?;
    }
    let open = |p: &str| std::fs::File::open(p).map_err(|e| WorkerError::sys(format!("open {p}"), e));
    let (mut kernel, mut initramfs) = (open(&vm.kernel)?, open(&vm.initramfs)?);
    let line = cmdline(vm, hostname, has_net);
    b.load_pvh(&mut kernel, &line, Some(&mut initramfs)).map_err(vmm_err("boot"))?;
    Ok((b.build().map_err(vmm_err("vcpus"))?, line))
}

/// A VM restored from the snapshot `restore` names, with `devices` in its source's order.
fn restore(
    restore: &pvisor_proto::worker::VmRestore,
    config: pvisor_vmm::VmConfig,
    devices: Vec<Box<dyn VirtioDevice>>,
    events: &mut EventLoop,
) -> Result<(Vm, String)> {
    if restore.memory_file.is_empty() {
        return Err(WorkerError::Config("vm restore: this engine needs the snapshot's memory file".into()));
    }
    let paths = SnapshotPaths { state: restore.state_file.clone().into(), memory: restore.memory_file.clone().into() };
    let saved = pvisor_vmm::snapshot::format::read(&paths.state)
        .map_err(|e| WorkerError::Start(format!("reading {}: {e}", paths.state.display())))?;
    let mut devices = devices;
    fit_to_snapshot(&mut devices, saved.devices.virtio.len());
    let (machine, transports) = pvisor_vmm::snapshot::restore_with_devices(&paths, config, devices)
        .map_err(|e| WorkerError::Start(format!("restoring {}: {e}", paths.state.display())))?;
    for t in &transports {
        events.add(&t.lock().unwrap_or_else(|p| p.into_inner())).map_err(loop_err)?;
    }
    Ok((machine, restore.cmdline.clone()))
}

/// `net_end`: the device's end of the network link, when the sandbox has one.
pub fn start(vm: &VmConfig, hostname: &str, boot_timeout: Duration, net_end: Option<OwnedFd>) -> Result<KvmSandbox> {
    let root_disk = vm.root_disk.as_ref().ok_or_else(|| WorkerError::Config("vm: root_disk missing".into()))?;
    start_with_root(vm, disks::open_root(root_disk)?, hostname, boot_timeout, net_end)
}

/// [`start`] with the image disk's backend opened (tests give their own).
fn start_with_root(
    vm: &VmConfig,
    root: Arc<dyn BlockBackend>,
    hostname: &str,
    boot_timeout: Duration,
    net_end: Option<OwnedFd>,
) -> Result<KvmSandbox> {
    let console_file = std::fs::File::create(&vm.console_log)
        .map_err(|e| WorkerError::sys(format!("console {}", vm.console_log), e))?;
    let config = pvisor_vmm::VmConfig {
        vcpus: u8::try_from(vm.vcpus.clamp(1, 64)).unwrap_or(1),
        memory_bytes: vm.memory_mib << 20,
        console_memory_cap: MEMORY_CAP,
        console_file: Some((console_file, FILE_CAP)),
        // `--memory-merge`: anonymous RAM KSM may merge (no vhost-user here needs the memfd).
        mergeable: vm.memory_merge,
        ..Default::default()
    };
    let mut events = EventLoop::new().map_err(loop_err)?;
    let (devices, vsock_handle) = devices(vm, root, net_end)?;
    let (machine, cmdline) = match &vm.restore {
        Some(r) => restore(r, config, devices, &mut events)?,
        None => boot(vm, config, hostname, devices, &mut events)?,
    };
    let console = Console::from_shared(machine.console());
    let handle = machine.handle();
    let snapshotter = machine.snapshotter().map_err(|e| e.to_string());
    // The device thread installs the vmm_device filter before its first wait.
    let devices = events.spawn("devices").map_err(|e| WorkerError::Start(format!("device thread: {e}")))?;
    let exit = Arc::new((Mutex::new(None), Condvar::new()));
    let done = exit.clone();
    // The `vm` thread only starts the vCPUs (which add their own filter) and
    // waits: the worker filter, installed before anything else.
    let filter = pvisor_seccomp::worker_filter().map_err(|e| WorkerError::Seccomp(e.to_string()))?;
    std::thread::Builder::new()
        .name("vm".into())
        .spawn(move || {
            let e = match pvisor_seccomp::apply_to_thread(&filter) {
                Ok(()) => machine.run(),
                Err(e) => {
                    VmExit::Failed { reason: format!("seccomp on the vm thread: {e}"), console_tail: String::new() }
                }
            };
            // The VM is over: stop the device thread (devices drop outside its filter).
            drop(devices);
            *done.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            done.1.notify_all();
        })
        .map_err(|e| WorkerError::sys("vm thread", e))?;
    Ok(KvmSandbox {
        handle,
        vsock: vsock_handle,
        console,
        exit,
        boot_deadline: Instant::now() + boot_timeout,
        snapshotter,
        scratch: PathBuf::from(&vm.scratch_disk),
        cmdline,
    })
}

impl Sandbox for KvmSandbox {
    fn backend(&self) -> &'static str {
        "vm"
    }

    fn init_pid(&self) -> i32 {
        std::process::id() as i32
    }

    fn connect_agent(&self) -> Result<UnixStream> {
        super::connect_with_retry(&self.vsock, AGENT_PORT, self.boot_deadline)
    }

    /// Parks every vCPU (returns once none is in the guest); the device thread keeps serving
    /// requests already queued. Pausing a paused sandbox is a no-op.
    fn pause(&self) -> Result<()> {
        self.handle.pause().map_err(|e| WorkerError::sys("pause", std::io::Error::other(e)))
    }

    /// Lets the parked vCPUs re-enter the guest. Resuming a running sandbox is a no-op.
    fn resume(&self) -> Result<()> {
        self.handle.resume().map_err(|e| WorkerError::sys("resume", std::io::Error::other(e)))
    }

    fn kill(&self) {
        self.handle.stop();
    }

    fn wait(&self) -> SandboxExit {
        let mut g = self.exit.0.lock().unwrap_or_else(|p| p.into_inner());
        while g.is_none() {
            g = self.exit.1.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        match g.take() {
            Some(VmExit::Shutdown | VmExit::Reset) => SandboxExit::GuestShutdown,
            Some(VmExit::Stopped) => SandboxExit::Signaled("stopped".into()),
            Some(VmExit::DebugExit(code)) => SandboxExit::Exited(i32::from(code)),
            Some(VmExit::Failed { reason, .. }) => SandboxExit::Failed(reason),
            None => SandboxExit::Failed("no exit recorded".into()),
        }
    }

    fn console_tail(&self) -> String {
        self.console.tail()
    }

    fn snapshot(&self, files: &SnapshotFiles) -> Result<SnapshotTaken> {
        let snapshotter = self.snapshotter.as_ref().map_err(|e| WorkerError::Unsupported(e.clone()))?;
        let paths = SnapshotPaths { state: files.state.clone(), memory: files.memory.clone() };
        let t = Instant::now();
        let info = snapshotter
            .snapshot_with(&paths, || {
                crate::ns::disk::copy_sparse(&self.scratch, &files.scratch).map_err(std::io::Error::other)
            })
            .map_err(|e| WorkerError::Snapshot(e.to_string()))?;
        if !info.missing.is_empty() {
            tracing::warn!(missing = ?info.missing, "snapshot: state KVM did not give");
        }
        Ok(SnapshotTaken { cmdline: self.cmdline.clone(), state_bytes: info.state_bytes, stopped: t.elapsed() })
    }
}

#[cfg(test)]
#[path = "kvm_tests.rs"]
mod tests;

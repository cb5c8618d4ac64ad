//! The product engine: the project's own VMM (`pvisor-vmm`) in this worker.
//!
//! Guest RAM is a memfd mapped into the worker; the kernel is booted
//! directly (PVH) with the agent's initramfs; virtio-blk (image, scratch),
//! virtio-vsock and (with a network) virtio-net sit behind virtio-mmio transports whose queues are served by
//! one device thread; each vCPU runs on a thread of its own. vCPU threads
//! install the `vcpu` filter before their first `KVM_RUN`; the device thread
//! runs the `vmm_device` filter.
use super::cmdline::{cmdline, AGENT_PORT};
use super::console::{Console, FILE_CAP, MEMORY_CAP};
use super::disks;
use super::net;
use crate::backend::{Sandbox, SandboxExit};
use crate::config::VmConfig;
use crate::error::{Result, WorkerError};
use pvisor_vmm::devices::virtio::block::Block;
use pvisor_vmm::devices::virtio::event_loop::EventLoop;
use pvisor_vmm::devices::virtio::mmio::MmioTransport;
use pvisor_vmm::devices::virtio::vsock::{Vsock, VsockHandle};
use pvisor_vmm::devices::virtio::VirtioDevice;
use pvisor_vmm::{IoEventFd, VmBuilder, VmExit, VmHandle};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryAtomic;

/// Offset of QueueNotify in a virtio-mmio window.
const QUEUE_NOTIFY: u64 = 0x50;

pub struct KvmSandbox {
    handle: VmHandle,
    vsock: VsockHandle,
    console: Console,
    exit: Arc<(Mutex<Option<VmExit>>, Condvar)>,
    boot_deadline: Instant,
}

fn vmm_err(what: &'static str) -> impl Fn(pvisor_vmm::vm::Error) -> WorkerError {
    move |e| WorkerError::Start(format!("{what}: {e}"))
}

fn add_virtio(b: &mut VmBuilder, events: &mut EventLoop, device: Box<dyn VirtioDevice>) -> Result<()> {
    let mem = GuestMemoryAtomic::new(b.memory().clone());
    let transport = MmioTransport::new(device, mem).map_err(|e| WorkerError::Start(format!("virtio-mmio: {e}")))?;
    events.add(&transport).map_err(|e| WorkerError::Start(format!("device loop: {e}")))?;
    let ioevents = transport
        .queue_evts()
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let fd = e.try_clone().map_err(|e| WorkerError::sys("eventfd", e))?;
            Ok(IoEventFd { addr: QUEUE_NOTIFY, datamatch: Some(i as u32), fd })
        })
        .collect::<Result<Vec<_>>>()?;
    let irq = transport.interrupt().irq_fd().try_clone().map_err(|e| WorkerError::sys("eventfd", e))?;
    b.add_virtio_mmio_device(Arc::new(Mutex::new(transport)), ioevents, &irq).map_err(vmm_err("virtio-mmio slot"))?;
    Ok(())
}

/// `net_end`: the device's end of the network link, when the sandbox has one.
pub fn start(vm: &VmConfig, hostname: &str, boot_timeout: Duration, net_end: Option<OwnedFd>) -> Result<KvmSandbox> {
    let root_disk = vm.root_disk.as_ref().ok_or_else(|| WorkerError::Config("vm: root_disk missing".into()))?;
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
    let mut b = VmBuilder::new(config).map_err(vmm_err("vm"))?;
    let mut events = EventLoop::new().map_err(|e| WorkerError::Start(format!("device loop: {e}")))?;
    // The image first, then the scratch disk: vda and vdb in the guest.
    add_virtio(&mut b, &mut events, Box::new(Block::new(disks::open_root(root_disk)?, disks::ROOT_ID)))?;
    add_virtio(&mut b, &mut events, Box::new(Block::new(disks::open_scratch(&vm.scratch_disk)?, disks::SCRATCH_ID)))?;
    let vsock = Vsock::new(u64::from(vm.guest_cid), None).map_err(|e| WorkerError::Start(format!("vsock: {e}")))?;
    let vsock_handle = vsock.handle();
    add_virtio(&mut b, &mut events, Box::new(vsock))?;
    let has_net = net_end.is_some();
    if let Some(end) = net_end {
        add_virtio(&mut b, &mut events, Box::new(net::device(end)?))?;
    }
    let open = |p: &str| std::fs::File::open(p).map_err(|e| WorkerError::sys(format!("open {p}"), e));
    let (mut kernel, mut initramfs) = (open(&vm.kernel)?, open(&vm.initramfs)?);
    b.load_pvh(&mut kernel, &cmdline(vm, hostname, has_net), Some(&mut initramfs)).map_err(vmm_err("boot"))?;
    let console = Console::from_shared(b.console());
    let machine = b.build().map_err(vmm_err("vcpus"))?;
    let handle = machine.handle();
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
    Ok(KvmSandbox { handle, vsock: vsock_handle, console, exit, boot_deadline: Instant::now() + boot_timeout })
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
}

//! virtio-mmio devices for the test guests, wired as the worker wires them: each transport in
//! the next window with one queue-notify ioeventfd per queue (datamatch = queue index) and its
//! interrupt eventfd as irqfd, all served by one device thread started with
//! [`EventLoop::spawn`] (under the `vmm_device` seccomp filter), while the vCPU runs under the
//! `vcpu` filter.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pvisor_vmm::devices::virtio::event_loop::EventLoop;
use pvisor_vmm::devices::virtio::mmio::{regs, MmioTransport};
use pvisor_vmm::devices::virtio::VirtioDevice;
use pvisor_vmm::{IoEventFd, VirtioMmioSlot, VmBuilder, VmExit};
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

use super::{config, require_kvm, Probe};

/// The report/parameter port of the virtio guests (`virtio_common.inc`: REPORT, PARAM).
pub const REPORT_PORT: u16 = 0x540;

/// How long a virtio guest may run before the harness stops it ([`VmExit::Stopped`]): a hang
/// guard for a device that never answers (the guests poll without a bound), not a timing
/// check; they take well under a second.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// What a virtio guest run left behind.
pub struct Run {
    pub exit: VmExit,
    pub console: String,
    /// The 32-bit values the guest reported, in order.
    pub reports: Vec<u32>,
    /// Guest memory, still mapped after the VM ended.
    pub memory: GuestMemoryMmap,
}

impl Run {
    /// `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.memory.read_slice(&mut buf, GuestAddress(addr)).expect("reading guest memory");
        buf
    }

    pub fn u16_at(&self, addr: u64) -> u16 {
        self.memory.read_obj(GuestAddress(addr)).expect("reading guest memory")
    }

    pub fn u32_at(&self, addr: u64) -> u32 {
        self.memory.read_obj(GuestAddress(addr)).expect("reading guest memory")
    }
}

/// Puts `device` behind a virtio-mmio transport in the next window of `builder` and serves
/// it from `event_loop`.
pub fn attach(builder: &mut VmBuilder, event_loop: &mut EventLoop, device: Box<dyn VirtioDevice>) -> VirtioMmioSlot {
    let mem = GuestMemoryAtomic::new(builder.memory().clone());
    let transport = MmioTransport::new(device, mem).expect("virtio-mmio transport");
    let ioeventfds = transport
        .queue_evts()
        .iter()
        .enumerate()
        .map(|(i, evt)| IoEventFd {
            addr: regs::QUEUE_NOTIFY,
            datamatch: Some(i as u32),
            fd: evt.try_clone().expect("cloning a queue eventfd"),
        })
        .collect();
    event_loop.add(&transport).expect("adding the transport to the event loop");
    let interrupt = transport.interrupt().clone();
    builder
        .add_virtio_mmio_device(Arc::new(Mutex::new(transport)), ioeventfds, interrupt.irq_fd())
        .expect("placing the virtio-mmio device")
}

/// Runs virtio guest `image` with the parameter `param` (read at PARAM) and the devices
/// `setup` attaches; the device thread runs under its seccomp filter and must end cleanly.
pub fn run(image: &[u8], param: u32, setup: impl FnOnce(&mut VmBuilder, &mut EventLoop)) -> Run {
    require_kvm();
    let mut builder = VmBuilder::new(config()).expect("building the VM");
    let mut event_loop = EventLoop::new().expect("event loop");
    setup(&mut builder, &mut event_loop);
    let probe = Probe::new(u64::from(param));
    builder.add_pio_device(REPORT_PORT, 8, probe.clone()).expect("report port");
    builder.load_flat(image).expect("loading the guest");
    let vm = builder.build().expect("configuring the vCPUs");
    let memory = vm.memory().clone();
    let console = vm.console();
    let device_thread = event_loop.spawn("virtio-dev").expect("starting the device thread");
    let handle = vm.handle();
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(HANG_GUARD) {
            eprintln!("hang guard: stopping the guest after {HANG_GUARD:?}");
            handle.stop();
        }
    });
    let exit = vm.run();
    drop(done);
    watchdog.join().expect("hang guard thread");
    drop(device_thread.stop().expect("the device thread ran and ended without an error"));
    let console = String::from_utf8_lossy(&console.lock().unwrap().contents()).into_owned();
    let reports = probe
        .lock()
        .unwrap()
        .writes
        .iter()
        .map(|(offset, data)| {
            assert_eq!((*offset, data.len()), (0, 4), "reports are 32-bit writes to REPORT");
            u32::from_le_bytes(data[..].try_into().unwrap())
        })
        .collect();
    Run { exit, console, reports, memory }
}

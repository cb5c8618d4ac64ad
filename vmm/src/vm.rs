//! Assembling a microVM and running it: [`VmBuilder`] → [`Vm::run`] → [`VmExit`].
//!
//! The builder opens `/dev/kvm`, creates the VM (irqchip, PIT), guest RAM from a memfd and its
//! memory slots, the serial console (IRQ 4 through an irqfd), the i8042 reset line and, for
//! tests, the debug exit port. The caller adds its own devices (virtio-mmio transports with
//! their ioeventfds and irqfd, test devices), loads a guest (flat or PVH), and builds; `run`
//! starts one thread per vCPU and blocks until the guest ends, fails, or [`VmHandle::stop`]
//! is called from another thread.

use std::fs::File;
use std::os::unix::thread::JoinHandleExt;
use std::sync::{Arc, Mutex};

use pvisor_seccomp::BpfProgram;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::boot::{self, pvh::PvhBoot, EntryState};
use crate::bus::{self, Bus, SharedDevice};
use crate::devices::console::{ConsoleLog, SharedConsole};
use crate::devices::{debug_exit, i8042, serial};
use crate::exit::{ExitLatch, VmExit};
use crate::kvm::{self, Hypervisor, IoEventAddress};
use crate::layout;
use crate::memory::{self, GuestRam};
use crate::vcpu::{self, VcpuThread};

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
    /// The device GSIs are used up.
    #[error("no interrupt line left for another device")]
    NoGsi,
}

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

/// A VM being assembled.
pub struct VmBuilder {
    _kvm: Hypervisor,
    vm: kvm::Vm,
    ram: GuestRam,
    pio: Bus,
    mmio: Bus,
    console: SharedConsole,
    exit: Arc<ExitLatch>,
    config: VmConfig,
    entry: Option<EntryState>,
    virtio: Vec<VirtioMmioSlot>,
    next_gsi: u32,
    next_mmio: u64,
    /// eventfds KVM holds references to; kept open for the VM's life.
    eventfds: Vec<EventFd>,
}

impl VmBuilder {
    /// Opens KVM and sets up the VM, its memory and the standard devices.
    pub fn new(mut config: VmConfig) -> Result<Self, Error> {
        if config.vcpus == 0 || config.vcpus == 255 {
            return Err(Error::Config("vcpus must be 1..=254"));
        }
        let kvm = Hypervisor::open()?;
        let mut vm = kvm.create_vm()?;
        let ram = GuestRam::new(config.memory_bytes)?;
        for (guest, size, host) in ram.regions() {
            // SAFETY: the mapping belongs to `ram`, which the Vm keeps (and drops after the VM
            // fd and every vCPU), and is never remapped.
            unsafe { vm.add_memory(guest, size, host)? };
        }

        let mut console = ConsoleLog::new(config.console_memory_cap);
        if let Some((file, cap)) = config.console_file.take() {
            console = console.with_file(file, cap);
        }
        let console = console.shared();
        let exit = Arc::new(ExitLatch::new());

        let mut builder = VmBuilder {
            _kvm: kvm,
            vm,
            ram,
            pio: Bus::new(),
            mmio: Bus::new(),
            console,
            exit,
            config,
            entry: None,
            virtio: Vec::new(),
            next_gsi: layout::GSI_DEVICES_START,
            next_mmio: layout::VIRTIO_MMIO_START,
            eventfds: Vec::new(),
        };

        let serial_irq = builder.new_eventfd()?;
        builder.vm.register_irqfd(&serial_irq, serial::COM1_GSI)?;
        let serial = serial::Serial::new(builder.console.clone(), serial_irq.try_clone().map_err(Error::EventFd)?);
        builder.eventfds.push(serial_irq);
        builder.pio.insert(serial::COM1_PORT, serial::COM1_LEN, Arc::new(Mutex::new(serial)))?;
        let i8042 = i8042::I8042::new(builder.exit.clone());
        builder.pio.insert(
            i8042::DATA_PORT,
            i8042::COMMAND_PORT - i8042::DATA_PORT + 1,
            Arc::new(Mutex::new(i8042)),
        )?;
        if builder.config.debug_exit {
            let dev = debug_exit::DebugExit::new(builder.exit.clone());
            builder.pio.insert(debug_exit::DEBUG_EXIT_PORT, 1, Arc::new(Mutex::new(dev)))?;
        }
        Ok(builder)
    }

    fn new_eventfd(&self) -> Result<EventFd, Error> {
        EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(Error::EventFd)
    }

    /// Guest memory, for loaders and devices.
    pub fn memory(&self) -> &GuestMemoryMmap {
        self.ram.memory()
    }

    /// Guest RAM and its memfd.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// The console log.
    pub fn console(&self) -> SharedConsole {
        self.console.clone()
    }

    /// The latch devices request the VM's end through.
    pub fn exit_latch(&self) -> Arc<ExitLatch> {
        self.exit.clone()
    }

    /// Puts a device on the port I/O bus.
    pub fn add_pio_device(&mut self, port: u16, len: u16, device: SharedDevice) -> Result<(), Error> {
        Ok(self.pio.insert(u64::from(port), u64::from(len), device)?)
    }

    /// Puts a device on the MMIO bus.
    pub fn add_mmio_device(&mut self, addr: u64, len: u64, device: SharedDevice) -> Result<(), Error> {
        Ok(self.mmio.insert(addr, len, device)?)
    }

    /// Reserves the next free device interrupt line.
    pub fn allocate_gsi(&mut self) -> Result<u32, Error> {
        if self.next_gsi >= layout::GSI_COUNT {
            return Err(Error::NoGsi);
        }
        self.next_gsi += 1;
        Ok(self.next_gsi - 1)
    }

    /// Has KVM raise `gsi` whenever `fd` is written.
    pub fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), Error> {
        Ok(self.vm.register_irqfd(fd, gsi)?)
    }

    /// Registers an ioeventfd.
    pub fn register_ioeventfd(&self, ioevent: &IoEventFd) -> Result<(), Error> {
        Ok(self.vm.register_ioevent(&ioevent.fd, IoEventAddress::Mmio(ioevent.addr), ioevent.datamatch)?)
    }

    /// Places a virtio-mmio transport in the next 4 KiB window with the next free GSI,
    /// registers its queue-notify `ioeventfds` (addresses relative to the window, e.g. 0x50)
    /// and its interrupt eventfd as an irqfd, and returns where it went (see
    /// [`VirtioMmioSlot::cmdline`] and [`VmBuilder::virtio_cmdline`]).
    pub fn add_virtio_mmio_device(
        &mut self,
        device: SharedDevice,
        ioeventfds: Vec<IoEventFd>,
        irq: &EventFd,
    ) -> Result<VirtioMmioSlot, Error> {
        let addr = self.next_mmio;
        if addr + layout::VIRTIO_MMIO_SIZE > layout::IOAPIC_START {
            return Err(Error::Config("no virtio-mmio window left"));
        }
        let gsi = self.allocate_gsi()?;
        self.mmio.insert(addr, layout::VIRTIO_MMIO_SIZE, device)?;
        for mut ioevent in ioeventfds {
            ioevent.addr += addr;
            self.register_ioeventfd(&ioevent)?;
            self.eventfds.push(ioevent.fd);
        }
        self.vm.register_irqfd(irq, gsi)?;
        self.next_mmio += layout::VIRTIO_MMIO_SIZE;
        let slot = VirtioMmioSlot { addr, gsi };
        self.virtio.push(slot);
        Ok(slot)
    }

    /// The command-line fragments of every virtio-mmio device added, space-separated.
    pub fn virtio_cmdline(&self) -> String {
        self.virtio.iter().map(VirtioMmioSlot::cmdline).collect::<Vec<_>>().join(" ")
    }

    /// Loads a flat test guest at 1 MiB, entered in long mode.
    pub fn load_flat(&mut self, image: &[u8]) -> Result<(), Error> {
        self.entry = Some(boot::flat::load(self.ram.memory(), image)?);
        Ok(())
    }

    /// Loads a `vmlinux` for PVH boot with `cmdline` (to which the virtio-mmio fragments are
    /// appended) and an optional initramfs.
    pub fn load_pvh(
        &mut self,
        kernel: &mut File,
        cmdline: &str,
        initramfs: Option<&mut File>,
    ) -> Result<PvhBoot, Error> {
        let mut full = cmdline.to_owned();
        let virtio = self.virtio_cmdline();
        if !virtio.is_empty() {
            full.push(' ');
            full.push_str(&virtio);
        }
        let boot = boot::pvh::load(self.ram.memory(), self.ram.size(), self.config.vcpus, kernel, &full, initramfs)?;
        self.entry = Some(boot.entry);
        Ok(boot)
    }

    /// Creates and configures the vCPUs; the VM is ready to [`run`](Vm::run).
    pub fn build(self) -> Result<Vm, Error> {
        let entry = self.entry.ok_or(Error::NoGuest)?;
        vcpu::install_kick_handler().map_err(Error::KickHandler)?;
        let filter = if self.config.vcpu_seccomp { Some(Arc::new(pvisor_seccomp::vcpu_filter()?)) } else { None };
        let msrs = kvm::msr::boot_msrs(self.vm.supported_msrs());
        let mut vcpus = Vec::with_capacity(usize::from(self.config.vcpus));
        for id in 0..self.config.vcpus {
            let vcpu = self.vm.create_vcpu(id, self.config.vcpus)?;
            vcpu.set_msrs(&msrs)?;
            vcpu.set_fpu_defaults()?;
            vcpu.set_lint()?;
            if id == 0 {
                entry.apply(&vcpu)?;
            }
            vcpus.push(vcpu);
        }
        Ok(Vm {
            vcpus,
            pio: Arc::new(self.pio),
            mmio: Arc::new(self.mmio),
            console: self.console,
            exit: self.exit,
            filter,
            threads: Arc::new(Mutex::new(Vec::new())),
            _eventfds: self.eventfds,
            _vm: self.vm,
            _ram: self.ram,
            _kvm: self._kvm,
        })
    }
}

/// A built VM. Fields drop in order: vCPUs, then the VM, then guest RAM.
pub struct Vm {
    vcpus: Vec<kvm::Vcpu>,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    console: SharedConsole,
    exit: Arc<ExitLatch>,
    filter: Option<Arc<BpfProgram>>,
    threads: Arc<Mutex<Vec<libc::pthread_t>>>,
    _eventfds: Vec<EventFd>,
    _vm: kvm::Vm,
    _ram: GuestRam,
    _kvm: Hypervisor,
}

/// Stops a running VM from another thread.
#[derive(Clone)]
pub struct VmHandle {
    exit: Arc<ExitLatch>,
    threads: Arc<Mutex<Vec<libc::pthread_t>>>,
}

impl VmHandle {
    /// Ends the VM as [`VmExit::Stopped`] (unless it already ended otherwise) and kicks its
    /// vCPUs out of the guest. Returns at once; `run` returns once the vCPUs have left.
    pub fn stop(&self) {
        self.exit.request(VmExit::Stopped);
        kick_all(&self.threads);
    }
}

fn kick_all(threads: &Mutex<Vec<libc::pthread_t>>) {
    for thread in threads.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        vcpu::kick(*thread);
    }
}

impl Vm {
    /// A handle to stop the VM from another thread.
    pub fn handle(&self) -> VmHandle {
        VmHandle { exit: self.exit.clone(), threads: self.threads.clone() }
    }

    /// The console log.
    pub fn console(&self) -> SharedConsole {
        self.console.clone()
    }

    /// Guest memory (clone it for a device thread: the regions are shared, not copied).
    pub fn memory(&self) -> &GuestMemoryMmap {
        self._ram.memory()
    }

    /// Runs the guest until it ends; everything the VM held is released on return.
    pub fn run(mut self) -> VmExit {
        let mut handles = Vec::new();
        for vcpu in self.vcpus.drain(..) {
            let id = vcpu.id();
            let body = VcpuThread {
                vcpu,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                exit: self.exit.clone(),
                filter: self.filter.clone(),
            };
            let spawned = std::thread::Builder::new().name(format!("vcpu{id}")).spawn(move || body.run());
            match spawned {
                Ok(handle) => {
                    self.threads.lock().unwrap_or_else(|p| p.into_inner()).push(handle.as_pthread_t());
                    handles.push(handle);
                }
                Err(e) => {
                    self.exit.request(VmExit::Failed {
                        reason: format!("starting vCPU {id}: {e}"),
                        console_tail: String::new(),
                    });
                    break;
                }
            }
        }
        let exit = self.exit.wait();
        // Take the thread ids out before joining, so that a late `VmHandle::stop` cannot
        // signal a thread that has been joined (its id may be reused); every vCPU gets its
        // kick here, after the latch is set.
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            vcpu::kick(thread);
        }
        let mut panicked = false;
        for handle in handles {
            // The vCPU comes back to be closed here, outside its thread's filter.
            panicked |= handle.join().is_err();
        }
        let tail = || self.console.lock().unwrap_or_else(|p| p.into_inner()).tail(20);
        match exit {
            VmExit::Failed { reason, .. } => VmExit::Failed { reason, console_tail: tail() },
            _ if panicked => VmExit::Failed { reason: "a vCPU thread panicked".into(), console_tail: tail() },
            other => other,
        }
    }
}

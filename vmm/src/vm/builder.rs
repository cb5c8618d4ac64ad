//! [`VmBuilder`]: opens KVM, creates the VM, its memory and standard devices, takes the
//! caller's devices and guest, and configures the vCPUs.

use std::fs::File;
use std::sync::{Arc, Mutex};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::{Error, IoEventFd, VirtioMmioSlot, Vm, VmConfig};
use crate::boot::{self, pvh::PvhBoot, EntryState};
use crate::bus::{Bus, SharedDevice};
use crate::devices::clone_id::{self, CloneId};
use crate::devices::console::{ConsoleLog, SharedConsole};
use crate::devices::serial::UartState;
use crate::devices::virtio::mmio::{regs, MmioTransport, SharedTransport};
use crate::devices::{debug_exit, i8042, serial};
use crate::exit::ExitLatch;
use crate::kvm::{self, Hypervisor, IoEventAddress};
use crate::layout;
use crate::memory::GuestRam;
use crate::vcpu;

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
    serial: Arc<Mutex<serial::Serial>>,
    clone_id: Arc<Mutex<CloneId>>,
    /// Why this VM cannot be snapshotted (a device added whose state the VMM cannot save).
    unsnapshottable: Option<&'static str>,
    /// Virtio transports a snapshot saves, in placement order.
    transports: Vec<(VirtioMmioSlot, SharedTransport)>,
    /// The vCPU states of a restore (instead of a loaded guest's entry state).
    restored: Option<Vec<crate::kvm::state::VcpuState>>,
}

/// Where the standard devices of a VM start from: power-on, or a snapshot.
pub(crate) struct DeviceStart<'a> {
    /// The UART's saved registers.
    pub serial: Option<&'a UartState>,
    /// The clone-identity generation.
    pub generation: u64,
}

impl VmBuilder {
    /// Opens KVM and sets up the VM, its memory and the standard devices.
    pub fn new(config: VmConfig) -> Result<Self, Error> {
        if config.vcpus == 0 || config.vcpus == 255 {
            return Err(Error::Config("vcpus must be 1..=254"));
        }
        let kvm = Hypervisor::open()?;
        let vm = kvm.create_vm()?;
        let ram = if config.mergeable {
            GuestRam::anonymous(config.memory_bytes)?
        } else {
            GuestRam::new(config.memory_bytes)?
        };
        Self::assemble(config, kvm, vm, ram, DeviceStart { serial: None, generation: 0 })
    }

    /// Maps `ram` into `vm` and puts the standard devices on the buses, from `start`.
    pub(crate) fn assemble(
        mut config: VmConfig,
        kvm: Hypervisor,
        mut vm: kvm::Vm,
        ram: GuestRam,
        start: DeviceStart<'_>,
    ) -> Result<Self, Error> {
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

        let serial_irq = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(Error::EventFd)?;
        vm.register_irqfd(&serial_irq, serial::COM1_GSI)?;
        let irq = serial_irq.try_clone().map_err(Error::EventFd)?;
        let serial = match start.serial {
            None => serial::Serial::new(console.clone(), irq),
            Some(state) => serial::Serial::from_state(console.clone(), irq, state).map_err(Error::SerialState)?,
        };
        let serial = Arc::new(Mutex::new(serial));
        let clone_id = Arc::new(Mutex::new(CloneId::new(start.generation)?));

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
            eventfds: vec![serial_irq],
            serial: serial.clone(),
            clone_id: clone_id.clone(),
            unsnapshottable: None,
            transports: Vec::new(),
            restored: None,
        };
        builder.pio.insert(serial::COM1_PORT, serial::COM1_LEN, serial)?;
        builder.mmio.insert(layout::CLONE_ID_START, clone_id::WINDOW_LEN, clone_id)?;
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

    /// Has `build` create the vCPUs from a snapshot's states instead of a loaded guest.
    pub(crate) fn set_restored_vcpus(&mut self, vcpus: Vec<crate::kvm::state::VcpuState>) {
        self.restored = Some(vcpus);
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

    /// Puts a device on the port I/O bus. Its state is the caller's: the VM can no longer be
    /// snapshotted.
    pub fn add_pio_device(&mut self, port: u16, len: u16, device: SharedDevice) -> Result<(), Error> {
        self.unsnapshottable = Some("a device added with add_pio_device");
        Ok(self.pio.insert(u64::from(port), u64::from(len), device)?)
    }

    /// Puts a device on the MMIO bus. Its state is the caller's: the VM can no longer be
    /// snapshotted.
    pub fn add_mmio_device(&mut self, addr: u64, len: u64, device: SharedDevice) -> Result<(), Error> {
        self.unsnapshottable = Some("a device added with add_mmio_device");
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
    ///
    /// The device is opaque here, so the VM can no longer be snapshotted; a transport added with
    /// [`add_virtio_transport`](Self::add_virtio_transport) can be.
    pub fn add_virtio_mmio_device(
        &mut self,
        device: SharedDevice,
        ioeventfds: Vec<IoEventFd>,
        irq: &EventFd,
    ) -> Result<VirtioMmioSlot, Error> {
        self.unsnapshottable = Some("a virtio-mmio device added as an opaque bus device");
        self.place_virtio(device, ioeventfds, irq)
    }

    /// Places a virtio-mmio `transport` as [`add_virtio_mmio_device`](Self::add_virtio_mmio_device)
    /// does (its queue eventfds as ioeventfds on QueueNotify, its interrupt as the irqfd) and
    /// keeps it for snapshots. Add it to the device thread's event loop before. Returns where it
    /// went and the shared transport.
    pub fn add_virtio_transport(
        &mut self,
        transport: MmioTransport,
    ) -> Result<(VirtioMmioSlot, SharedTransport), Error> {
        let ioeventfds = transport
            .queue_evts()
            .iter()
            .enumerate()
            .map(|(i, evt)| {
                let fd = evt.try_clone().map_err(Error::EventFd)?;
                Ok(IoEventFd { addr: regs::QUEUE_NOTIFY, datamatch: Some(i as u32), fd })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let irq = transport.interrupt().irq_fd().try_clone().map_err(Error::EventFd)?;
        let transport = Arc::new(Mutex::new(transport));
        let slot = self.place_virtio(transport.clone(), ioeventfds, &irq)?;
        self.eventfds.push(irq);
        self.transports.push((slot, transport.clone()));
        Ok((slot, transport))
    }

    fn place_virtio(
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
        vcpu::install_kick_handler().map_err(Error::KickHandler)?;
        let filter = if self.config.vcpu_seccomp { Some(Arc::new(pvisor_seccomp::vcpu_filter()?)) } else { None };
        let mut vcpus = Vec::with_capacity(usize::from(self.config.vcpus));
        let mut refused_msrs = Vec::new();
        if let Some(states) = &self.restored {
            for state in states {
                let (vcpu, refused) = self.vm.restore_vcpu(state)?;
                refused_msrs.extend(refused);
                vcpus.push(vcpu);
            }
        } else {
            let entry = self.entry.ok_or(Error::NoGuest)?;
            let msrs = kvm::msr::boot_msrs(self.vm.supported_msrs());
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
        }
        Ok(Vm {
            vcpus,
            pio: Arc::new(self.pio),
            mmio: Arc::new(self.mmio),
            console: self.console,
            exit: self.exit,
            filter,
            threads: Arc::new(Mutex::new(Vec::new())),
            pause: Arc::default(),
            _eventfds: self.eventfds,
            serial: self.serial,
            clone_id: self.clone_id,
            unsnapshottable: self.unsnapshottable,
            transports: self.transports,
            debug_exit: self.config.debug_exit,
            refused_msrs,
            vm: Arc::new(self.vm),
            ram: self.ram,
            _kvm: self._kvm,
        })
    }
}

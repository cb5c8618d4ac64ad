//! A KVM vCPU: register state, `KVM_RUN` and its exits.

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_run, kvm_sregs, CpuId, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd};

use super::Error;

/// Why `KVM_RUN` returned, with the data of port and MMIO accesses borrowed from `kvm_run`.
#[derive(Debug)]
pub enum Exit<'a> {
    /// The guest read `data.len()` bytes from `port`; fill `data`.
    IoIn {
        /// The port.
        port: u16,
        /// Where the value goes.
        data: &'a mut [u8],
    },
    /// The guest wrote `data` to `port`.
    IoOut {
        /// The port.
        port: u16,
        /// The value.
        data: &'a [u8],
    },
    /// The guest read `data.len()` bytes at `addr` (no memory slot there); fill `data`.
    MmioRead {
        /// Guest-physical address.
        addr: u64,
        /// Where the value goes.
        data: &'a mut [u8],
    },
    /// The guest wrote `data` at `addr`.
    MmioWrite {
        /// Guest-physical address.
        addr: u64,
        /// The value.
        data: &'a [u8],
    },
    /// `hlt` with no in-kernel irqchip to wait on interrupts.
    Hlt,
    /// Triple fault (or a shutdown KVM could not handle): the guest ends, as with `reboot=t`.
    Shutdown,
    /// A system event (`KVM_SYSTEM_EVENT_*`), e.g. a PSCI-style shutdown or reset.
    SystemEvent(u32),
    /// `KVM_RUN` returned `EINTR` or `EAGAIN`: a signal (a kick) or `immediate_exit`.
    Interrupted,
    /// KVM could not handle the guest (e.g. an instruction its emulator does not know).
    InternalError {
        /// `kvm_run.internal.suberror`.
        suberror: u32,
    },
    /// The CPU refused to enter the guest.
    FailEntry {
        /// Hardware entry failure reason.
        reason: u64,
    },
    /// Any other exit, by name.
    Other(&'static str),
}

/// A vCPU.
pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
}

fn ioctl(name: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Ioctl(name, e.into())
}

impl Vcpu {
    pub(super) fn new(fd: VcpuFd, id: u8) -> Self {
        Vcpu { fd, id }
    }

    /// The vCPU's id (and APIC id).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The vCPU fd (for [`super::Vm::vcpu_view`]).
    pub(super) fn raw_fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// `KVM_SET_CPUID2`.
    pub fn set_cpuid(&self, cpuid: &CpuId) -> Result<(), Error> {
        self.fd.set_cpuid2(cpuid).map_err(ioctl("KVM_SET_CPUID2"))
    }

    /// `KVM_SET_MSRS` with `(index, value)` pairs; all must be accepted.
    pub fn set_msrs(&self, msrs: &[(u32, u64)]) -> Result<(), Error> {
        let entries: Vec<kvm_msr_entry> =
            msrs.iter().map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
        let table = Msrs::from_entries(&entries).map_err(|_| Error::Table("MSR"))?;
        let set = self.fd.set_msrs(&table).map_err(ioctl("KVM_SET_MSRS"))?;
        if set != entries.len() {
            return Err(Error::PartialMsrs { set, wanted: entries.len() });
        }
        Ok(())
    }

    /// The x87/SSE state at reset: control word 0x37f, MXCSR 0x1f80 (all exceptions masked).
    pub fn set_fpu_defaults(&self) -> Result<(), Error> {
        let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
        self.fd.set_fpu(&fpu).map_err(ioctl("KVM_SET_FPU"))
    }

    /// Wires the local APIC's LINT0 to ExtINT (the PIC) and LINT1 to NMI, as firmware would.
    pub fn set_lint(&self) -> Result<(), Error> {
        const APIC_LVT0: usize = 0x350;
        const APIC_LVT1: usize = 0x360;
        const MODE_EXTINT: u32 = 0x7;
        const MODE_NMI: u32 = 0x4;
        let mut lapic = self.fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?;
        for (offset, mode) in [(APIC_LVT0, MODE_EXTINT), (APIC_LVT1, MODE_NMI)] {
            let mut bytes = [0u8; 4];
            for (b, r) in bytes.iter_mut().zip(&lapic.regs[offset..offset + 4]) {
                *b = *r as u8;
            }
            let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
            for (r, b) in lapic.regs[offset..offset + 4].iter_mut().zip(value.to_le_bytes()) {
                *r = b as _;
            }
        }
        self.fd.set_lapic(&lapic).map_err(ioctl("KVM_SET_LAPIC"))
    }

    /// `KVM_SET_REGS`.
    pub fn set_regs(&self, regs: &kvm_regs) -> Result<(), Error> {
        self.fd.set_regs(regs).map_err(ioctl("KVM_SET_REGS"))
    }

    /// `KVM_GET_SREGS`.
    pub fn sregs(&self) -> Result<kvm_sregs, Error> {
        self.fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))
    }

    /// `KVM_SET_SREGS`.
    pub fn set_sregs(&self, sregs: &kvm_sregs) -> Result<(), Error> {
        self.fd.set_sregs(sregs).map_err(ioctl("KVM_SET_SREGS"))
    }

    /// The registers as one line, for failure reports.
    pub fn dump_registers(&self) -> String {
        let regs = match self.fd.get_regs() {
            Ok(r) => r,
            Err(e) => return format!("registers unavailable: {e}"),
        };
        let mut out = format!(
            "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x}",
            regs.rip, regs.rsp, regs.rflags, regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi, regs.rbp
        );
        if let Ok(s) = self.fd.get_sregs() {
            out.push_str(&format!(
                " cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} cs={:#x}",
                s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.cs.selector
            ));
        }
        out
    }

    /// The `kvm_run` area, for a signal handler that sets `immediate_exit` (see
    /// [`crate::vcpu`]). Valid for as long as this `Vcpu` lives.
    pub fn run_area(&mut self) -> *mut kvm_run {
        self.fd.get_kvm_run() as *mut kvm_run
    }

    /// Clears `immediate_exit` after a kick that did not mean "stop".
    pub fn clear_immediate_exit(&mut self) {
        self.fd.set_kvm_immediate_exit(0);
    }

    /// Completes an I/O or MMIO exit the VMM has handled but KVM has not yet finished (a port
    /// read's value is only in `kvm_run` until the next `KVM_RUN`): enters `KVM_RUN` with
    /// `immediate_exit` set, which finishes the instruction and returns at once. Called before
    /// a vCPU parks for a pause, so a snapshot taken while it is parked is consistent (the KVM
    /// API's advice before saving state).
    pub fn complete_pending_io(&mut self) -> Result<(), Error> {
        self.fd.set_kvm_immediate_exit(1);
        let result = self.fd.run().map(|_| ());
        self.fd.set_kvm_immediate_exit(0);
        match result {
            Err(e) if e.errno() != libc::EINTR && e.errno() != libc::EAGAIN => Err(Error::Ioctl("KVM_RUN", e.into())),
            _ => Ok(()),
        }
    }

    /// Puts a snapshot's state into this (freshly created) vCPU; returns the MSRs KVM refused.
    pub fn restore_state(&self, state: &super::state::VcpuState) -> Result<Vec<u32>, Error> {
        super::state::restore_vcpu(&self.fd, state)
    }

    /// `KVM_RUN` until the next exit.
    pub fn run(&mut self) -> Result<Exit<'_>, Error> {
        // Taken before KVM_RUN borrows the vCPU for the exit's lifetime; read only for an
        // internal error, whose data the returned exit does not borrow.
        let area: *const kvm_run = self.fd.get_kvm_run();
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => return Ok(Exit::Interrupted),
            Err(e) => return Err(Error::Ioctl("KVM_RUN", e.into())),
        };
        Ok(match exit {
            VcpuExit::IoIn(port, data) => Exit::IoIn { port, data },
            VcpuExit::IoOut(port, data) => Exit::IoOut { port, data },
            VcpuExit::MmioRead(addr, data) => Exit::MmioRead { addr, data },
            VcpuExit::MmioWrite(addr, data) => Exit::MmioWrite { addr, data },
            VcpuExit::Hlt => Exit::Hlt,
            VcpuExit::Shutdown => Exit::Shutdown,
            VcpuExit::SystemEvent(kind, _) => Exit::SystemEvent(kind),
            VcpuExit::Intr => Exit::Interrupted,
            VcpuExit::InternalError => {
                // SAFETY: `area` is this vCPU's kvm_run mapping, alive as long as `self.fd`;
                // the exit reason is KVM_EXIT_INTERNAL_ERROR, for which the kernel fills the
                // `internal` member of the union; a plain read of a u32.
                let suberror = unsafe { (*area).__bindgen_anon_1.internal.suberror };
                Exit::InternalError { suberror }
            }
            VcpuExit::FailEntry(reason, _cpu) => Exit::FailEntry { reason },
            VcpuExit::Exception => Exit::Other("exception"),
            VcpuExit::Unknown => Exit::Other("unknown"),
            VcpuExit::IrqWindowOpen => Exit::Other("irq window open"),
            VcpuExit::Debug(_) => Exit::Other("debug"),
            VcpuExit::Hypercall(_) => Exit::Other("hypercall"),
            VcpuExit::IoapicEoi(_) => Exit::Other("ioapic eoi"),
            _ => Exit::Other("unsupported"),
        })
    }
}

/// A second fd of a vCPU, for reading its state from another thread while the vCPU's own
/// thread is parked (see [`super::state`]).
pub struct VcpuView {
    fd: VcpuFd,
    id: u8,
    msrs: Vec<u32>,
}

impl VcpuView {
    pub(super) fn new(fd: VcpuFd, id: u8, msrs: Vec<u32>) -> Self {
        VcpuView { fd, id, msrs }
    }

    /// Captures the vCPU's state. The vCPU must not be inside `KVM_RUN` (parked, or not yet
    /// started); KVM would otherwise block this call until it leaves.
    pub fn save_state(&self) -> Result<super::state::VcpuState, Error> {
        super::state::save_vcpu(&self.fd, self.id, &self.msrs)
    }
}

#[cfg(test)]
mod tests {
    use kvm_bindings::{kvm_regs, kvm_sregs, KVMIO};
    use vmm_sys_util::ioctl::{ioctl_expr, _IOC_NONE, _IOC_READ};

    /// The seccomp crate pins vCPU ioctls by number; they must be the ones kvm-ioctls issues.
    #[test]
    fn seccomp_knows_the_vcpu_ioctl_numbers() {
        let io = |nr, dir, size| u64::from(ioctl_expr(dir, KVMIO, nr, size) as u32);
        assert_eq!(pvisor_seccomp::vmm::KVM_RUN, io(0x80, _IOC_NONE, 0));
        assert_eq!(pvisor_seccomp::vmm::KVM_GET_REGS, io(0x81, _IOC_READ, std::mem::size_of::<kvm_regs>() as u32));
        assert_eq!(pvisor_seccomp::vmm::KVM_GET_SREGS, io(0x83, _IOC_READ, std::mem::size_of::<kvm_sregs>() as u32));
    }
}

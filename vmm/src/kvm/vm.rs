//! A KVM VM: in-kernel irqchip and PIT, memory slots, irqfds and ioeventfds, vCPU creation.

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

use super::state::{self, VcpuState, VmState};
use super::vcpu::VcpuView;
use super::{Error, Vcpu};
use crate::layout;

/// Where an ioeventfd listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEventAddress {
    /// A port.
    Pio(u64),
    /// A guest-physical address.
    Mmio(u64),
}

/// A KVM VM.
pub struct Vm {
    fd: VmFd,
    cpuid: CpuId,
    msrs: Vec<u32>,
    next_slot: u32,
}

fn ioctl(name: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Ioctl(name, e.into())
}

impl Vm {
    /// Sets up a fresh VM: the TSS and identity-map pages KVM needs on Intel (inside the MMIO
    /// gap, never RAM), the in-kernel irqchip (PIC, IOAPIC, local APICs) and the PIT with a
    /// dummy speaker port. `cpuid` and `msrs` are what the host KVM supports.
    pub(super) fn new(fd: VmFd, cpuid: CpuId, msrs: Vec<u32>) -> Result<Self, Error> {
        fd.set_tss_address(layout::KVM_TSS_ADDRESS as usize).map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        fd.set_identity_map_address(layout::KVM_IDENTITY_MAP_ADDRESS).map_err(ioctl("KVM_SET_IDENTITY_MAP_ADDR"))?;
        fd.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        fd.create_pit2(pit).map_err(ioctl("KVM_CREATE_PIT2"))?;
        Ok(Vm { fd, cpuid, msrs, next_slot: 0 })
    }

    /// Maps `size` bytes of the VMM's memory at `host` into the guest at `guest`, as the next
    /// memory slot.
    ///
    /// # Safety
    ///
    /// `host..host + size` must be a mapping that stays valid (and is not remapped) for as long
    /// as the VM exists: the guest reads and writes it at any time.
    pub unsafe fn add_memory(&mut self, guest: u64, size: u64, host: u64) -> Result<(), Error> {
        let region = kvm_userspace_memory_region {
            slot: self.next_slot,
            flags: 0,
            guest_phys_addr: guest,
            memory_size: size,
            userspace_addr: host,
        };
        // SAFETY: the caller guarantees the host range outlives the VM.
        unsafe { self.fd.set_user_memory_region(region) }.map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        self.next_slot += 1;
        Ok(())
    }

    /// Has KVM inject an edge on `gsi` each time `fd` is written.
    pub fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), Error> {
        self.fd.register_irqfd(fd, gsi).map_err(ioctl("KVM_IRQFD"))
    }

    /// Has KVM signal `fd` (instead of exiting to the VMM) when the guest writes `addr`, with
    /// `datamatch` the 32-bit value to match or any value if `None`.
    pub fn register_ioevent(&self, fd: &EventFd, addr: IoEventAddress, datamatch: Option<u32>) -> Result<(), Error> {
        let addr = match addr {
            IoEventAddress::Pio(a) => kvm_ioctls::IoEventAddress::Pio(a),
            IoEventAddress::Mmio(a) => kvm_ioctls::IoEventAddress::Mmio(a),
        };
        match datamatch {
            Some(value) => self.fd.register_ioevent(fd, &addr, value),
            None => self.fd.register_ioevent(fd, &addr, NoDatamatch),
        }
        .map_err(ioctl("KVM_IOEVENTFD"))
    }

    /// Raises or lowers an interrupt line (for level-triggered sources without an irqfd).
    pub fn set_irq_line(&self, gsi: u32, high: bool) -> Result<(), Error> {
        self.fd.set_irq_line(gsi, high).map_err(ioctl("KVM_IRQ_LINE"))
    }

    /// Creates vCPU `id` (its APIC id) and gives it its CPUID table (`count` vCPUs in all).
    pub fn create_vcpu(&self, id: u8, count: u8) -> Result<Vcpu, Error> {
        let fd = self.fd.create_vcpu(u64::from(id)).map_err(ioctl("KVM_CREATE_VCPU"))?;
        let vcpu = Vcpu::new(fd, id);
        vcpu.set_cpuid(&super::cpuid::for_vcpu(&self.cpuid, id, count)?)?;
        Ok(vcpu)
    }

    /// Creates vCPU `id` with a snapshot's `state` (its own CPUID table included); returns it
    /// and the MSRs KVM refused to set.
    pub fn restore_vcpu(&self, state: &VcpuState) -> Result<(Vcpu, Vec<u32>), Error> {
        let fd = self.fd.create_vcpu(u64::from(state.id)).map_err(ioctl("KVM_CREATE_VCPU"))?;
        let vcpu = Vcpu::new(fd, state.id);
        let refused = vcpu.restore_state(state)?;
        Ok((vcpu, refused))
    }

    /// A second fd of `vcpu` for reading its state from another thread.
    pub fn vcpu_view(&self, vcpu: &Vcpu) -> Result<VcpuView, Error> {
        use std::os::fd::AsRawFd;
        // SAFETY: dup of an fd this process owns (the vCPU's, alive for the call); the result
        // is checked before use.
        let raw = unsafe { libc::dup(vcpu.raw_fd().as_raw_fd()) };
        if raw < 0 {
            return Err(Error::Ioctl("dup of a vCPU fd", std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh fd of a vCPU of this VM, owned by nothing else; the VcpuFd
        // built from it takes ownership (closes it and unmaps its kvm_run on drop).
        let fd = unsafe { self.fd.create_vcpu_from_rawfd(raw) }.map_err(ioctl("mmap of a vCPU's kvm_run"))?;
        Ok(VcpuView::new(fd, vcpu.id(), self.msrs.clone()))
    }

    /// Captures the irqchip, PIT and clock (every vCPU parked).
    pub fn save_state(&self) -> Result<VmState, Error> {
        state::save_vm(&self.fd)
    }

    /// Puts a snapshot's irqchip, PIT and clock into this fresh VM.
    pub fn restore_state(&self, state: &VmState) -> Result<(), Error> {
        state::restore_vm(&self.fd, state)
    }

    /// `KVM_GET_CLOCK`: kvmclock now (`None` where KVM refuses it).
    pub fn clock(&self) -> Option<kvm_bindings::kvm_clock_data> {
        self.fd.get_clock().ok()
    }

    /// The MSRs KVM reports (`KVM_GET_MSR_INDEX_LIST`).
    pub fn supported_msrs(&self) -> &[u32] {
        &self.msrs
    }
}

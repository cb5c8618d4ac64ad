//! The one place that talks to KVM (through `kvm-ioctls`): the system fd, a VM, its vCPUs.
//!
//! Concrete types rather than a trait, in the spirit of Cloud Hypervisor's `hypervisor` crate
//! boundary: the rest of the VMM sees [`Hypervisor`], [`Vm`] and [`Vcpu`] and the exits of
//! [`Exit`], never a `kvm_ioctls` type, so a second hypervisor (or a mock) would slot in here.
//!
//! * [`vm`]: VM creation with the in-kernel irqchip and PIT, memory slots, irqfd, ioeventfd.
//! * [`vcpu`]: register state, `KVM_RUN` and its exits.
//! * [`cpuid`]: the CPUID table a vCPU gets (KVM's supported leaves, per-vCPU APIC ids).
//! * [`msr`]: the boot MSRs, restricted to those KVM reports.
//! * [`state`]: saving and restoring vCPU and VM state for snapshots.

pub mod cpuid;
mod error;
pub mod msr;
pub mod state;
pub mod vcpu;
pub mod vm;

pub use error::Error;
pub use vcpu::{Exit, Vcpu, VcpuView};
pub use vm::{IoEventAddress, Vm};

use kvm_bindings::{CpuId, KVM_API_VERSION, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

/// An open `/dev/kvm`.
pub struct Hypervisor {
    kvm: Kvm,
}

impl Hypervisor {
    /// Opens `/dev/kvm` (close-on-exec) and checks the API version.
    pub fn open() -> Result<Self, Error> {
        let kvm = Kvm::new().map_err(|e| Error::Open(e.into()))?;
        let version = kvm.get_api_version();
        if version != KVM_API_VERSION as i32 {
            return Err(Error::ApiVersion(version));
        }
        Ok(Hypervisor { kvm })
    }

    /// Creates a VM with an in-kernel irqchip and PIT, KVM's TSS and identity-map pages set.
    pub fn create_vm(&self) -> Result<Vm, Error> {
        let fd = self.kvm.create_vm().map_err(|e| Error::Ioctl("KVM_CREATE_VM", e.into()))?;
        let cpuid = self.supported_cpuid()?;
        let msrs = self.msr_index_list()?;
        Vm::new(fd, cpuid, msrs)
    }

    /// `KVM_GET_SUPPORTED_CPUID`.
    pub fn supported_cpuid(&self) -> Result<CpuId, Error> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| Error::Ioctl("KVM_GET_SUPPORTED_CPUID", e.into()))
    }

    /// `KVM_GET_MSR_INDEX_LIST`: the MSRs this KVM lets a VMM save and restore.
    pub fn msr_index_list(&self) -> Result<Vec<u32>, Error> {
        let list = self.kvm.get_msr_index_list().map_err(|e| Error::Ioctl("KVM_GET_MSR_INDEX_LIST", e.into()))?;
        Ok(list.as_slice().to_vec())
    }
}

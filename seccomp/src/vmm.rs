//! The VMM's per-thread filters (vm backend): `vcpu` and `vmm_device`.
//!
//! A vm-backend worker runs three kinds of threads, each jailed by its own filter before it
//! touches guest data: the vCPUs ([`vcpu_filter`], installed by each vCPU thread before its
//! first `KVM_RUN`), the device event loop ([`vmm_device_filter`]), and the gRPC server (the
//! worker filter). Both filters here are allow lists that kill the process on anything else;
//! memory never becomes executable (`mmap`/`mprotect` with `PROT_EXEC` are killed) and the
//! vCPU's `ioctl` is pinned to `KVM_RUN`, `KVM_GET_REGS` and `KVM_GET_SREGS`.
//!
//! Install each on its own thread with [`apply_to_thread`](crate::apply_to_thread); threads
//! a filtered thread creates inherit it.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

pub use crate::rules::vmm_rules::{KVM_GET_REGS, KVM_GET_SREGS, KVM_RUN, VCPU_IOCTLS};

/// Compiles the vCPU thread filter.
pub fn vcpu_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::Vcpu, rules(FilterKind::Vcpu))
}

/// Compiles the device event loop filter.
pub fn vmm_device_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::VmmDevice, rules(FilterKind::VmmDevice))
}

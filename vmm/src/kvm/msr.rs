//! Boot MSRs, restricted to the ones KVM reports.
//!
//! QEMU here aborts because it sets MSR 0x10a (`IA32_ARCH_CAPABILITIES`), which this KVM (PVM)
//! refuses; so the VMM only sets an MSR that `KVM_GET_MSR_INDEX_LIST` lists and drops the rest.

/// `IA32_SYSENTER_CS`.
pub const IA32_SYSENTER_CS: u32 = 0x174;
/// `IA32_SYSENTER_ESP`.
pub const IA32_SYSENTER_ESP: u32 = 0x175;
/// `IA32_SYSENTER_EIP`.
pub const IA32_SYSENTER_EIP: u32 = 0x176;
/// `IA32_MISC_ENABLE`.
pub const IA32_MISC_ENABLE: u32 = 0x1a0;
/// `IA32_MTRR_DEF_TYPE`.
pub const IA32_MTRR_DEF_TYPE: u32 = 0x2ff;
/// `IA32_STAR`.
pub const STAR: u32 = 0xc000_0081;
/// `IA32_LSTAR`.
pub const LSTAR: u32 = 0xc000_0082;
/// `IA32_CSTAR`.
pub const CSTAR: u32 = 0xc000_0083;
/// `IA32_FMASK`.
pub const SYSCALL_MASK: u32 = 0xc000_0084;
/// `IA32_KERNEL_GS_BASE`.
pub const KERNEL_GS_BASE: u32 = 0xc000_0102;
/// `IA32_TSC`.
pub const IA32_TSC: u32 = 0x10;

/// `IA32_MISC_ENABLE.FAST_STRING`.
const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled, default type write-back.
const MTRR_ENABLE_WRITEBACK: u64 = (1 << 11) | 6;

/// The boot values, `(index, value)`, of the MSRs in `supported`.
pub fn boot_msrs(supported: &[u32]) -> Vec<(u32, u64)> {
    [
        (IA32_SYSENTER_CS, 0),
        (IA32_SYSENTER_ESP, 0),
        (IA32_SYSENTER_EIP, 0),
        (STAR, 0),
        (CSTAR, 0),
        (KERNEL_GS_BASE, 0),
        (SYSCALL_MASK, 0),
        (LSTAR, 0),
        (IA32_TSC, 0),
        (IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (IA32_MTRR_DEF_TYPE, MTRR_ENABLE_WRITEBACK),
    ]
    .into_iter()
    .filter(|(index, _)| supported.contains(index))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_supported_msrs_are_set() {
        let msrs = boot_msrs(&[IA32_TSC, IA32_MISC_ENABLE, 0x10a]);
        assert_eq!(msrs, vec![(IA32_TSC, 0), (IA32_MISC_ENABLE, 1)]);
        assert!(boot_msrs(&[]).is_empty());
    }
}

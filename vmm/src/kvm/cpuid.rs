//! The CPUID table of a vCPU: what KVM supports, with the topology leaves naming this vCPU.
//!
//! `KVM_GET_SUPPORTED_CPUID` already masks what the host and KVM cannot virtualize and
//! includes KVM's paravirtual leaves (0x4000_0000..). Per vCPU the VMM only fills in the APIC
//! ids (leaf 1 `EBX[31:24]`, x2APIC leaves 0xb and 0x1f EDX) and the logical processor count,
//! sets the "running under a hypervisor" bit (leaf 1 `ECX[31]`), and hides nested
//! virtualization: KVM reports VMX/SVM where the host allows nesting, but a sandbox has no use
//! for a hypervisor of its own, and the host's nested-virtualization code is attack surface it
//! need not reach.

use kvm_bindings::CpuId;

use super::Error;

/// Leaf 1 ECX: a hypervisor is present.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 EDX: Hyper-Threading / multiple logical processors (makes EBX[23:16] valid).
const EDX_HTT: u32 = 1 << 28;
/// Leaf 1 ECX: VMX (Intel VT-x).
const ECX_VMX: u32 = 1 << 5;
/// Leaf 0x8000_0001 ECX: SVM (AMD-V).
const ECX_SVM: u32 = 1 << 2;
/// The SVM feature leaf, meaningless without SVM.
const LEAF_SVM_FEATURES: u32 = 0x8000_000a;

/// `supported` adjusted for vCPU `id` of `count`.
pub fn for_vcpu(supported: &CpuId, id: u8, count: u8) -> Result<CpuId, Error> {
    let mut entries = supported.as_slice().to_vec();
    entries.retain(|e| e.function != LEAF_SVM_FEATURES);
    for entry in &mut entries {
        match entry.function {
            1 => {
                entry.ebx = (entry.ebx & 0x0000_ffff) | (u32::from(id) << 24) | (u32::from(count) << 16);
                entry.ecx = (entry.ecx | ECX_HYPERVISOR) & !ECX_VMX;
                if count > 1 {
                    entry.edx |= EDX_HTT;
                }
            }
            0xb | 0x1f => entry.edx = u32::from(id),
            0x8000_0001 => entry.ecx &= !ECX_SVM,
            _ => {}
        }
    }
    CpuId::from_entries(&entries).map_err(|_| Error::Table("CPUID"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn apic_ids_and_hypervisor_bit_are_set() {
        let leaf = |function| kvm_cpuid_entry2 { function, ebx: 0xffff_1234, ..Default::default() };
        let supported = CpuId::from_entries(&[leaf(0), leaf(1), leaf(0xb)]).unwrap();
        let table = for_vcpu(&supported, 3, 4).unwrap();
        let e = table.as_slice();
        assert_eq!(e[0].ebx, 0xffff_1234, "leaf 0 untouched");
        assert_eq!(e[1].ebx, 0x0304_1234);
        assert_ne!(e[1].ecx & ECX_HYPERVISOR, 0);
        assert_ne!(e[1].edx & EDX_HTT, 0);
        assert_eq!(e[2].edx, 3);
    }

    #[test]
    fn nested_virtualization_is_hidden() {
        let supported = CpuId::from_entries(&[
            kvm_cpuid_entry2 { function: 1, ecx: ECX_VMX | 1, ..Default::default() },
            kvm_cpuid_entry2 { function: 0x8000_0001, ecx: ECX_SVM | 1, ..Default::default() },
            kvm_cpuid_entry2 { function: LEAF_SVM_FEATURES, eax: 1, ebx: 16, ..Default::default() },
        ])
        .unwrap();
        let table = for_vcpu(&supported, 0, 1).unwrap();
        let e = table.as_slice();
        assert_eq!(e.len(), 2, "the SVM feature leaf is gone: {e:?}");
        assert_eq!(e[0].ecx & ECX_VMX, 0);
        assert_eq!(e[0].ecx & 1, 1, "other leaf 1 bits stay");
        assert_eq!(e[1].ecx, 1, "SVM is cleared, the rest stays");
    }
}

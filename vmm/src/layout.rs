//! The guest-physical address map of a pvisor microVM (x86_64).
//!
//! ```text
//! 0x0000_0000  real-mode IVT/BDA (left empty)
//! 0x0000_0500  GDT of the flat boot (a few entries)
//! 0x0000_6000  hvm_start_info (PVH)            0x0000_7000  PVH memory map
//! 0x0000_9000  PML4   0x0000_a000  PDPT   0x0000_b000..  page directories (flat boot)
//! 0x0002_0000  kernel command line (up to 64 KiB)
//! 0x0009_fc00  MP table (PVH boot), in the reserved range up to 1 MiB
//! 0x0010_0000  kernel / test guest image (1 MiB, where Linux and PVH expect it)
//! ...          RAM up to MMIO_GAP_START (or the end of RAM)
//! 0xc000_0000  32-bit MMIO gap: the clone-identity device at 0xcfff_f000, virtio-mmio
//!              devices from 0xd000_0000, 0x1000 apart
//! 0xfec0_0000  IOAPIC   0xfee0_0000 local APIC  (in-kernel irqchip)
//! 0xfffb_c000  KVM's TSS (3 pages) and identity-map page, inside the gap
//! 0x1_0000_0000  RAM above 4 GiB, if any
//! ```
//!
//! Everything the VMM writes for booting sits in the first MiB, so the test guests, their page
//! tables and their stacks stay at low addresses, where PVM runs guest code natively.

/// Where the GDT of the flat (long-mode) boot is written.
pub const GDT_START: u64 = 0x500;
/// `hvm_start_info` of a PVH boot.
pub const PVH_INFO_START: u64 = 0x6000;
/// The PVH memory map (`hvm_memmap_table_entry` array).
pub const PVH_MEMMAP_START: u64 = 0x7000;
/// Room for the PVH memory map entries (each 24 bytes).
pub const PVH_MEMMAP_MAX_ENTRIES: usize = 128;
/// Top-level page table (PML4) of the flat boot.
pub const PML4_START: u64 = 0x9000;
/// Page-directory-pointer table of the flat boot.
pub const PDPTE_START: u64 = 0xa000;
/// First page directory of the flat boot (one per GiB identity-mapped).
pub const PDE_START: u64 = 0xb000;
/// The kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Largest command line (including the NUL).
pub const CMDLINE_MAX_SIZE: usize = 0x1_0000;
/// Where a test guest or the kernel is loaded: 1 MiB.
pub const KERNEL_START: u64 = 0x10_0000;
/// Start of the 32-bit MMIO gap: RAM stops here and continues at 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the 32-bit MMIO gap.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// The clone-identity device ([`crate::devices::clone_id`]), just below the virtio slots.
pub const CLONE_ID_START: u64 = 0xcfff_f000;
/// First virtio-mmio device slot.
pub const VIRTIO_MMIO_START: u64 = 0xd000_0000;
/// Size of one virtio-mmio device window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// KVM's TSS (three pages, needed on Intel before any vCPU runs).
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
/// KVM's identity-map page (Intel real-mode emulation), just below the TSS.
pub const KVM_IDENTITY_MAP_ADDRESS: u64 = 0xfffb_c000;
/// Local APIC base (default).
pub const APIC_START: u64 = 0xfee0_0000;
/// IOAPIC base (default).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// First GSI handed to devices other than the legacy ISA ones (serial uses 4).
pub const GSI_DEVICES_START: u32 = 5;
/// Number of GSIs the in-kernel IOAPIC has.
pub const GSI_COUNT: u32 = 24;

// The boot structures do not overlap, checked at compile time.
const _: () = {
    assert!(GDT_START + 0x100 <= PVH_INFO_START);
    assert!(PVH_INFO_START + 0x1000 <= PVH_MEMMAP_START);
    assert!(PVH_MEMMAP_START + (PVH_MEMMAP_MAX_ENTRIES * 24) as u64 <= PML4_START);
    assert!(PDE_START + 4 * 0x1000 <= CMDLINE_START);
    assert!(CMDLINE_START + CMDLINE_MAX_SIZE as u64 <= KERNEL_START);
    assert!(KVM_IDENTITY_MAP_ADDRESS + 0x1000 == KVM_TSS_ADDRESS);
    assert!(VIRTIO_MMIO_START >= MMIO_GAP_START && IOAPIC_START > VIRTIO_MMIO_START);
    assert!(CLONE_ID_START >= MMIO_GAP_START && CLONE_ID_START + 0x1000 <= VIRTIO_MMIO_START);
};

/// The RAM regions, `(guest address, size)`, for `size` bytes of guest memory: below the
/// MMIO gap first, the rest above 4 GiB.
pub fn ram_regions(size: u64) -> Vec<(u64, u64)> {
    if size <= MMIO_GAP_START {
        vec![(0, size)]
    } else {
        vec![(0, MMIO_GAP_START), (MMIO_GAP_END, size - MMIO_GAP_START)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_region_below_the_gap() {
        assert_eq!(ram_regions(256 << 20), vec![(0, 256 << 20)]);
        assert_eq!(ram_regions(MMIO_GAP_START), vec![(0, MMIO_GAP_START)]);
    }

    #[test]
    fn large_memory_skips_the_gap() {
        let size = 4u64 << 30;
        assert_eq!(ram_regions(size), vec![(0, MMIO_GAP_START), (MMIO_GAP_END, size - MMIO_GAP_START)]);
    }
}

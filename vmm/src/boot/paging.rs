//! Identity-mapped page tables for the flat boot: the first 4 GiB with 2 MiB pages.
//!
//! Four GiB, not one, so that test guests reach the MMIO gap (virtio-mmio windows, IOAPIC,
//! local APIC) at their physical addresses. One PML4, one PDPT and four page directories:
//! six pages at [`layout::PML4_START`](crate::layout::PML4_START) and after.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::Error;
use crate::layout::{PDE_START, PDPTE_START, PML4_START};

/// Gigabytes identity-mapped.
pub const MAPPED_GIB: u64 = 4;

const PRESENT_RW: u64 = 0x3;
const PAGE_SIZE_2M: u64 = 0x80;

/// Writes the tables; returns the CR3 value.
pub fn write_identity_map(mem: &GuestMemoryMmap) -> Result<u64, Error> {
    let write = |addr: u64, value: u64| {
        mem.write_obj(value, GuestAddress(addr)).map_err(|source| Error::GuestMemory {
            what: "page tables",
            addr,
            source,
        })
    };
    write(PML4_START, PDPTE_START | PRESENT_RW)?;
    for gib in 0..MAPPED_GIB {
        let pd = PDE_START + gib * 0x1000;
        write(PDPTE_START + gib * 8, pd | PRESENT_RW)?;
        for i in 0..512u64 {
            let phys = (gib << 30) | (i << 21);
            write(pd + i * 8, phys | PRESENT_RW | PAGE_SIZE_2M)?;
        }
    }
    Ok(PML4_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the tables the way the MMU does for a 2 MiB page.
    fn translate(mem: &GuestMemoryMmap, cr3: u64, va: u64) -> Option<u64> {
        let read = |addr: u64| mem.read_obj::<u64>(GuestAddress(addr)).unwrap();
        let pml4e = read(cr3 + ((va >> 39) & 0x1ff) * 8);
        if pml4e & 1 == 0 {
            return None;
        }
        let pdpte = read((pml4e & !0xfff) + ((va >> 30) & 0x1ff) * 8);
        if pdpte & 1 == 0 {
            return None;
        }
        let pde = read((pdpte & !0xfff) + ((va >> 21) & 0x1ff) * 8);
        (pde & 0x81 == 0x81).then_some((pde & !0x1f_ffff) | (va & 0x1f_ffff))
    }

    #[test]
    fn the_first_four_gib_map_to_themselves() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let cr3 = write_identity_map(&mem).unwrap();
        for va in [0u64, 0x10_0000, 0x1234_5678, 0xfec0_0000, 0xffff_ffff] {
            assert_eq!(translate(&mem, cr3, va), Some(va), "{va:#x}");
        }
        assert_eq!(translate(&mem, cr3, 4 << 30), None);
    }
}

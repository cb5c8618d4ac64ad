//! The Intel MultiProcessor Specification (1.4) table, for a guest kernel without ACPI.
//!
//! pvisor's guest kernel is built without ACPI, so the MP table is how Linux learns that there
//! are several CPUs (their APIC ids), where the IOAPIC is, and how the ISA interrupts 0..23 map
//! onto its pins. Without it Linux boots one CPU and routes every interrupt through the 8259
//! PIC. The floating pointer goes at the start of the last KiB of conventional memory
//! (0x9fc00, one of the places Linux scans), the configuration table right after it; the
//! memory map marks that range reserved.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::Error;
use crate::layout::{APIC_START, IOAPIC_START};

/// Where the floating pointer goes.
pub const MPTABLE_START: u64 = 0x9_fc00;
/// Interrupt lines of the IOAPIC (and ISA bus IRQs described).
const IRQ_LINES: u8 = 24;
/// MP specification revision 1.4.
const SPEC_REV: u8 = 4;
/// Local APIC version (integrated APIC).
const APIC_VERSION: u8 = 0x14;
/// IOAPIC version.
const IOAPIC_VERSION: u8 = 0x11;
/// The one bus: ISA, id 0.
const BUS_ID: u8 = 0;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;

fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)).wrapping_neg()
}

/// The table for `vcpus` CPUs (APIC ids 0..vcpus), as bytes to place at [`MPTABLE_START`].
pub fn build(vcpus: u8) -> Vec<u8> {
    let ioapic_id = vcpus;
    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for id in 0..vcpus {
        let flags = CPU_ENABLED | if id == 0 { CPU_BOOTSTRAP } else { 0 };
        entries.extend([ENTRY_PROCESSOR, id, APIC_VERSION, flags]);
        entries.extend(0x600u32.to_le_bytes()); // CPU signature: family 6
        entries.extend(0x201u32.to_le_bytes()); // features: FPU, APIC
        entries.extend([0u8; 8]);
        count += 1;
    }
    entries.extend([ENTRY_BUS, BUS_ID]);
    entries.extend(*b"ISA   ");
    count += 1;
    entries.extend([ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend((IOAPIC_START as u32).to_le_bytes());
    count += 1;
    for irq in 0..IRQ_LINES {
        // ISA IRQ n is IOAPIC pin n, with the bus's default polarity and trigger.
        entries.extend([ENTRY_IO_INTERRUPT, INT_TYPE_INT, 0, 0, BUS_ID, irq, ioapic_id, irq]);
        count += 1;
    }
    // LINT0 of every local APIC is ExtINT (the PIC), LINT1 is NMI.
    entries.extend([ENTRY_LOCAL_INTERRUPT, INT_TYPE_EXTINT, 0, 0, BUS_ID, 0, 0xff, 0]);
    entries.extend([ENTRY_LOCAL_INTERRUPT, INT_TYPE_NMI, 0, 0, BUS_ID, 0, 0xff, 1]);
    count += 2;

    let table_addr = MPTABLE_START as u32 + 16;
    let mut header = Vec::with_capacity(44);
    header.extend(*b"PCMP");
    header.extend(((44 + entries.len()) as u16).to_le_bytes());
    header.extend([SPEC_REV, 0]); // checksum below
    header.extend(*b"PVISOR  ");
    header.extend(*b"MICROVM     ");
    header.extend(0u32.to_le_bytes()); // no OEM table
    header.extend(0u16.to_le_bytes());
    header.extend(count.to_le_bytes());
    header.extend((APIC_START as u32).to_le_bytes());
    header.extend([0u8; 4]); // no extended table
    let mut table = header;
    table.extend(entries);
    table[7] = checksum(&table);

    let mut floating = Vec::with_capacity(16);
    floating.extend(*b"_MP_");
    floating.extend(table_addr.to_le_bytes());
    floating.extend([1, SPEC_REV, 0, 0, 0, 0, 0, 0]); // length in 16-byte units, checksum, features
    floating[10] = checksum(&floating);

    floating.extend(table);
    floating
}

/// Writes the table for `vcpus` CPUs into guest memory.
pub fn write(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), Error> {
    mem.write_slice(&build(vcpus), GuestAddress(MPTABLE_START)).map_err(|source| Error::GuestMemory {
        what: "MP table",
        addr: MPTABLE_START,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Parses the table the way Linux's mpparse does: checksums, then each entry by type.
    #[test]
    fn the_table_parses_with_valid_checksums() {
        let bytes = build(4);
        let sum = |s: &[u8]| s.iter().fold(0u8, |a, b| a.wrapping_add(*b));
        assert_eq!(&bytes[..4], b"_MP_");
        assert_eq!(sum(&bytes[..16]), 0, "floating pointer checksum");
        let table_at = (u32_at(&bytes, 4) as u64 - MPTABLE_START) as usize;
        let table = &bytes[table_at..];
        assert_eq!(&table[..4], b"PCMP");
        let len = usize::from(u16_at(table, 4));
        assert_eq!(len, table.len());
        assert_eq!(sum(&table[..len]), 0, "configuration table checksum");
        assert_eq!(u32_at(table, 36), APIC_START as u32);

        let (mut cpus, mut bsp, mut ioapics, mut irqs, mut lints) = (Vec::new(), 0, 0, 0, 0);
        let mut at = 44;
        for _ in 0..u16_at(table, 34) {
            match table[at] {
                ENTRY_PROCESSOR => {
                    cpus.push(table[at + 1]);
                    bsp += usize::from(table[at + 3] & CPU_BOOTSTRAP != 0);
                    at += 20;
                }
                ENTRY_BUS => {
                    assert_eq!(&table[at + 2..at + 8], b"ISA   ");
                    at += 8;
                }
                ENTRY_IOAPIC => {
                    assert_eq!(u32_at(table, at + 4), IOAPIC_START as u32);
                    assert_eq!(table[at + 1], 4, "IOAPIC id after the CPUs");
                    ioapics += 1;
                    at += 8;
                }
                ENTRY_IO_INTERRUPT => {
                    assert_eq!(table[at + 5], table[at + 7], "IRQ n on pin n");
                    irqs += 1;
                    at += 8;
                }
                ENTRY_LOCAL_INTERRUPT => {
                    lints += 1;
                    at += 8;
                }
                other => panic!("unknown entry type {other}"),
            }
        }
        assert_eq!(at, len);
        assert_eq!(cpus, vec![0, 1, 2, 3]);
        assert_eq!((bsp, ioapics, irqs, lints), (1, 1, 24, 2));
    }

    #[test]
    fn the_largest_table_fits_below_1_mib() {
        assert!(MPTABLE_START + build(254).len() as u64 <= crate::layout::KERNEL_START);
    }
}

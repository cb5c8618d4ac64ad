//! The boot GDT: null, code, data, TSS, as flat segments covering all memory.
//!
//! Both entry modes use the same selectors: 0x08 code (64-bit for the flat boot, 32-bit for
//! PVH), 0x10 data, 0x18 a 64-bit TSS placeholder (KVM requires a usable TR in long mode).

use kvm_bindings::kvm_segment;

/// Code segment selector.
pub const CODE_SELECTOR: u16 = 0x08;
/// Data segment selector.
pub const DATA_SELECTOR: u16 = 0x10;
/// TSS selector.
pub const TSS_SELECTOR: u16 = 0x18;

/// A GDT entry from flags (the type/S/DPL/P byte and the G/DB/L nibble), base and limit.
pub const fn entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The table for long mode (`long == true`) or 32-bit protected mode.
pub fn table(long: bool) -> [u64; 4] {
    // Code: present, ring 0, execute/read, accessed; G=1 and L=1 (long) or D=1 (32-bit).
    let code = if long { 0xa09b } else { 0xc09b };
    [0, entry(code, 0, 0xfffff), entry(0xc093, 0, 0xfffff), entry(0x808b, 0, 0xfffff)]
}

/// The `kvm_segment` (hidden part of a segment register) for a GDT entry.
pub fn segment(entry: u64, selector: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let raw_limit = ((entry & 0xffff) | ((entry >> 32) & 0x000f_0000)) as u32;
    let g = ((entry >> 55) & 1) as u8;
    let limit = if g == 1 { (raw_limit << 12) | 0xfff } else { raw_limit };
    kvm_segment {
        base,
        limit,
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: u8::from((entry >> 47) & 1 == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_encode_like_the_manual() {
        assert_eq!(entry(0xa09b, 0, 0xfffff), 0x00af_9b00_0000_ffff);
        assert_eq!(entry(0xc093, 0, 0xfffff), 0x00cf_9300_0000_ffff);
        assert_eq!(entry(0x808b, 0, 0xfffff), 0x008f_8b00_0000_ffff);
    }

    #[test]
    fn segments_decode_their_entries() {
        let t = table(true);
        let cs = segment(t[1], CODE_SELECTOR);
        assert_eq!((cs.l, cs.db, cs.g, cs.s, cs.type_, cs.present), (1, 0, 1, 1, 0xb, 1));
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = segment(t[2], DATA_SELECTOR);
        assert_eq!((ds.l, ds.db, ds.type_, ds.base), (0, 1, 3, 0));
        let cs32 = segment(table(false)[1], CODE_SELECTOR);
        assert_eq!((cs32.l, cs32.db), (0, 1));
        let tss = segment(t[3], TSS_SELECTOR);
        assert_eq!((tss.s, tss.type_, tss.unusable), (0, 0xb, 0));
        assert_eq!(segment(0, 0).unusable, 1);
    }
}

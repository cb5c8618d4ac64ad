//! PVH direct boot of an uncompressed Linux `vmlinux`.
//!
//! `linux-loader` loads the ELF's segments and finds the PVH entry (the
//! `XEN_ELFNOTE_PHYS32_ENTRY` note a kernel built with `CONFIG_PVH` carries). The VMM then
//! writes what the PVH boot ABI hands the kernel: `hvm_start_info` (magic, command line,
//! module list with the initramfs, memory map) plus an MP table (the kernel has no ACPI),
//! and starts the boot vCPU in 32-bit protected
//! mode at the entry with `ebx` pointing at `hvm_start_info`.

use std::fs::File;
use std::io::{Read, Seek};

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{load_cmdline, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{EntryState, Error};
use crate::layout::{
    ram_regions, CMDLINE_MAX_SIZE, CMDLINE_START, KERNEL_START, PVH_INFO_START, PVH_MEMMAP_MAX_ENTRIES,
    PVH_MEMMAP_START,
};

/// Memory map type: usable RAM.
const E820_RAM: u32 = 1;
/// Memory map type: reserved.
const E820_RESERVED: u32 = 2;
/// The top of conventional memory that is RAM (the EBDA starts here on a PC).
const EBDA_START: u64 = 0x9_fc00;
/// The module list sits right after `hvm_start_info`, in the same page.
const MODLIST_START: u64 = PVH_INFO_START + 0x800;

/// What [`load`] put where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PvhBoot {
    /// The boot vCPU's state.
    pub entry: EntryState,
    /// The end of the kernel image in guest memory.
    pub kernel_end: u64,
    /// Where the initramfs went, `(address, size)`.
    pub initramfs: Option<(u64, u64)>,
}

/// Loads `kernel` (an ELF `vmlinux`), `cmdline` and `initramfs` into `mem`, `ram_size` bytes
/// of RAM laid out by [`ram_regions`], and the MP table for `vcpus` CPUs.
pub fn load(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    vcpus: u8,
    kernel: &mut File,
    cmdline: &str,
    initramfs: Option<&mut File>,
) -> Result<PvhBoot, Error> {
    let loaded = Elf::load(mem, None, kernel, Some(GuestAddress(KERNEL_START))).map_err(Error::Kernel)?;
    let entry = match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) => addr.0,
        _ => return Err(Error::NoPvhEntry),
    };
    let kernel_end = loaded.kernel_end;

    let cmdline = Cmdline::try_from(cmdline, CMDLINE_MAX_SIZE).map_err(Error::Cmdline)?;
    load_cmdline(mem, GuestAddress(CMDLINE_START), &cmdline).map_err(|_| Error::TooLarge {
        what: "command line",
        size: CMDLINE_MAX_SIZE as u64,
        addr: CMDLINE_START,
    })?;

    let regions = ram_regions(ram_size);
    let low_end = regions[0].1;
    let initramfs = match initramfs {
        Some(file) => Some(load_initramfs(mem, file, kernel_end, low_end)?),
        None => None,
    };

    let memmap = memory_map(&regions);
    if memmap.len() > PVH_MEMMAP_MAX_ENTRIES {
        return Err(Error::MemmapTooLarge(memmap.len()));
    }
    for (i, entry) in memmap.iter().enumerate() {
        let addr = PVH_MEMMAP_START + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64;
        write(mem, *entry, addr, "PVH memory map")?;
    }
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        cmdline_paddr: CMDLINE_START,
        memmap_paddr: PVH_MEMMAP_START,
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    if let Some((paddr, size)) = initramfs {
        write(mem, hvm_modlist_entry { paddr, size, ..Default::default() }, MODLIST_START, "PVH module list")?;
        info.nr_modules = 1;
        info.modlist_paddr = MODLIST_START;
    }
    write(mem, info, PVH_INFO_START, "hvm_start_info")?;

    super::mptable::write(mem, vcpus)?;

    let entry = EntryState::Protected32 { entry, start_info: PVH_INFO_START };
    entry.write_gdt(mem)?;
    Ok(PvhBoot { entry, kernel_end, initramfs })
}

fn write<T: vm_memory::ByteValued>(
    mem: &GuestMemoryMmap,
    value: T,
    addr: u64,
    what: &'static str,
) -> Result<(), Error> {
    mem.write_obj(value, GuestAddress(addr)).map_err(|source| Error::GuestMemory { what, addr, source })
}

/// Reads the initramfs into the top of low RAM (page-aligned), above the kernel.
fn load_initramfs(mem: &GuestMemoryMmap, file: &mut File, kernel_end: u64, low_end: u64) -> Result<(u64, u64), Error> {
    // From the start, wherever the caller left the file position.
    let mut data = Vec::new();
    file.rewind()
        .and_then(|()| file.read_to_end(&mut data))
        .map_err(|source| Error::Read { what: "initramfs", source })?;
    let size = data.len() as u64;
    let addr = low_end.checked_sub(size).map(|a| a & !0xfff).filter(|a| *a >= kernel_end).ok_or(Error::TooLarge {
        what: "initramfs",
        size,
        addr: kernel_end,
    })?;
    mem.write_slice(&data, GuestAddress(addr)).map_err(|source| Error::GuestMemory {
        what: "initramfs",
        addr,
        source,
    })?;
    Ok((addr, size))
}

/// The e820-style map: conventional memory below the EBDA, the BIOS hole reserved, then RAM
/// from 1 MiB to the MMIO gap and above 4 GiB.
pub fn memory_map(regions: &[(u64, u64)]) -> Vec<hvm_memmap_table_entry> {
    let entry = |addr, size, type_| hvm_memmap_table_entry { addr, size, type_, reserved: 0 };
    let mut map = vec![entry(0, EBDA_START, E820_RAM), entry(EBDA_START, KERNEL_START - EBDA_START, E820_RESERVED)];
    for &(start, size) in regions {
        let start_at = start.max(KERNEL_START);
        if start + size > start_at {
            map.push(entry(start_at, start + size - start_at, E820_RAM));
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_map_covers_ram_around_the_holes() {
        let map = memory_map(&ram_regions(256 << 20));
        let spans: Vec<(u64, u64, u32)> = map.iter().map(|e| (e.addr, e.size, e.type_)).collect();
        assert_eq!(
            spans,
            vec![(0, EBDA_START, 1), (EBDA_START, 0x100000 - EBDA_START, 2), (0x100000, (256 << 20) - 0x100000, 1)]
        );
        let big = memory_map(&ram_regions(5 << 30));
        assert_eq!(big.len(), 4);
        assert_eq!((big[3].addr, big[3].size), (1 << 32, (5u64 << 30) - crate::layout::MMIO_GAP_START));
    }

    #[test]
    fn a_kernel_that_is_not_an_elf_is_refused() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, b"not an elf at all, just text").unwrap();
        assert!(matches!(load(&mem, 4 << 20, 1, &mut file, "console=ttyS0", None), Err(Error::Kernel(_))));
    }
}

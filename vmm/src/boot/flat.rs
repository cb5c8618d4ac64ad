//! The flat loader: a raw binary at a low guest-physical address, run in long mode.
//!
//! For the test guests. The binary is copied to `load_addr` (1 MiB by default), the identity
//! map and the GDT are written, and the boot vCPU starts at `load_addr` with the stack just
//! below it (the stack grows down into free RAM under 1 MiB).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{paging, EntryState, Error};
use crate::layout::KERNEL_START;

/// Top of the flat guest's initial stack (grows down from just below 1 MiB).
pub const STACK_TOP: u64 = 0x8_0000;

/// Loads `image` at [`KERNEL_START`] and returns the entry state.
pub fn load(mem: &GuestMemoryMmap, image: &[u8]) -> Result<EntryState, Error> {
    load_at(mem, image, KERNEL_START)
}

/// Loads `image` at `load_addr` and returns the entry state.
pub fn load_at(mem: &GuestMemoryMmap, image: &[u8], load_addr: u64) -> Result<EntryState, Error> {
    mem.write_slice(image, GuestAddress(load_addr)).map_err(|_| Error::TooLarge {
        what: "flat image",
        size: image.len() as u64,
        addr: load_addr,
    })?;
    let cr3 = paging::write_identity_map(mem)?;
    let state = EntryState::Long64 { entry: load_addr, stack: STACK_TOP, cr3 };
    state.write_gdt(mem)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_lands_at_1_mib() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let state = load(&mem, &[0xf4, 0x90]).unwrap();
        assert_eq!(mem.read_obj::<u16>(GuestAddress(KERNEL_START)).unwrap(), 0x90f4);
        assert!(matches!(state, EntryState::Long64 { entry: KERNEL_START, stack: STACK_TOP, .. }));
    }

    #[test]
    fn an_image_past_the_end_of_ram_is_refused() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        let image = vec![0u8; 2 << 20];
        assert!(matches!(load(&mem, &image), Err(Error::TooLarge { .. })));
    }
}

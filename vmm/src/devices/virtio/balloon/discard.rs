//! Giving a guest-physical range back to the host.
//!
//! How depends on the mapping behind it (see `crate::memory`): a shared
//! mapping (the guest RAM memfd) frees its pages only by punching them out of
//! the file (`MADV_REMOVE`); a private one (anonymous RAM, a snapshot's memory
//! file mapped copy-on-write) drops its own pages with `MADV_DONTNEED`, after
//! which it reads zeros or the file's page again.

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::devices::virtio::GuestMemory;

const PAGE: u64 = 4096;

/// Errors of [`discard`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Part of the range is not guest RAM.
    #[error("range {addr:#x}+{len:#x} is not in guest memory")]
    OutOfRange {
        /// Guest-physical start.
        addr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The kernel refused the `madvise`.
    #[error("madvise on {len:#x} bytes at guest {addr:#x}: {source}")]
    Madvise {
        /// Guest-physical start.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// The `madvise` error.
        #[source]
        source: std::io::Error,
    },
}

/// Gives the whole pages of `addr..addr + len` back to the host; returns how
/// many bytes that was. The range may span regions (each gets its own call)
/// but must lie wholly in guest memory.
pub fn discard(mem: &GuestMemory, addr: u64, len: u64) -> Result<u64, Error> {
    let out_of_range = || Error::OutOfRange { addr, len };
    let start = addr.checked_add(PAGE - 1).ok_or_else(out_of_range)? & !(PAGE - 1);
    let end = addr.checked_add(len).ok_or_else(out_of_range)? & !(PAGE - 1);
    if end > start && !mem.check_range(GuestAddress(start), (end - start) as usize) {
        return Err(out_of_range());
    }
    let mut at = start;
    while at < end {
        let region = mem.find_region(GuestAddress(at)).ok_or_else(out_of_range)?;
        let offset = at - region.start_addr().0;
        let chunk = (end - at).min(region.len() - offset);
        let host = region.get_host_address(MemoryRegionAddress(offset)).map_err(|_| out_of_range())?;
        let advice = if region.flags() & libc::MAP_SHARED != 0 { libc::MADV_REMOVE } else { libc::MADV_DONTNEED };
        // SAFETY: `host..host + chunk` lies inside this region's live mapping (checked against
        // its length above); the advice only replaces the pages' contents with the mapping's
        // backing (zeros or the file's page), which the guest allowed by reporting them free.
        let rc = unsafe { libc::madvise(host.cast(), chunk as usize, advice) };
        if rc != 0 {
            return Err(Error::Madvise { addr: at, len: chunk, source: std::io::Error::last_os_error() });
        }
        at += chunk;
    }
    Ok(end.saturating_sub(start))
}

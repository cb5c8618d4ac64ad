//! Writing guest RAM into a snapshot's memory file.
//!
//! The file is as large as guest RAM, with the regions back to back (the memfd's layout), and
//! sparse: only pages holding something other than zeros are written. For memfd-backed RAM only
//! the memfd's data ranges (`SEEK_DATA`/`SEEK_HOLE`, the pages the guest or the loader ever
//! touched) are read, so a snapshot of a VM that used little of its RAM reads little; RAM that is
//! itself a private mapping of a snapshot, and anonymous RAM, are scanned whole (reading an
//! untouched anonymous page maps the shared zero page: it costs no memory).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::Error;
use crate::memory::Backing;

const PAGE: usize = 4096;
/// Bytes read from guest memory per step.
const CHUNK: usize = 1 << 20;

/// How much of guest RAM went into the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of pages written (non-zero pages).
    pub written: u64,
    /// Bytes of guest RAM looked at.
    pub scanned: u64,
}

/// The data ranges `[start, end)` of `file` within `[from, to)`.
fn data_ranges(file: &File, from: u64, to: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut ranges = Vec::new();
    let mut at = from;
    while at < to {
        // SAFETY: lseek on an fd this process owns; no memory is passed.
        let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 || data as u64 >= to {
            break; // ENXIO: no data after `at`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { to } else { (hole as u64).min(to) };
        ranges.push((data as u64, end));
        at = end;
    }
    ranges
}

/// Writes `memory` (backed by `backing_file` of kind `backing`; `None` for anonymous RAM) into
/// a new file at `path`.
pub fn write(
    memory: &GuestMemoryMmap,
    backing_file: Option<&File>,
    backing: Backing,
    path: &Path,
) -> Result<MemoryStats, Error> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let out = File::create(path).map_err(Error::io("creating", path))?;
    let total: u64 = memory.iter().map(|r| r.len()).sum();
    out.set_len(total).map_err(Error::io("sizing", path))?;
    let mut stats = MemoryStats::default();
    let mut buf = vec![0u8; CHUNK];
    let mut file_offset = 0u64;
    for region in memory.iter() {
        let (guest, len) = (region.start_addr().0, region.len());
        let ranges = match (backing, backing_file) {
            (Backing::Memfd, Some(file)) => data_ranges(file, file_offset, file_offset + len),
            _ => vec![(file_offset, file_offset + len)],
        };
        for (start, end) in ranges {
            let mut at = start;
            while at < end {
                let n = ((end - at) as usize).min(CHUNK);
                let chunk = &mut buf[..n];
                memory.read_slice(chunk, GuestAddress(guest + (at - file_offset))).map_err(|e| Error::Io {
                    what: "reading guest memory for",
                    path: path.to_owned(),
                    source: std::io::Error::other(e),
                })?;
                // One write per run of non-zero pages.
                let mut run: Option<usize> = None;
                let pages = chunk.len().div_ceil(PAGE);
                for i in 0..=pages {
                    let nonzero = i < pages && chunk[i * PAGE..((i + 1) * PAGE).min(n)].iter().any(|&b| b != 0);
                    match (nonzero, run) {
                        (true, None) => run = Some(i),
                        (false, Some(first)) => {
                            let bytes = &chunk[first * PAGE..(i * PAGE).min(n)];
                            out.write_all_at(bytes, at + (first * PAGE) as u64).map_err(Error::io("writing", path))?;
                            stats.written += bytes.len() as u64;
                            run = None;
                        }
                        _ => {}
                    }
                }
                stats.scanned += n as u64;
                at += n as u64;
            }
        }
        file_offset += len;
    }
    out.sync_all().map_err(Error::io("syncing", path))?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GuestRam;

    #[test]
    fn only_nonzero_pages_are_written_and_the_file_reads_back() {
        let ram = GuestRam::new(4 << 20).unwrap();
        ram.memory().write_obj(0x1122_3344u32, GuestAddress(0x3000)).unwrap();
        ram.memory().write_obj(0u32, GuestAddress(0x20_0000)).unwrap(); // touched, still zero
        ram.memory().write_obj(0x55u8, GuestAddress(0x3f_ffff)).unwrap();
        ram.memory().write_obj(0x66u8, GuestAddress(0x3f_e000)).unwrap(); // the page before: one run
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let stats = write(ram.memory(), ram.backing_file(), ram.backing(), &path).unwrap();
        assert_eq!(stats.written, 3 * PAGE as u64, "three non-zero pages");
        assert!(stats.scanned < 4 << 20, "only the memfd's data ranges were read");
        let file = File::open(&path).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 4 << 20);
        let restored = GuestRam::from_snapshot(file, 4 << 20).unwrap();
        assert_eq!(restored.memory().read_obj::<u32>(GuestAddress(0x3000)).unwrap(), 0x1122_3344);
        assert_eq!(restored.memory().read_obj::<u8>(GuestAddress(0x3f_ffff)).unwrap(), 0x55);
        assert_eq!(restored.memory().read_obj::<u8>(GuestAddress(0x3f_e000)).unwrap(), 0x66);
        assert_eq!(restored.memory().read_obj::<u32>(GuestAddress(0x10_0000)).unwrap(), 0);
    }

    #[test]
    fn anonymous_ram_is_scanned_whole_and_reads_back() {
        let ram = GuestRam::anonymous(2 << 20).unwrap();
        ram.memory().write_obj(0xabcdu16, GuestAddress(0x5000)).unwrap();
        ram.memory().write_obj(0x77u8, GuestAddress(0x1f_ffff)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let stats = write(ram.memory(), ram.backing_file(), ram.backing(), &path).unwrap();
        assert_eq!(stats.written, 2 * PAGE as u64, "two non-zero pages");
        assert_eq!(stats.scanned, 2 << 20, "anonymous RAM is scanned whole");
        let restored = GuestRam::from_snapshot(File::open(&path).unwrap(), 2 << 20).unwrap();
        assert_eq!(restored.memory().read_obj::<u16>(GuestAddress(0x5000)).unwrap(), 0xabcd);
        assert_eq!(restored.memory().read_obj::<u8>(GuestAddress(0x1f_ffff)).unwrap(), 0x77);
    }
}

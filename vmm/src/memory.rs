//! Guest RAM: one memfd, sealed at its size, mapped shared into the VMM (the default), or
//! private anonymous memory that KSM may merge ([`GuestRam::anonymous`]).
//!
//! A memfd (rather than anonymous memory) lets a vhost-user front-end map the very same pages
//! (QEMU's `memory-backend-memfd,share=on` in the test engine, or our own back-ends being handed
//! the fd). The size is sealed (no shrink, no grow) before anything maps it, so no one holding
//! the fd can truncate guest RAM under a mapping and turn guest accesses into SIGBUS in the VMM.
//! The map is split around the 32-bit MMIO gap ([`layout::ram_regions`]); each region maps the
//! memfd at the matching file offset.
//!
//! A VM restored from a snapshot instead maps the snapshot's memory file **privately**
//! ([`GuestRam::from_snapshot`], `MAP_PRIVATE`): guest reads are served from the file's page
//! cache, shared by every clone of the snapshot, and the first guest write to a page gives that
//! clone its own copy. Such RAM has no fd to share ([`GuestRam::fd`] is `None`): a vhost-user
//! back-end mapping the file would see the snapshot's pages, not the clone's copies, so an
//! engine with vhost-user devices (the QEMU TCG engine) cannot use a private restore; it would
//! need the memory file copied into a fresh memfd (no sharing) or a lazily filled shared memfd
//! (userfaultfd), which this module does not do.
//!
//! KSM merges only anonymous pages in VMAs marked `MADV_MERGEABLE`; the memfd's pages are shmem,
//! never merged. So RAM that should be merged with other VMs' identical pages is private
//! anonymous memory (`MAP_NORESERVE`, sized as the memfd would be) marked mergeable
//! ([`GuestRam::anonymous`]); it has no fd either, so only an engine without vhost-user
//! back-ends (the project's own VMM) can use it. A private restore's written pages are
//! anonymous too: [`GuestRam::mark_mergeable`] marks its mapping.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};

use memfd::{FileSeal, MemfdOptions};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use crate::layout;

/// Errors of [`GuestRam::new`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The requested size is zero or not a multiple of the page size.
    #[error("guest memory size {0:#x} is not a non-zero multiple of 4 KiB")]
    BadSize(u64),
    /// `memfd_create` failed.
    #[error("creating the guest memory memfd: {0}")]
    Memfd(#[source] memfd::Error),
    /// Sizing the memfd failed.
    #[error("sizing the guest memory memfd to {size:#x} bytes: {source}")]
    Resize {
        /// Requested size.
        size: u64,
        /// The `ftruncate` error.
        #[source]
        source: std::io::Error,
    },
    /// Adding the seals failed.
    #[error("sealing the guest memory memfd: {0}")]
    Seal(#[source] memfd::Error),
    /// Duplicating the memfd for a region failed.
    #[error("duplicating the guest memory fd: {0}")]
    Dup(#[source] std::io::Error),
    /// Mapping the memfd failed.
    #[error("mapping guest memory: {0}")]
    Map(#[source] vm_memory::mmap::FromRangesError),
    /// A snapshot's memory file is not the size of the RAM it is to back.
    #[error("the memory file holds {file:#x} bytes, the snapshot's RAM is {ram:#x}")]
    FileSize {
        /// The file's size.
        file: u64,
        /// The RAM size.
        ram: u64,
    },
    /// Reading the memory file's size failed.
    #[error("reading the memory file's size: {0}")]
    Stat(#[source] std::io::Error),
    /// Mapping the memory file privately failed.
    #[error("mapping the memory file privately: {0}")]
    MapPrivate(#[source] vm_memory::mmap::MmapRegionError),
    /// `madvise(MADV_MERGEABLE)` failed (a kernel without `CONFIG_KSM`).
    #[error("marking guest memory mergeable: {0}")]
    Mergeable(#[source] std::io::Error),
    /// The mapped regions did not form a guest memory map.
    #[error("assembling the guest memory map: {0}")]
    Regions(#[source] vm_memory::GuestRegionCollectionError),
}

/// What guest RAM is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// A sealed memfd, mapped shared (a booted VM).
    Memfd,
    /// A snapshot's memory file, mapped privately (copy-on-write; a restored VM).
    PrivateFile,
    /// Private anonymous memory marked `MADV_MERGEABLE` (a booted VM whose RAM KSM may merge).
    Anonymous,
}

/// Guest RAM and the file behind it.
pub struct GuestRam {
    /// The memfd or snapshot file; `None` for anonymous RAM.
    file: Option<File>,
    size: u64,
    memory: GuestMemoryMmap,
    backing: Backing,
}

impl GuestRam {
    /// Creates `size` bytes of guest RAM (a multiple of 4 KiB), zero-filled and not yet
    /// backed by pages (the memfd is sparse until the guest touches it).
    pub fn new(size: u64) -> Result<Self, Error> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(Error::BadSize(size));
        }
        let memfd = MemfdOptions::default()
            .close_on_exec(true)
            .allow_sealing(true)
            .create("pvisor-guest-ram")
            .map_err(Error::Memfd)?;
        memfd.as_file().set_len(size).map_err(|source| Error::Resize { size, source })?;
        memfd.add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow, FileSeal::SealSeal]).map_err(Error::Seal)?;
        let file = memfd.into_file();

        let mut ranges = Vec::new();
        let mut offset = 0u64;
        for (start, len) in layout::ram_regions(size) {
            let region_file = file.try_clone().map_err(Error::Dup)?;
            ranges.push((GuestAddress(start), len as usize, Some(FileOffset::new(region_file, offset))));
            offset += len;
        }
        let memory = GuestMemoryMmap::from_ranges_with_files(ranges).map_err(Error::Map)?;
        Ok(GuestRam { file: Some(file), size, memory, backing: Backing::Memfd })
    }

    /// Creates `size` bytes of guest RAM (a multiple of 4 KiB) as private anonymous memory
    /// (`MAP_NORESERVE`, not backed by pages until touched) marked `MADV_MERGEABLE`, so KSM
    /// (when the host's ksmd runs) may merge its pages with identical pages of other VMs.
    pub fn anonymous(size: u64) -> Result<Self, Error> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(Error::BadSize(size));
        }
        let ranges: Vec<_> =
            layout::ram_regions(size).into_iter().map(|(start, len)| (GuestAddress(start), len as usize)).collect();
        // vm-memory maps file-less ranges `MAP_ANONYMOUS | MAP_PRIVATE | MAP_NORESERVE`.
        let memory = GuestMemoryMmap::from_ranges(&ranges).map_err(Error::Map)?;
        let ram = GuestRam { file: None, size, memory, backing: Backing::Anonymous };
        ram.mark_mergeable()?;
        Ok(ram)
    }

    /// Marks every region `MADV_MERGEABLE`. For a private restore this covers the pages the
    /// guest writes (its own anonymous copies); the file's page-cache pages stay shared as
    /// they are. For memfd RAM the advice is accepted but KSM never merges shmem pages.
    pub fn mark_mergeable(&self) -> Result<(), Error> {
        for (_, len, host) in self.regions() {
            // SAFETY: `host..host + len` is a whole mapping this `GuestRam` owns and keeps
            // mapped; MADV_MERGEABLE changes no contents, only lets ksmd scan the pages.
            let rc = unsafe { libc::madvise(host as *mut libc::c_void, len as usize, libc::MADV_MERGEABLE) };
            if rc != 0 {
                return Err(Error::Mergeable(std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Maps a snapshot's memory `file` (laid out as the memfd is: the regions of
    /// [`layout::ram_regions`] back to back) privately as `size` bytes of guest RAM.
    pub fn from_snapshot(file: File, size: u64) -> Result<Self, Error> {
        use vm_memory::mmap::MmapRegionBuilder;
        use vm_memory::GuestRegionMmap;
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(Error::BadSize(size));
        }
        let file_len = file.metadata().map_err(Error::Stat)?.len();
        if file_len != size {
            return Err(Error::FileSize { file: file_len, ram: size });
        }
        let mut regions = Vec::new();
        let mut offset = 0u64;
        for (start, len) in layout::ram_regions(size) {
            let region_file = file.try_clone().map_err(Error::Dup)?;
            let mapping = MmapRegionBuilder::new_with_bitmap(len as usize, ())
                .with_file_offset(FileOffset::new(region_file, offset))
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                .build()
                .map_err(Error::MapPrivate)?;
            // `new` refuses only a region whose end overflows the address space.
            let region = GuestRegionMmap::new(mapping, GuestAddress(start)).ok_or(Error::BadSize(size))?;
            regions.push(region);
            offset += len;
        }
        let memory = GuestMemoryMmap::from_regions(regions).map_err(Error::Regions)?;
        Ok(GuestRam { file: Some(file), size, memory, backing: Backing::PrivateFile })
    }

    /// The guest memory map, for loaders and device models.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// The memfd, for sharing with a vhost-user front-end. Region `i` of
    /// [`layout::ram_regions`] starts at the sum of the sizes of the regions before it.
    /// `None` for RAM restored privately from a snapshot and for anonymous RAM (see the
    /// module docs).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self.backing {
            Backing::Memfd => self.file.as_ref().map(|f| f.as_fd()),
            Backing::PrivateFile | Backing::Anonymous => None,
        }
    }

    /// What the RAM is backed by.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// The backing file (memfd or snapshot file), for writing a snapshot: in it, the data of
    /// a memfd-backed RAM is exactly the pages the guest touched (`SEEK_DATA`). `None` for
    /// anonymous RAM.
    pub(crate) fn backing_file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// Total RAM in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The RAM regions as `(guest address, size, host address)`, for KVM memory slots.
    pub fn regions(&self) -> Vec<(u64, u64, u64)> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        self.memory.iter().map(|r| (r.start_addr().0, r.len(), r.as_ptr() as u64)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn ram_is_shared_through_the_memfd() {
        let ram = GuestRam::new(2 << 20).unwrap();
        ram.memory().write_obj(0xdead_beefu32, GuestAddress(0x1000)).unwrap();
        let mut buf = [0u8; 4];
        let file = File::from(ram.fd().unwrap().try_clone_to_owned().unwrap());
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 0x1000).unwrap();
        assert_eq!(u32::from_le_bytes(buf), 0xdead_beef);
    }

    #[test]
    fn the_memfd_cannot_be_shrunk_or_grown() {
        let ram = GuestRam::new(1 << 20).unwrap();
        let file = File::from(ram.fd().unwrap().try_clone_to_owned().unwrap());
        assert!(file.set_len(4096).is_err());
        assert!(file.set_len(4 << 20).is_err());
        assert_eq!(file.metadata().unwrap().len(), 1 << 20);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(GuestRam::new(0), Err(Error::BadSize(0))));
        assert!(matches!(GuestRam::new(4097), Err(Error::BadSize(4097))));
    }

    #[test]
    fn a_snapshot_file_is_mapped_copy_on_write() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 1 << 20]).unwrap();
        let ram = GuestRam::from_snapshot(file.try_clone().unwrap(), 1 << 20).unwrap();
        assert!(ram.fd().is_none(), "private RAM has no fd to share");
        assert_eq!(ram.backing(), Backing::PrivateFile);
        assert_eq!(ram.memory().read_obj::<u8>(GuestAddress(0x1234)).unwrap(), 7);
        ram.memory().write_obj(9u8, GuestAddress(0x1234)).unwrap();
        assert_eq!(ram.memory().read_obj::<u8>(GuestAddress(0x1234)).unwrap(), 9);
        let mut buf = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 0x1234).unwrap();
        assert_eq!(buf, [7], "the guest's write did not reach the file");
        assert!(matches!(GuestRam::from_snapshot(file, 2 << 20), Err(Error::FileSize { .. })));
    }

    #[test]
    fn anonymous_ram_is_mergeable_and_has_no_fd() {
        let ram = GuestRam::anonymous(4 << 20).unwrap();
        assert_eq!(ram.backing(), Backing::Anonymous);
        assert!(ram.fd().is_none(), "anonymous RAM has no fd to share");
        assert!(ram.backing_file().is_none());
        assert_eq!(ram.size(), 4 << 20);
        assert_eq!(ram.memory().read_obj::<u64>(GuestAddress(0x3f_f000)).unwrap(), 0, "zero-filled");
        ram.memory().write_obj(0xfeed_f00du32, GuestAddress(0x2000)).unwrap();
        assert_eq!(ram.memory().read_obj::<u32>(GuestAddress(0x2000)).unwrap(), 0xfeed_f00d);
        let (_, _, host) = ram.regions()[0];
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{host:x}-");
        // The VMA's block runs from its header line to its `VmFlags:` line (each block's last).
        let flags = smaps
            .lines()
            .skip_while(|l| !l.starts_with(&header))
            .find(|l| l.starts_with("VmFlags:"))
            .expect("the mapping's VMA is in smaps");
        assert!(flags.split_whitespace().any(|f| f == "mg"), "VMA not marked mergeable: {flags}");
        assert!(matches!(GuestRam::anonymous(4097), Err(Error::BadSize(4097))));
    }

    #[test]
    fn regions_report_host_addresses() {
        let ram = GuestRam::new(1 << 20).unwrap();
        let regions = ram.regions();
        assert_eq!(regions.len(), 1);
        assert_eq!((regions[0].0, regions[0].1), (0, 1 << 20));
        assert_ne!(regions[0].2, 0);
    }
}

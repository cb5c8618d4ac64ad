//! What a virtio-blk disk is read from and written to.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use nix::fcntl::{fallocate, FallocateFlags};

/// Storage behind a virtio-blk device. Reads take `&self` so a shared,
/// read-only view (the image's erofs view) serves several devices.
pub trait BlockBackend: Send + Sync {
    /// Size of the disk in bytes.
    fn len(&self) -> u64;

    /// Whether the disk is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (0 only at the end of the disk).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes up to `buf.len()` bytes at `offset`; returns how many were
    /// written. A read-only backend returns an error.
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<usize>;

    /// Makes completed writes durable.
    fn flush(&self) -> io::Result<()>;

    /// Whether the disk refuses writes (the device then offers VIRTIO_BLK_F_RO).
    fn read_only(&self) -> bool;

    /// Whether [`Self::discard`] works (the device then offers DISCARD and
    /// WRITE_ZEROES).
    fn can_discard(&self) -> bool {
        false
    }

    /// Drops `len` bytes at `offset`: they read as zeros afterwards (a
    /// sparse file gives the space back).
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A read-only disk whose content comes from `read` (an image's erofs view,
/// synthesized from the pool on demand): writes fail with EROFS, flush has
/// nothing to do.
pub struct ReadOnlyBackend<F> {
    len: u64,
    read: F,
}

impl<F: Fn(u64, &mut [u8]) -> io::Result<usize> + Send + Sync> ReadOnlyBackend<F> {
    /// A disk of `len` bytes read through `read(offset, buf)`.
    pub fn new(len: u64, read: F) -> Self {
        Self { len, read }
    }
}

impl<F: Fn(u64, &mut [u8]) -> io::Result<usize> + Send + Sync> BlockBackend for ReadOnlyBackend<F> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (self.read)(offset, buf)
    }

    fn write_at(&self, _offset: u64, _buf: &[u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn read_only(&self) -> bool {
        true
    }
}

/// A disk in a host file (the sandbox's sparse scratch disk), read and
/// written with `pread`/`pwrite`. Its size is fixed at open.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    len: u64,
    read_only: bool,
}

impl FileBackend {
    /// A disk of `file`'s current size; writes fail if `read_only`.
    pub fn new(file: File, read_only: bool) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Self { file, len, read_only })
    }
}

impl BlockBackend for FileBackend {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<usize> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.file.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn can_discard(&self) -> bool {
        !self.read_only
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        let mode = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        fallocate(self.file.as_raw_fd(), mode, offset, len).map_err(io::Error::from)
    }
}

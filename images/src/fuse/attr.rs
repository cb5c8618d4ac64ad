//! Index inodes as FUSE attributes: inode numbers, file types, owners, times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use crate::pool::index::{Data, Ino, Inode, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT};

/// How long the kernel may cache entries and attributes (and negative lookups). Images never
/// change while mounted, so this only bounds how long the kernel keeps what it looked up.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// `st_blksize` reported for every inode.
const BLKSIZE: u32 = 4096;

/// How the image's own uids and gids are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdMap {
    /// Add `n` to every uid and gid: a root broker's sandboxes map ids 0..65536 of their user
    /// namespace onto `n..n + 65536` of the host.
    Shift(u32),
    /// Show every file as owned by this uid and gid: a non-root broker's sandboxes map only the
    /// broker's own ids (to root).
    Owner(u32, u32),
}

impl IdMap {
    pub fn uid(self, uid: u32) -> u32 {
        match self {
            IdMap::Shift(n) => uid.saturating_add(n),
            IdMap::Owner(owner, _) => owner,
        }
    }

    pub fn gid(self, gid: u32) -> u32 {
        match self {
            IdMap::Shift(n) => gid.saturating_add(n),
            IdMap::Owner(_, group) => group,
        }
    }
}

/// The FUSE inode number of an index inode.
pub(crate) fn fuse_ino(ino: Ino) -> INodeNo {
    INodeNo(u64::from(ino) + 1)
}

/// The index inode of a FUSE inode number (None for 0 or out of range).
pub(crate) fn index_ino(ino: INodeNo) -> Option<Ino> {
    ino.0.checked_sub(1).and_then(|i| Ino::try_from(i).ok())
}

/// The FUSE file type of a `st_mode`.
pub(crate) fn file_type(mode: u32) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        S_IFCHR => FileType::CharDevice,
        S_IFBLK => FileType::BlockDevice,
        S_IFIFO => FileType::NamedPipe,
        _ => FileType::RegularFile,
    }
}

/// Seconds since the epoch as a `SystemTime` (before the epoch too).
fn time(secs: i64) -> SystemTime {
    let d = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// A `dev_t` (glibc encoding, as the index stores it) in the kernel's 32-bit encoding, which
/// FUSE carries (`new_encode_dev`).
fn fuse_rdev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The attributes of index inode `ino`.
pub(crate) fn attr(ino: Ino, inode: &Inode, ids: IdMap) -> FileAttr {
    let size = inode.size();
    let t = time(inode.mtime);
    FileAttr {
        ino: fuse_ino(ino),
        size,
        blocks: size.div_ceil(512),
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: file_type(inode.mode),
        perm: (inode.mode & 0o7777) as u16,
        nlink: inode.nlink,
        uid: ids.uid(inode.uid),
        gid: ids.gid(inode.gid),
        rdev: match inode.data {
            Data::Device { rdev } => fuse_rdev(rdev),
            _ => 0,
        },
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// Attributes with inode number 0: as a lookup reply, a negative entry the kernel caches for
/// its TTL (no new LOOKUP for a name that does not exist).
pub(crate) fn negative() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_inode_numbers() {
        assert_eq!(IdMap::Shift(100_000).uid(0), 100_000);
        assert_eq!(IdMap::Shift(100_000).gid(65_535), 165_535);
        assert_eq!(IdMap::Owner(1000, 1001).uid(0), 1000);
        assert_eq!(IdMap::Owner(1000, 1001).gid(42), 1001);
        assert_eq!(fuse_ino(0), INodeNo(1));
        assert_eq!(index_ino(INodeNo(1)), Some(0));
        assert_eq!(index_ino(INodeNo(0)), None);
        assert_eq!(index_ino(INodeNo(u64::MAX)), None);
    }

    #[test]
    fn device_numbers_use_the_kernel_encoding() {
        // /dev/null is 1:3, /dev/tty 5:0; a large minor spills above bit 20.
        assert_eq!(fuse_rdev(libc::makedev(1, 3)), 0x103);
        assert_eq!(fuse_rdev(libc::makedev(5, 0)), 0x500);
        assert_eq!(fuse_rdev(libc::makedev(8, 0x1234)), 0x34 | (8 << 8) | (0x1200 << 12));
    }

    #[test]
    fn times_before_the_epoch() {
        assert_eq!(time(-5), UNIX_EPOCH - Duration::from_secs(5));
        assert_eq!(time(7), UNIX_EPOCH + Duration::from_secs(7));
    }
}

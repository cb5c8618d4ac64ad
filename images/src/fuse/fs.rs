//! [`ImageFs`]: the FUSE file system of one image.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use super::attr::{attr, file_type, fuse_ino, index_ino, negative, IdMap, TTL};
use super::prefetch::Prefetch;
use super::xattr::{self, Answer};
use crate::pool::index::{Data, Ino, Inode};
use crate::pool::view::ImageView;

/// Read-ahead the kernel is asked for (it may offer less; then what it offers).
const READAHEAD: u32 = 1 << 20;
/// Block size reported by statfs.
const STATFS_BSIZE: u32 = 4096;
/// Longest name statfs reports.
const NAME_MAX: u32 = 255;

/// How `open`/`opendir` are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Reply to every open with `FOPEN_KEEP_CACHE` (and directories with `FOPEN_CACHE_DIR`
    /// too), so the kernel keeps page cache and directory listings across opens. Every open and
    /// close still costs a round trip (OPEN, RELEASE).
    KeepCache,
    /// Reply `ENOSYS` to the first open and opendir: the kernel then never sends OPEN, OPENDIR,
    /// RELEASE or RELEASEDIR again and treats every file as opened with `FOPEN_KEEP_CACHE`
    /// (directories with `FOPEN_CACHE_DIR` too). Needs a kernel with no-open support (4.18 for
    /// files, 5.1 for directories); without it [`ImageFs`] falls back to `KeepCache`.
    ///
    /// The default of `pvisor-imaged`: on python-3.11-slim, a warm `find | xargs cat` of the
    /// whole tree takes 163 ms with it and 416 ms with `KeepCache` (a plain directory: 172 ms).
    NoOpen,
}

/// One image, served read-only. Stateless beyond the view: file handles are unused (0) and
/// inode lookup counts are not tracked, since every inode lives as long as the image.
pub struct ImageFs {
    view: Arc<ImageView>,
    prefetch: Prefetch,
    ids: IdMap,
    open_mode: OpenMode,
    /// Whether any inode has an xattr. If none has, GETXATTR and LISTXATTR
    /// are answered ENOSYS once and the kernel never asks again: every
    /// exec's `security.capability` lookup and the overlay's xattr checks on
    /// each lower directory would otherwise cost a round trip each.
    has_xattrs: bool,
}

impl ImageFs {
    pub fn new(view: ImageView, ids: IdMap, open_mode: OpenMode) -> ImageFs {
        let has_xattrs = view.index().inodes.iter().any(|i| !i.xattrs.is_empty());
        let prefetch = Prefetch::new(view.index().inodes.len());
        ImageFs { view: Arc::new(view), prefetch, ids, open_mode, has_xattrs }
    }

    /// What [`super::prefetch::start`] needs once the session is mounted.
    pub fn prefetch_parts(&self) -> (Arc<std::sync::OnceLock<std::sync::mpsc::SyncSender<Ino>>>, Arc<ImageView>) {
        (self.prefetch.slot(), self.view.clone())
    }

    /// The open mode in effect (after `init`, what the kernel supports).
    pub fn open_mode(&self) -> OpenMode {
        self.open_mode
    }

    fn inode(&self, ino: INodeNo) -> Result<(Ino, &Inode), Errno> {
        let i = index_ino(ino).ok_or(Errno::ENOENT)?;
        self.view.index().inode(i).map(|inode| (i, inode)).ok_or(Errno::ENOENT)
    }

    fn entry(&self, parent: INodeNo, name: &OsStr) -> Result<Option<(Ino, &Inode)>, Errno> {
        let (dir, inode) = self.inode(parent)?;
        if !inode.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(self.view.index().lookup(dir, name.as_bytes()).and_then(|i| Some((i, self.view.index().inode(i)?))))
    }

    /// The entries of directory `ino` from position `offset` on: `.`, `..`, then the index's
    /// entries, each with the offset of the one after it (what readdir hands back to resume).
    fn dir_entries(&self, ino: INodeNo, offset: u64) -> Result<impl Iterator<Item = (u64, &[u8], Ino)>, Errno> {
        let (dir, inode) = self.inode(ino)?;
        let Data::Dir { parent, entries } = &inode.data else {
            return Err(Errno::ENOTDIR);
        };
        let dots = [(b".".as_slice(), dir), (b"..".as_slice(), *parent)];
        let all = dots.into_iter().chain(entries.iter().map(|e| (e.name.as_slice(), e.ino)));
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        Ok(all.enumerate().skip(start).map(|(pos, (name, i))| (pos as u64 + 1, name, i)))
    }

    fn read_file(&self, ino: INodeNo, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let (i, inode) = self.inode(ino)?;
        let Data::File { size: file_size, .. } = inode.data else {
            return Err(if inode.is_dir() { Errno::EISDIR } else { Errno::EINVAL });
        };
        let len = file_size.saturating_sub(offset).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        let n = self.view.read(i, offset, &mut buf).map_err(|e| {
            tracing::error!(ino = i, offset, "reading image content: {e}");
            Errno::EIO
        })?;
        buf.truncate(n);
        Ok(buf)
    }

    fn opened(&self, reply: ReplyOpen, flags: FopenFlags) {
        match self.open_mode {
            OpenMode::NoOpen => reply.error(Errno::ENOSYS),
            OpenMode::KeepCache => reply.opened(FileHandle(0), flags),
        }
    }
}

impl Filesystem for ImageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let readahead = match config.set_max_readahead(READAHEAD) {
            Ok(_) => READAHEAD,
            Err(max) => {
                let _ = config.set_max_readahead(max);
                max
            }
        };
        // Ask for what helps a read-only tree and that the kernel supports; each is optional.
        let wanted = [
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ];
        for flags in wanted {
            let _ = config.add_capabilities(flags);
        }
        let no_open = InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        if self.open_mode == OpenMode::NoOpen && !config.capabilities().contains(no_open) {
            self.open_mode = OpenMode::KeepCache;
        }
        let _ = config.set_time_granularity(std::time::Duration::from_secs(1));
        tracing::debug!(readahead, open_mode = ?self.open_mode, "FUSE session initialized");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.entry(parent, name) {
            Ok(Some((i, inode))) => reply.entry(&TTL, &attr(i, inode, self.ids), Generation(0)),
            Ok(None) => reply.entry(&TTL, &negative(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.inode(ino) {
            Ok((i, inode)) => reply.attr(&TTL, &attr(i, inode, self.ids)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.inode(ino) {
            Ok((_, Inode { data: Data::Symlink { target }, .. })) => reply.data(target),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.inode(ino) {
            Ok(_) => self.opened(reply, FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_file(ino, offset, size) {
            Ok(data) => {
                reply.data(&data);
                if let Some(i) = index_ino(ino) {
                    self.prefetch.first_read(&self.view, i, offset + data.len() as u64);
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.inode(ino) {
            Ok((_, inode)) if inode.is_dir() => {
                self.opened(reply, FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR)
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.dir_entries(ino, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (next, name, i) in entries {
            let kind = self.view.index().inode(i).map_or(fuser::FileType::RegularFile, |n| file_type(n.mode));
            if reply.add(fuse_ino(i), next, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let entries = match self.dir_entries(ino, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (next, name, i) in entries {
            let Some(inode) = self.view.index().inode(i) else { continue };
            let a = attr(i, inode, self.ids);
            if reply.add(fuse_ino(i), next, OsStr::from_bytes(name), &TTL, &a, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let index = self.view.index();
        let blocks = index.logical_size().div_ceil(u64::from(STATFS_BSIZE));
        reply.statfs(blocks, 0, 0, index.inodes.len() as u64, 0, STATFS_BSIZE, NAME_MAX, STATFS_BSIZE);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.has_xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let value = match self.inode(ino) {
            Ok((_, inode)) => xattr::get(inode, name.as_bytes()),
            Err(e) => return reply.error(e),
        };
        let Some(value) = value else { return reply.error(Errno::NO_XATTR) };
        match xattr::answer(value.len(), size) {
            Ok(Answer::Size(n)) => reply.size(n),
            Ok(Answer::Data) => reply.data(value),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.has_xattrs {
            return reply.error(Errno::ENOSYS);
        }
        let names = match self.inode(ino) {
            Ok((_, inode)) => xattr::list(inode),
            Err(e) => return reply.error(e),
        };
        match xattr::answer(names.len(), size) {
            Ok(Answer::Size(n)) => reply.size(n),
            Ok(Answer::Data) => reply.data(&names),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks modes itself; this only adds read-only.
        match self.inode(ino) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => reply.error(Errno::EROFS),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // --- Everything that would change the image: EROFS -------------------------------------

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, _target: &Path, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }
}

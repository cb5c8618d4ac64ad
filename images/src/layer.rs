//! Applying layer tarballs, in order, to a fresh tree: files, directories,
//! links, device nodes, modes, owners, mtimes and overlay-style whiteouts.
//!
//! All lookups go through [`crate::safepath`], so whatever symlinks earlier
//! layers created, nothing is ever written outside the tree. File data is
//! streamed. Directory modes and mtimes are applied at the end (children
//! first), so a read-only directory can still be filled by later layers.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstatat, futimens, makedev, mkdirat, mknodat, utimensat, FchmodatFlags, FileStat, Mode, SFlag,
    UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, Gid, Uid};
use tar::EntryType;

use crate::archive::{Budget, BudgetReader, EXTENSION_BUDGET, MAX_ENTRY_SIZE};
use crate::error::{Error, Result};
use crate::fsops;
use crate::safepath::{self, EnsureError};

/// Ids inside the image must be below this when shifting (one user namespace range).
pub(crate) const ID_RANGE: u64 = 65536;
/// Non-file entries may carry a little data (ignored); more is refused.
const MAX_SPECIAL_DATA: u64 = 1 << 20;
const COPY_BUF: usize = 256 << 10;
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// Deferred directory metadata.
#[derive(Clone, Copy)]
struct DirMeta {
    mode: u32,
    mtime: i64,
}

/// Header fields that matter.
#[derive(Clone, Copy)]
struct Meta {
    uid: u64,
    gid: u64,
    mode: u32,
    mtime: i64,
}

/// Builds one image tree from its layers.
pub(crate) struct TreeBuilder {
    path: PathBuf,
    root: OwnedFd,
    shift: Option<u32>,
    privileged: bool,
    dirs: BTreeMap<PathBuf, DirMeta>,
    buf: Vec<u8>,
}

/// Context of the entry being applied, for error messages.
struct Ctx<'a> {
    entry: &'a str,
    layer: &'a str,
}

impl Ctx<'_> {
    fn unsafe_(&self, reason: impl std::fmt::Display) -> Error {
        Error::unsafe_entry(self.entry, format!("{reason} (layer {})", self.layer))
    }
    fn bad(&self, reason: impl std::fmt::Display) -> Error {
        Error::bad(Some(self.entry), format!("{reason} (layer {})", self.layer))
    }
    /// Maps a failed system call: structural problems are archive errors,
    /// the rest (ENOSPC, EIO, ...) I/O errors on the tree.
    fn sys(&self, op: &str, tree: &Path, e: Errno) -> Error {
        match e {
            Errno::EXDEV => self.unsafe_(format!("{op}: path resolution left the image tree")),
            Errno::ELOOP => self.bad(format!("{op}: too many levels of symbolic links")),
            Errno::ENOTDIR | Errno::EISDIR | Errno::ENAMETOOLONG | Errno::EEXIST | Errno::EMLINK | Errno::EINVAL => {
                self.bad(format!("{op}: {}", e.desc()))
            }
            _ => Error::io(
                tree.join(self.entry.trim_start_matches('/')),
                io::Error::other(format!("{op} (layer {}): {}", self.layer, e.desc())),
            ),
        }
    }
}

fn kind_of(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn path_of(comps: &[OsString]) -> PathBuf {
    comps.iter().collect()
}

fn timespec(secs: i64) -> TimeSpec {
    TimeSpec::new(secs, 0)
}

impl TreeBuilder {
    /// Starts a tree in the existing empty directory `path`.
    pub(crate) fn new(path: &Path, shift: Option<u32>, privileged: bool) -> Result<Self> {
        let dir = File::open(path).map_err(|e| Error::io(path, e))?;
        let root = OwnedFd::from(dir);
        if let Some(s) = shift {
            fchown(root.as_raw_fd(), Some(Uid::from_raw(s)), Some(Gid::from_raw(s))).map_err(|e| Error::io(path, e))?;
        }
        fchmod(root.as_raw_fd(), Mode::from_bits_truncate(0o755)).map_err(|e| Error::io(path, e))?;
        Ok(TreeBuilder {
            path: path.to_path_buf(),
            root,
            shift,
            privileged,
            dirs: BTreeMap::new(),
            buf: vec![0; COPY_BUF],
        })
    }

    /// Applies one uncompressed layer tar stream.
    ///
    /// `plain_size` is the stream's total size when known (uncompressed
    /// blobs), used to refuse entries claiming more data than there is.
    pub(crate) fn apply_layer<R: Read>(&mut self, reader: R, layer: &str, plain_size: Option<u64>) -> Result<()> {
        let budget = Budget::new();
        let mut archive = tar::Archive::new(BudgetReader::new(reader, budget.clone()));
        let mut entries = archive.entries().map_err(|e| Error::bad(None, format!("layer {layer}: {e}")))?;
        // Paths (and their parents) created or kept by this layer: an opaque
        // marker removes everything else in its directory.
        let mut touched: HashSet<PathBuf> = HashSet::new();
        loop {
            budget.limit(EXTENSION_BUDGET);
            let next = entries.next();
            budget.unlimited();
            let mut entry = match next {
                None => break,
                Some(Ok(e)) => e,
                Some(Err(e)) if budget.exceeded() => {
                    return Err(Error::unsafe_entry(
                        "<tar extension header>",
                        format!("long-name/PAX header data over {EXTENSION_BUDGET} bytes (layer {layer}): {e}"),
                    ))
                }
                Some(Err(e)) => return Err(Error::bad(None, format!("layer {layer}: {e}"))),
            };
            let raw_path = entry.path_bytes().into_owned();
            let name = String::from_utf8_lossy(&raw_path).into_owned();
            let ctx = Ctx { entry: &name, layer };
            self.apply_entry(&mut entry, &raw_path, &ctx, plain_size, &mut touched)?;
        }
        Ok(())
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw_path: &[u8],
        ctx: &Ctx<'_>,
        plain_size: Option<u64>,
        touched: &mut HashSet<PathBuf>,
    ) -> Result<()> {
        let size = entry.size();
        if size > MAX_ENTRY_SIZE {
            return Err(ctx.unsafe_(format!("declared size {size} exceeds the {MAX_ENTRY_SIZE}-byte limit")));
        }
        if let Some(total) = plain_size {
            // Sparse entries store less than their size; check what is stored.
            let stored = if entry.header().entry_type().is_gnu_sparse() {
                entry.header().entry_size().unwrap_or(u64::MAX)
            } else {
                size
            };
            let end = entry.raw_file_position().checked_add(stored);
            if !matches!(end, Some(end) if end <= total) {
                return Err(ctx.unsafe_(format!("declared size {size} exceeds the remaining layer data")));
            }
        }
        let comps = safepath::clean(raw_path).map_err(|r| ctx.unsafe_(r))?;
        let kind = entry.header().entry_type();
        let meta = entry_meta(entry).map_err(|e| ctx.bad(format!("bad header: {e}")))?;

        if let Some(last) = comps.last() {
            let last = last.as_bytes();
            if last.starts_with(WHITEOUT_PREFIX) {
                drain_special(entry, ctx)?;
                let parent = &comps[..comps.len() - 1];
                if last == OPAQUE_MARKER {
                    mark_touched(touched, parent);
                    return self.opaque(parent, touched, ctx);
                }
                if last.starts_with(b".wh..wh.") {
                    tracing::debug!(entry = ctx.entry, "ignoring aufs metadata entry");
                    return Ok(());
                }
                let target = OsStr::from_bytes(&last[WHITEOUT_PREFIX.len()..]);
                if target.is_empty() || target == "." || target == ".." {
                    return Err(ctx.unsafe_("whiteout names no valid entry"));
                }
                return self.whiteout(parent, target, ctx);
            }
        }

        match kind {
            EntryType::Directory => {
                mark_touched(touched, &comps);
                self.make_dir(&comps, meta, ctx)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                mark_touched(touched, &comps);
                self.make_file(&comps, meta, entry, ctx)?;
                return Ok(());
            }
            EntryType::Symlink => {
                mark_touched(touched, &comps);
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| ctx.bad("symlink without a target"))?;
                if target.contains(&0) {
                    return Err(ctx.bad("symlink target contains a NUL byte"));
                }
                self.make_symlink(&comps, &target, meta, ctx)?;
            }
            EntryType::Link => {
                mark_touched(touched, &comps);
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| ctx.bad("hardlink without a target"))?;
                self.make_hardlink(&comps, &target, ctx)?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                mark_touched(touched, &comps);
                self.make_node(&comps, kind, entry, meta, ctx)?;
            }
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {}
            other => tracing::warn!(entry = ctx.entry, "skipping unsupported tar entry type {other:?}"),
        }
        drain_special(entry, ctx)
    }

    fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Resolves (creating if needed) the parent directory of `comps`.
    fn parent(&self, comps: &[OsString], ctx: &Ctx<'_>) -> Result<OwnedFd> {
        self.ensure(&comps[..comps.len().saturating_sub(1)], ctx)
    }

    /// Resolves (creating if needed) the directory `dir`.
    fn ensure(&self, dir: &[OsString], ctx: &Ctx<'_>) -> Result<OwnedFd> {
        let shift = self.shift;
        let tree = self.path.clone();
        let mut on_create = |dir: BorrowedFd<'_>, name: &OsStr| -> Result<()> {
            // Implicit directories: root-owned 0755, as container runtimes do.
            fchmodat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755), FchmodatFlags::FollowSymlink)
                .map_err(|e| ctx.sys("chmod", &tree, e))?;
            if let Some(s) = shift {
                fchownat(
                    Some(dir.as_raw_fd()),
                    name,
                    Some(Uid::from_raw(s)),
                    Some(Gid::from_raw(s)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| ctx.sys("chown", &tree, e))?;
            }
            Ok(())
        };
        safepath::ensure_dir(self.root(), dir, &mut on_create).map_err(|e| match e {
            EnsureError::Sys(errno) => ctx.sys("resolving the parent directory", &self.path, errno),
            EnsureError::Callback(err) => err,
        })
    }

    /// Removes whatever is at `name` so something new can be created there.
    fn clear(&mut self, parent: BorrowedFd<'_>, name: &OsStr, comps: &[OsString], ctx: &Ctx<'_>) -> Result<()> {
        fsops::remove_entry(parent, name).map_err(|e| ctx.sys("removing the previous entry", &self.path, e))?;
        self.forget_dirs(&path_of(comps));
        Ok(())
    }

    /// Drops deferred metadata of a removed directory and its descendants.
    fn forget_dirs(&mut self, path: &Path) {
        let doomed: Vec<PathBuf> = self
            .dirs
            .range(path.to_path_buf()..)
            .take_while(|(k, _)| k.starts_with(path))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.dirs.remove(&k);
        }
    }

    /// Owner on disk for an entry, or None when not shifting ids.
    fn owner(&self, meta: Meta, ctx: &Ctx<'_>) -> Result<Option<(Uid, Gid)>> {
        let Some(shift) = self.shift else {
            return Ok(None);
        };
        if meta.uid >= ID_RANGE || meta.gid >= ID_RANGE {
            return Err(
                ctx.unsafe_(format!("owner {}:{} is outside the mappable id range 0..{ID_RANGE}", meta.uid, meta.gid))
            );
        }
        Ok(Some((Uid::from_raw(meta.uid as u32 + shift), Gid::from_raw(meta.gid as u32 + shift))))
    }

    fn chown_at(&self, dir: BorrowedFd<'_>, name: &OsStr, meta: Meta, ctx: &Ctx<'_>) -> Result<()> {
        if let Some((uid, gid)) = self.owner(meta, ctx)? {
            fchownat(Some(dir.as_raw_fd()), name, Some(uid), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| ctx.sys("chown", &self.path, e))?;
        }
        Ok(())
    }

    fn make_dir(&mut self, comps: &[OsString], meta: Meta, ctx: &Ctx<'_>) -> Result<()> {
        let Some(name) = comps.last() else {
            // The tree root itself.
            if let Some((uid, gid)) = self.owner(meta, ctx)? {
                fchown(self.root.as_raw_fd(), Some(uid), Some(gid)).map_err(|e| ctx.sys("chown", &self.path, e))?;
            }
            self.dirs.insert(PathBuf::new(), DirMeta { mode: meta.mode, mtime: meta.mtime });
            return Ok(());
        };
        let parent = self.parent(comps, ctx)?;
        match fstatat(Some(parent.as_raw_fd()), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if kind_of(&st) == SFlag::S_IFDIR => {}
            Ok(_) => {
                self.clear(parent.as_fd(), name, comps, ctx)?;
                self.mkdir(parent.as_fd(), name, ctx)?;
            }
            Err(Errno::ENOENT) => self.mkdir(parent.as_fd(), name, ctx)?,
            Err(e) => return Err(ctx.sys("stat", &self.path, e)),
        }
        self.chown_at(parent.as_fd(), name, meta, ctx)?;
        self.dirs.insert(path_of(comps), DirMeta { mode: meta.mode, mtime: meta.mtime });
        Ok(())
    }

    fn mkdir(&self, parent: BorrowedFd<'_>, name: &OsStr, ctx: &Ctx<'_>) -> Result<()> {
        // Owner-writable until the deferred metadata pass.
        mkdirat(Some(parent.as_raw_fd()), name, Mode::from_bits_truncate(0o700))
            .map_err(|e| ctx.sys("mkdir", &self.path, e))
    }

    fn make_file<R: Read>(
        &mut self,
        comps: &[OsString],
        meta: Meta,
        entry: &mut tar::Entry<'_, R>,
        ctx: &Ctx<'_>,
    ) -> Result<()> {
        let Some(name) = comps.last() else {
            return Err(ctx.bad("a file entry cannot replace the image root"));
        };
        let parent = self.parent(comps, ctx)?;
        self.clear(parent.as_fd(), name, comps, ctx)?;
        let fd = openat(
            Some(parent.as_raw_fd()),
            name.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| ctx.sys("create", &self.path, e))?;
        // SAFETY: openat just returned this descriptor; nothing else owns it.
        let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let expected = entry.size();
        let mut written = 0u64;
        loop {
            let n = match entry.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ctx.bad(format!("reading file data: {e}"))),
            };
            file.write_all(&self.buf[..n]).map_err(|e| Error::io(self.path.join(path_of(comps)), e))?;
            written += n as u64;
        }
        if written != expected {
            return Err(ctx.bad(format!("truncated: {written} of {expected} bytes")));
        }
        if let Some((uid, gid)) = self.owner(meta, ctx)? {
            fchown(file.as_raw_fd(), Some(uid), Some(gid)).map_err(|e| ctx.sys("chown", &self.path, e))?;
        }
        // After chown, which clears setuid/setgid.
        fchmod(file.as_raw_fd(), Mode::from_bits_truncate(meta.mode)).map_err(|e| ctx.sys("chmod", &self.path, e))?;
        let t = timespec(meta.mtime);
        futimens(file.as_raw_fd(), &t, &t).map_err(|e| ctx.sys("set mtime", &self.path, e))?;
        Ok(())
    }

    fn make_symlink(&mut self, comps: &[OsString], target: &[u8], meta: Meta, ctx: &Ctx<'_>) -> Result<()> {
        let Some(name) = comps.last() else {
            return Err(ctx.bad("a symlink cannot replace the image root"));
        };
        let parent = self.parent(comps, ctx)?;
        self.clear(parent.as_fd(), name, comps, ctx)?;
        // The target is stored verbatim: it is only ever resolved inside the tree.
        symlinkat(OsStr::from_bytes(target), Some(parent.as_raw_fd()), name.as_os_str())
            .map_err(|e| ctx.sys("symlink", &self.path, e))?;
        self.chown_at(parent.as_fd(), name, meta, ctx)?;
        let t = timespec(meta.mtime);
        utimensat(Some(parent.as_raw_fd()), name.as_os_str(), &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(|e| ctx.sys("set mtime", &self.path, e))?;
        Ok(())
    }

    fn make_hardlink(&mut self, comps: &[OsString], target: &[u8], ctx: &Ctx<'_>) -> Result<()> {
        let Some(name) = comps.last() else {
            return Err(ctx.bad("a hardlink cannot replace the image root"));
        };
        let tcomps = safepath::clean(target).map_err(|r| ctx.unsafe_(format!("hardlink target: {r}")))?;
        let Some(tname) = tcomps.last() else {
            return Err(ctx.unsafe_("hardlink to the image root"));
        };
        let shown = String::from_utf8_lossy(target);
        let missing = || ctx.unsafe_(format!("hardlink target {shown:?} does not exist in the image"));
        let tparent = match safepath::open_dir(self.root(), &safepath::join(&tcomps[..tcomps.len() - 1])) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Err(missing()),
            Err(e) => return Err(ctx.sys("resolving the hardlink target", &self.path, e)),
        };
        let tstat = match fstatat(Some(tparent.as_raw_fd()), tname.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Err(missing()),
            Err(e) => return Err(ctx.sys("stat of the hardlink target", &self.path, e)),
        };
        if kind_of(&tstat) == SFlag::S_IFDIR {
            return Err(ctx.unsafe_(format!("hardlink target {shown:?} is a directory")));
        }
        let parent = self.parent(comps, ctx)?;
        if let Ok(st) = fstatat(Some(parent.as_raw_fd()), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            if st.st_dev == tstat.st_dev && st.st_ino == tstat.st_ino {
                return Ok(()); // already that very file
            }
        }
        self.clear(parent.as_fd(), name, comps, ctx)?;
        linkat(
            Some(tparent.as_raw_fd()),
            tname.as_os_str(),
            Some(parent.as_raw_fd()),
            name.as_os_str(),
            AtFlags::empty(),
        )
        .map_err(|e| ctx.sys("link", &self.path, e))
    }

    fn make_node<R: Read>(
        &mut self,
        comps: &[OsString],
        kind: EntryType,
        entry: &tar::Entry<'_, R>,
        meta: Meta,
        ctx: &Ctx<'_>,
    ) -> Result<()> {
        let Some(name) = comps.last() else {
            return Err(ctx.bad("a device node cannot replace the image root"));
        };
        let sflag = match kind {
            EntryType::Char => SFlag::S_IFCHR,
            EntryType::Block => SFlag::S_IFBLK,
            _ => SFlag::S_IFIFO,
        };
        if sflag != SFlag::S_IFIFO && !self.privileged {
            tracing::warn!(entry = ctx.entry, "not root: skipping device node");
            return Ok(());
        }
        let header = entry.header();
        let major = header.device_major().ok().flatten().unwrap_or(0);
        let minor = header.device_minor().ok().flatten().unwrap_or(0);
        let parent = self.parent(comps, ctx)?;
        self.clear(parent.as_fd(), name, comps, ctx)?;
        match mknodat(
            Some(parent.as_raw_fd()),
            name.as_os_str(),
            sflag,
            Mode::from_bits_truncate(0o600),
            makedev(major.into(), minor.into()),
        ) {
            Ok(()) => {}
            // Root without CAP_MKNOD (e.g. inside a user namespace): same as non-root.
            Err(Errno::EPERM) if sflag != SFlag::S_IFIFO => {
                tracing::warn!(entry = ctx.entry, "mknod not permitted: skipping device node");
                return Ok(());
            }
            Err(e) => return Err(ctx.sys("mknod", &self.path, e)),
        }
        self.chown_at(parent.as_fd(), name, meta, ctx)?;
        // Following is fine: the node was just created and is not a symlink.
        fchmodat(
            Some(parent.as_raw_fd()),
            name.as_os_str(),
            Mode::from_bits_truncate(meta.mode),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| ctx.sys("chmod", &self.path, e))?;
        let t = timespec(meta.mtime);
        utimensat(Some(parent.as_raw_fd()), name.as_os_str(), &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(|e| ctx.sys("set mtime", &self.path, e))
    }

    /// `.wh.<name>`: delete `<name>` (recursively) in `parent`.
    fn whiteout(&mut self, parent: &[OsString], target: &OsStr, ctx: &Ctx<'_>) -> Result<()> {
        let dir = match safepath::open_dir(self.root(), &safepath::join(parent)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(()), // nothing to hide
            Err(e) => return Err(ctx.sys("resolving a whiteout", &self.path, e)),
        };
        fsops::remove_entry(dir.as_fd(), target).map_err(|e| ctx.sys("applying a whiteout", &self.path, e))?;
        let mut gone = path_of(parent);
        gone.push(target);
        self.forget_dirs(&gone);
        Ok(())
    }

    /// `.wh..wh..opq`: remove everything in `dir` that this layer did not create.
    fn opaque(&mut self, dir: &[OsString], touched: &HashSet<PathBuf>, ctx: &Ctx<'_>) -> Result<()> {
        // The directory exists in this layer, even if no entry said so.
        self.ensure(dir, ctx)?;
        let mut stack = vec![path_of(dir)];
        while let Some(rel) = stack.pop() {
            let fd = match safepath::open_in_root(self.root(), rel.as_os_str(), OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR) => continue,
                Err(e) => return Err(ctx.sys("opening an opaque directory", &self.path, e)),
            };
            let names = fsops::list_dir(fd.as_fd()).map_err(|e| ctx.sys("listing", &self.path, e))?;
            for child in names {
                let child_rel = rel.join(&child);
                if touched.contains(&child_rel) {
                    let st = fstatat(Some(fd.as_raw_fd()), child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(|e| ctx.sys("stat", &self.path, e))?;
                    if kind_of(&st) == SFlag::S_IFDIR {
                        stack.push(child_rel);
                    }
                } else {
                    fsops::remove_entry(fd.as_fd(), &child)
                        .map_err(|e| ctx.sys("clearing an opaque directory", &self.path, e))?;
                    self.forget_dirs(&child_rel);
                }
            }
        }
        Ok(())
    }

    /// Applies deferred directory metadata and returns the tree's size in bytes.
    pub(crate) fn finish(self) -> Result<u64> {
        let size = fsops::tree_size(self.root()).map_err(|e| Error::io(&self.path, e))?;
        // Children before parents, so restrictive parent modes come last.
        for (rel, meta) in self.dirs.iter().rev() {
            let fd = match safepath::open_dir_rw(self.root(), rel.as_os_str()) {
                Ok(fd) => fd,
                // Replaced through another path spelling; nothing to do.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(Error::io(self.path.join(rel), e)),
            };
            fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(meta.mode))
                .map_err(|e| Error::io(self.path.join(rel), e))?;
            let t = timespec(meta.mtime);
            futimens(fd.as_raw_fd(), &t, &t).map_err(|e| Error::io(self.path.join(rel), e))?;
        }
        Ok(size)
    }
}

/// Marks `comps` and all its ancestors as belonging to the current layer.
fn mark_touched(touched: &mut HashSet<PathBuf>, comps: &[OsString]) {
    let mut p = PathBuf::new();
    for c in comps {
        p.push(c);
        touched.insert(p.clone());
    }
}

/// Reads (and discards) the data of a non-file entry, refusing large amounts.
fn drain_special<R: Read>(entry: &mut tar::Entry<'_, R>, ctx: &Ctx<'_>) -> Result<()> {
    let mut limited = entry.take(MAX_SPECIAL_DATA + 1);
    let n = io::copy(&mut limited, &mut io::sink()).map_err(|e| ctx.bad(format!("reading entry data: {e}")))?;
    if n > MAX_SPECIAL_DATA {
        return Err(ctx.unsafe_(format!("non-file entry carries over {MAX_SPECIAL_DATA} bytes of data")));
    }
    Ok(())
}

/// Owner, mode and mtime from the header (PAX overrides included).
fn entry_meta<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Meta> {
    let header = entry.header();
    let old = header.as_old();
    let mut meta = Meta {
        uid: numeric(header.uid(), &old.uid)?,
        gid: numeric(header.gid(), &old.gid)?,
        mode: numeric(header.mode().map(u64::from), &old.mode)? as u32 & 0o7777,
        mtime: numeric(header.mtime(), &old.mtime)?.min(i64::MAX as u64) as i64,
    };
    if let Some(exts) = entry.pax_extensions()? {
        for ext in exts.flatten() {
            if ext.key() == Ok("mtime") {
                if let Some(secs) =
                    ext.value().ok().and_then(|v| v.split('.').next()).and_then(|s| s.parse::<i64>().ok())
                {
                    meta.mtime = secs;
                }
            }
        }
    }
    Ok(meta)
}

/// A numeric header field; an empty one (all NUL/space, as some writers
/// leave it) reads as 0, like Go's archive/tar does.
fn numeric(parsed: io::Result<u64>, raw: &[u8]) -> io::Result<u64> {
    match parsed {
        Err(_) if raw.iter().all(|&b| b == 0 || b == b' ') => Ok(0),
        other => other,
    }
}

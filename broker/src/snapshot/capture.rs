//! Capturing a frozen ns sandbox's writable state as one OCI layer tar.
//!
//! Two sources, both read from the host side while the sandbox is frozen:
//! * the overlay **upper** directory (in the sandbox's state dir): files,
//!   directories, symlinks, fifos and hardlinks as they are; overlay
//!   whiteouts (char 0:0, or a `*.overlay.whiteout` xattr) become
//!   `.wh.<name>` entries and opaque directories (`*.overlay.opaque=y`)
//!   get a `.wh..wh..opq` marker, as in an OCI layer;
//! * its **`/tmp`**, a tmpfs only the sandbox's mount namespace has, read
//!   through `/proc/<init>/root/tmp`. The agent cannot be asked for it: it
//!   is frozen with the rest of the sandbox, and reading while it runs would
//!   not be the same instant as the upper. `/tmp` is written as a complete,
//!   opaque directory, so a restore shows exactly it.
//!
//! Nothing the sandbox wrote can make this read a host file: every name is
//! opened relative to its already-opened parent with `O_NOFOLLOW` (symlinks
//! are recorded, never followed; `..` is never walked), every opened file is
//! checked to be the regular file `lstat` saw, on the source's own file
//! system (no mount crossing), and owned by an id the sandbox maps (a host
//! file, e.g. one hardlinked in from outside, is not); fifos and device
//! nodes are never opened. What is left out is counted in [`CaptureStats`].
use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use pvisor_worker::config::IdMap;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use tar::{EntryType, Header};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// Overlay's private xattrs in the user (userxattr) and trusted namespaces.
const OVERLAY_XATTR_PREFIXES: [&str; 2] = ["user.overlay.", "trusted.overlay."];

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{what} {path}: {source}")]
    Sys { what: &'static str, path: String, source: nix::Error },
    #[error("writing the layer: {0}")]
    Write(#[from] io::Error),
    #[error("{path}: {reason}")]
    Changed { path: String, reason: String },
    #[error("{path}: the tree is deeper than a layer can hold ({MAX_DEPTH} levels, {MAX_PATH}-byte paths)")]
    TooDeep { path: String },
}

/// Deepest directory level a capture walks into (an open fd each).
pub const MAX_DEPTH: usize = 1024;
/// Longest layer path a capture writes (PATH_MAX: what a restore can create).
pub const MAX_PATH: usize = 4096;

/// One directory being walked: its fd, layer path and names still to do.
struct Frame {
    dir: OwnedFd,
    path: String,
    /// In reverse order (popped from the end).
    names: Vec<Vec<u8>>,
}

impl Frame {
    fn open(dir: OwnedFd, path: String, skip: &[&str]) -> Result<Self, CaptureError> {
        let dup = dir.try_clone().map_err(CaptureError::Write)?;
        let mut d = Dir::from_fd(dup.into_raw_fd()).map_err(sys("readdir", &path))?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        for e in d.iter() {
            let e = e.map_err(sys("readdir", &path))?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." && !skip.iter().any(|s| s.as_bytes() == n) {
                names.push(n.to_vec());
            }
        }
        names.sort_unstable_by(|a, b| b.cmp(a));
        Ok(Frame { dir, path, names })
    }
}

/// The first and last bytes of a long path, for a message.
fn abbreviate(path: &str) -> String {
    if path.len() <= 200 {
        return path.to_owned();
    }
    let mut head = 80;
    while !path.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = path.len() - 80;
    while !path.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…{}", &path[..head], &path[tail..])
}

/// What a capture wrote and left out.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct CaptureStats {
    pub entries: u64,
    pub file_bytes: u64,
    pub whiteouts: u64,
    /// Device nodes and sockets (a sandbox can make neither usefully).
    pub skipped_special: u64,
    /// Entries owned by ids the sandbox does not map, or on another file
    /// system: not the sandbox's, never read.
    pub skipped_foreign: u64,
}

/// Where a sandbox's writable state is.
pub struct Sources<'a> {
    /// The overlay upper directory.
    pub upper: &'a Path,
    /// `/proc/<init>/root` of the sandbox, when its `/tmp` is a tmpfs of its
    /// own (else `/tmp` is in the upper like any directory).
    pub sandbox_root: Option<&'a Path>,
    /// The sandbox's id map (host ids ↦ ids in the layer).
    pub ids: IdMap,
}

/// Which source a walk reads (overlay markers mean something only in upper).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Upper,
    Tmp,
}

struct Walker<W: io::Write> {
    out: tar::Builder<W>,
    ids: IdMap,
    dev: u64,
    source: Source,
    /// First layer path of each (dev, ino) with more than one link.
    links: HashMap<(u64, u64), String>,
    stats: CaptureStats,
}

fn sys<'a>(what: &'static str, path: &'a str) -> impl FnOnce(nix::Error) -> CaptureError + 'a {
    move |source| CaptureError::Sys { what, path: path.to_owned(), source }
}

/// Opens a directory of the walk without following a symlink.
fn open_dir(parent: BorrowedFd<'_>, name: &CStr, path: &str) -> Result<OwnedFd, CaptureError> {
    let fd = openat(
        Some(parent.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys("open", path))?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one xattr of an open fd (None when absent).
fn get_xattr(fd: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 256];
    // SAFETY: fd is open for the call; cname is NUL-terminated; buf is valid
    // for buf.len() bytes and the kernel writes at most that many.
    let n = unsafe { libc::fgetxattr(fd.as_raw_fd(), cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// The `user.*` xattrs worth keeping (overlay's own left out), as PAX records.
fn user_xattrs(fd: BorrowedFd<'_>) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 4096];
    // SAFETY: fd is open; names is valid for names.len() bytes.
    let n = unsafe { libc::flistxattr(fd.as_raw_fd(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    names.truncate(n as usize);
    names
        .split(|b| *b == 0)
        .filter_map(|n| std::str::from_utf8(n).ok())
        .filter(|n| n.starts_with("user.") && !OVERLAY_XATTR_PREFIXES.iter().any(|p| n.starts_with(p)))
        .filter_map(|n| get_xattr(fd, n).map(|v| (n.to_owned(), v)))
        .collect()
}

fn overlay_flag(fd: BorrowedFd<'_>, what: &str) -> bool {
    OVERLAY_XATTR_PREFIXES.iter().any(|p| get_xattr(fd, &format!("{p}{what}")).is_some_and(|v| v == b"y"))
}

fn overlay_present(fd: BorrowedFd<'_>, what: &str) -> bool {
    OVERLAY_XATTR_PREFIXES.iter().any(|p| get_xattr(fd, &format!("{p}{what}")).is_some())
}

impl<W: io::Write> Walker<W> {
    /// Layer ids of a host owner, or None when the sandbox does not map it.
    fn map_ids(&self, st: &FileStat) -> Option<(u64, u64)> {
        let m = &self.ids;
        let uid = st.st_uid.checked_sub(m.uid_base).filter(|u| *u < m.count)?;
        let gid = st.st_gid.checked_sub(m.gid_base).filter(|g| *g < m.count)?;
        Some((u64::from(uid), u64::from(gid)))
    }

    fn header(&self, kind: EntryType, st: &FileStat, ids: (u64, u64)) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(st.st_mode & 0o7777);
        h.set_uid(ids.0);
        h.set_gid(ids.1);
        h.set_mtime(st.st_mtime.max(0) as u64);
        h.set_size(0);
        h
    }

    fn xattrs(&mut self, fd: BorrowedFd<'_>) -> Result<(), CaptureError> {
        let xs = user_xattrs(fd);
        if !xs.is_empty() {
            let recs: Vec<(String, Vec<u8>)> = xs.into_iter().map(|(k, v)| (format!("SCHILY.xattr.{k}"), v)).collect();
            self.out.append_pax_extensions(recs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        Ok(())
    }

    /// A symlink or hardlink entry with its target byte for byte (the tar
    /// crate's path handling would normalize it: `/` would become `//`,
    /// `a/./b` `a/b`); targets over 100 bytes go in a PAX `linkpath`.
    fn append_link(&mut self, mut h: Header, path: &str, target: &[u8]) -> Result<(), CaptureError> {
        if target.len() <= 100 {
            h.set_link_name_literal(target)?;
        } else {
            self.out.append_pax_extensions([("linkpath", target)])?;
        }
        self.out.append_data(&mut h, path, io::empty())?;
        Ok(())
    }

    fn whiteout(&mut self, parent: &str, name: &str, st: &FileStat) -> Result<(), CaptureError> {
        let mut h = self.header(EntryType::Regular, st, (0, 0));
        h.set_mode(0o600);
        self.out.append_data(&mut h, format!("{parent}{WHITEOUT_PREFIX}{name}"), io::empty())?;
        self.stats.whiteouts += 1;
        Ok(())
    }

    /// Writes the directory `dir` (already opened, at layer path `path`,
    /// which ends in `/` or is empty for the root) and everything under it.
    /// Iterative (an explicit stack of open directories, never recursion):
    /// the sandbox shaped this tree. Depth and path length are bounded
    /// ([`MAX_DEPTH`], [`MAX_PATH`]); past them the capture fails.
    fn walk(&mut self, dir: OwnedFd, path: &str, skip_top: &[&str]) -> Result<(), CaptureError> {
        let mut stack = vec![Frame::open(dir, path.to_owned(), skip_top)?];
        loop {
            let depth = stack.len();
            let Some(top) = stack.last_mut() else { break };
            let Some(raw) = top.names.pop() else {
                stack.pop();
                continue;
            };
            let name = String::from_utf8_lossy(&raw).into_owned();
            let cname = CString::new(raw).map_err(|e| CaptureError::Write(io::Error::other(e)))?;
            let child = format!("{}{name}", top.path);
            if child.len() > MAX_PATH || depth > MAX_DEPTH {
                return Err(CaptureError::TooDeep { path: abbreviate(&child) });
            }
            if let Some((fd, dir_path)) = self.entry(top.dir.as_fd(), &cname, &name, &top.path, &child)? {
                stack.push(Frame::open(fd, dir_path, &[])?);
            }
        }
        Ok(())
    }

    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        cname: &CStr,
        name: &str,
        parent: &str,
        path: &str,
    ) -> Result<Option<(OwnedFd, String)>, CaptureError> {
        let st = fstatat(Some(dir.as_raw_fd()), cname, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(sys("lstat", path))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFCHR && st.st_rdev == 0 && self.source == Source::Upper {
            return self.whiteout(parent, name, &st).map(|()| None);
        }
        if st.st_dev != self.dev {
            self.stats.skipped_foreign += 1;
            return Ok(None);
        }
        let Some(ids) = self.map_ids(&st) else {
            self.stats.skipped_foreign += 1;
            return Ok(None);
        };
        self.stats.entries += 1;
        match kind {
            SFlag::S_IFDIR => {
                let fd = open_dir(dir, cname, path)?;
                check_same(&fd, &st, path)?;
                let dir_path = format!("{path}/");
                self.xattrs(fd.as_fd())?;
                let mut h = self.header(EntryType::Directory, &st, ids);
                self.out.append_data(&mut h, &dir_path, io::empty())?;
                if self.source == Source::Upper && overlay_flag(fd.as_fd(), "opaque") {
                    self.opaque(&dir_path, &st)?;
                }
                return Ok(Some((fd, dir_path)));
            }
            SFlag::S_IFREG => self.file(dir, cname, name, parent, path, &st, ids)?,
            SFlag::S_IFLNK => {
                let target = readlinkat(Some(dir.as_raw_fd()), cname).map_err(sys("readlink", path))?;
                let h = self.header(EntryType::Symlink, &st, ids);
                self.append_link(h, path, target.as_bytes())?
            }
            SFlag::S_IFIFO => {
                let mut h = self.header(EntryType::Fifo, &st, ids);
                self.out.append_data(&mut h, path, io::empty())?;
            }
            _ => {
                self.stats.entries -= 1;
                self.stats.skipped_special += 1;
            }
        }
        Ok(None)
    }

    fn opaque(&mut self, dir_path: &str, st: &FileStat) -> Result<(), CaptureError> {
        let mut h = self.header(EntryType::Regular, st, (0, 0));
        h.set_mode(0o600);
        self.out.append_data(&mut h, format!("{dir_path}{OPAQUE_MARKER}"), io::empty())?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        cname: &CStr,
        name: &str,
        parent: &str,
        path: &str,
        st: &FileStat,
        ids: (u64, u64),
    ) -> Result<(), CaptureError> {
        if st.st_nlink > 1 {
            let key = (st.st_dev, st.st_ino);
            if let Some(first) = self.links.get(&key) {
                let h = self.header(EntryType::Link, st, ids);
                let first = first.clone();
                return self.append_link(h, path, first.as_bytes());
            }
            self.links.insert(key, path.to_owned());
        }
        // O_NONBLOCK: should a fifo be swapped in, the open does not hang
        // (and the check below refuses it).
        let fd = openat(
            Some(dir.as_raw_fd()),
            cname,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(sys("open", path))?;
        // SAFETY: openat just returned this fd and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        check_same(&file, st, path)?;
        if self.source == Source::Upper && overlay_present(file.as_fd(), "whiteout") {
            self.stats.entries -= 1;
            return self.whiteout(parent, name, st);
        }
        self.xattrs(file.as_fd())?;
        let size = st.st_size.max(0) as u64;
        let mut h = self.header(EntryType::Regular, st, ids);
        h.set_size(size);
        let mut limited = Exact { inner: file.take(size), left: size, path };
        self.out.append_data(&mut h, path, &mut limited)?;
        self.stats.file_bytes += size;
        Ok(())
    }
}

/// A reader giving exactly `left` bytes or failing (a frozen sandbox cannot
/// change a file meanwhile; if one shrinks anyway, the capture fails).
struct Exact<'a, R> {
    inner: R,
    left: u64,
    path: &'a str,
}

impl<R: Read> Read for Exact<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} shrank while captured", self.path)));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The opened fd is the inode `lstat` saw (nothing swapped in between).
fn check_same(fd: &impl AsFd, st: &FileStat, path: &str) -> Result<(), CaptureError> {
    let now = fstat(fd.as_fd().as_raw_fd()).map_err(sys("fstat", path))?;
    if now.st_dev != st.st_dev || now.st_ino != st.st_ino || (now.st_mode & libc::S_IFMT) != (st.st_mode & libc::S_IFMT)
    {
        return Err(CaptureError::Changed { path: path.to_owned(), reason: "replaced while captured".into() });
    }
    Ok(())
}

fn open_root(path: &Path) -> Result<(OwnedFd, FileStat), CaptureError> {
    let p = path.display().to_string();
    let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(sys("open", &p))?;
    // SAFETY: open just returned this fd and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(fd.as_raw_fd()).map_err(sys("fstat", &p))?;
    Ok((fd, st))
}

/// Writes the sandbox's writable state as an uncompressed layer tar to `out`.
pub fn capture(src: &Sources<'_>, out: &Path) -> Result<CaptureStats, CaptureError> {
    let file = File::options().write(true).create_new(true).open(out)?;
    let mut builder = tar::Builder::new(BufWriter::with_capacity(1 << 20, file));
    builder.follow_symlinks(false);
    let (upper, upper_st) = open_root(src.upper)?;
    let mut w = Walker {
        out: builder,
        ids: src.ids,
        dev: upper_st.st_dev,
        source: Source::Upper,
        links: HashMap::new(),
        stats: CaptureStats::default(),
    };
    // With a tmpfs /tmp, whatever the upper holds at /tmp is hidden anyway.
    let skip: &[&str] = if src.sandbox_root.is_some() { &["tmp"] } else { &[] };
    w.walk(upper, "", skip)?;
    if let Some(root) = src.sandbox_root {
        let (root_fd, _) = open_root(root)?;
        let tmp_name = c"tmp";
        let tmp = open_dir(root_fd.as_fd(), tmp_name, "/tmp")?;
        let st = fstat(tmp.as_raw_fd()).map_err(sys("fstat", "/tmp"))?;
        if let Some(ids) = w.map_ids(&st) {
            w.source = Source::Tmp;
            w.dev = st.st_dev;
            w.links.clear();
            let mut h = w.header(EntryType::Directory, &st, ids);
            w.out.append_data(&mut h, "tmp/", io::empty())?;
            w.opaque("tmp/", &st)?;
            w.walk(tmp, "tmp/", &[])?;
        }
    }
    let stats = w.stats;
    let inner = w.out.into_inner()?;
    let file = inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(stats)
}

/// `/proc/<pid>/root` of the sandbox's init: the process of the group whose
/// pid in its innermost namespace is 1.
pub fn init_root(pids: &[i32]) -> Option<PathBuf> {
    pids.iter().find_map(|pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
        let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
        (fields.len() >= 2 && fields.last() == Some(&"1")).then(|| PathBuf::from(format!("/proc/{pid}/root")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::mkdirat;

    /// `levels` nested `d` directories under `top`, made fd-relative.
    fn chain(top: &Path, levels: usize) {
        let (mut fd, _) = open_root(top).expect("open");
        for _ in 0..levels {
            mkdirat(Some(fd.as_raw_fd()), c"d", Mode::from_bits_truncate(0o755)).expect("mkdirat");
            fd = open_dir(fd.as_fd(), c"d", "d").expect("openat");
        }
    }

    fn sources(upper: &Path) -> Sources<'_> {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        Sources {
            upper,
            sandbox_root: None,
            ids: IdMap { uid_base: uid.min(gid), gid_base: uid.min(gid), count: 1 + uid.abs_diff(gid) },
        }
    }

    fn entries(tar: &Path) -> Vec<String> {
        let mut a = tar::Archive::new(File::open(tar).expect("open"));
        a.entries().expect("entries").map(|e| e.expect("entry").path().expect("path").display().to_string()).collect()
    }

    #[test]
    fn a_deep_tree_is_captured_iteratively_up_to_the_bound() {
        let d = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("tempdir");
        let upper = d.path().join("upper");
        std::fs::create_dir(&upper).expect("mkdir");
        chain(&upper, 1000);
        let out = d.path().join("layer.tar");
        let stats = capture(&sources(&upper), &out).expect("capture");
        assert_eq!(stats.entries, 1000);
        let names = entries(&out);
        assert_eq!(names.len(), 1000);
        assert_eq!(names.last().map(|n| n.len()), Some(1000 * 2), "d/d/…/d/");
    }

    #[test]
    fn a_tree_100000_levels_deep_fails_the_capture_cleanly() {
        let d = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("tempdir");
        let upper = d.path().join("upper");
        std::fs::create_dir(&upper).expect("mkdir");
        chain(&upper, 100_000);
        let r = capture(&sources(&upper), &d.path().join("layer.tar"));
        assert!(matches!(r, Err(CaptureError::TooDeep { .. })), "{r:?}");
        assert!(r.is_err_and(|e| e.to_string().len() < 600), "the message is abbreviated");
        pvisor_fstree::remove_tree(&upper).expect("cleanup");
    }
}

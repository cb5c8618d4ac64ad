//! Visiting a tree in pre-order, fd-relative and iterative.
//!
//! Each directory's names are read once when it is entered and visited in
//! byte order. The visitor sees every entry with its `lstat`, its parent's
//! open fd and its path relative to the root, and for a directory the walk
//! may enter, that directory already opened (`O_NOFOLLOW`, checked to be the
//! inode `lstat` saw); it answers [`Control::Descend`] to enter it. Symlinks
//! are reported, never followed. Entries that vanish meanwhile are skipped.
use crate::error::Error;
use crate::stack::{Level, Stack};
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{fcntl, AtFlags, FcntlArg};
use nix::sys::stat::{fstat, fstatat, FileStat, SFlag};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// How far a walk goes.
#[derive(Debug, Clone, Copy)]
pub struct WalkOptions {
    /// Levels below the root that are visited (1: the root's entries only).
    pub max_depth: u32,
}

impl Default for WalkOptions {
    fn default() -> Self {
        WalkOptions { max_depth: u32::MAX }
    }
}

/// One entry, as the visitor sees it.
pub struct Visit<'a> {
    /// The open directory holding the entry.
    pub parent: BorrowedFd<'a>,
    pub name: &'a CStr,
    /// Path relative to the root, `/`-separated, without a leading `/`.
    pub path: &'a [u8],
    /// 1 for the root's own entries.
    pub depth: u32,
    /// `lstat` of the entry.
    pub stat: &'a FileStat,
    /// For a directory within `max_depth`: it, opened.
    pub dir: Option<BorrowedFd<'a>>,
}

impl Visit<'_> {
    pub fn is_dir(&self) -> bool {
        kind(self.stat) == SFlag::S_IFDIR
    }
}

/// The visitor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Enter this directory (ignored for anything else).
    Descend,
    /// Do not enter it.
    Skip,
    /// End the walk now (successfully).
    Stop,
}

pub(crate) fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

struct Names {
    /// Still to visit, in reverse order (popped from the end).
    left: Vec<CString>,
    /// Length of the walk's path buffer for this directory's prefix.
    prefix: usize,
}

/// Walks the directory `root` (not visited itself). `shown` names it in
/// messages.
pub fn walk<E, F>(root: BorrowedFd<'_>, shown: &str, opts: WalkOptions, mut visit: F) -> Result<(), E>
where
    E: From<Error>,
    F: FnMut(&Visit<'_>) -> Result<Control, E>,
{
    let sys = |op: &'static str, path: String| move |errno| Error::Sys { op, path, errno };
    let dup = fcntl(root.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(0)).map_err(sys("dup", shown.to_owned()))?;
    let mut dir = Dir::from_fd(dup).map_err(sys("opendir", shown.to_owned()))?;
    let st = fstat(dir.as_raw_fd()).map_err(sys("fstat", shown.to_owned()))?;
    let names = read_sorted(&mut dir).map_err(sys("readdir", shown.to_owned()))?;
    let mut stack: Stack<Names> = Stack::new(shown.to_owned());
    stack.push(Level {
        name: c".".to_owned(),
        dev: st.st_dev,
        ino: st.st_ino,
        dir: Some(dir),
        data: Names { left: names, prefix: 0 },
    });
    let mut path: Vec<u8> = Vec::new();
    loop {
        let Some(fd) = stack.top_fd() else { return Ok(()) };
        let depth = stack.len() as u32;
        let Some(top) = stack.top() else { return Ok(()) };
        let Some(name) = top.data.left.pop() else {
            stack.pop()?;
            continue;
        };
        path.truncate(top.data.prefix);
        path.extend_from_slice(name.to_bytes());
        let st = match fstatat(Some(fd), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(errno) => return Err(Error::Sys { op: "lstat", path: stack.describe_child(&name), errno }.into()),
        };
        let mut child = None;
        if kind(&st) == SFlag::S_IFDIR && depth < opts.max_depth {
            match crate::stack::open_dir_at(fd, &name) {
                Ok(d) => {
                    crate::stack::check_opened(&stack, &d, &name, (st.st_dev, st.st_ino))?;
                    child = Some(d);
                }
                Err(Errno::ENOENT) => continue,
                Err(errno) => return Err(Error::Sys { op: "open", path: stack.describe_child(&name), errno }.into()),
            }
        }
        // SAFETY: `fd` is the top level's open directory, which stays open
        // (owned by the stack) for the whole visit below.
        let parent = unsafe { BorrowedFd::borrow_raw(fd) };
        let child_fd: Option<RawFd> = child.as_ref().map(|d| d.as_raw_fd());
        // SAFETY: `child` owns this fd and outlives the visit.
        let child_borrow = child_fd.map(|c| unsafe { BorrowedFd::borrow_raw(c) });
        let v = Visit { parent, name: &name, path: &path, depth, stat: &st, dir: child_borrow };
        match visit(&v)? {
            Control::Stop => return Ok(()),
            Control::Skip => {}
            Control::Descend => {
                if let Some(mut d) = child {
                    let names = read_sorted(&mut d).map_err(|errno| Error::Sys {
                        op: "readdir",
                        path: stack.describe_child(&name),
                        errno,
                    })?;
                    path.push(b'/');
                    stack.push(Level {
                        name,
                        dev: st.st_dev,
                        ino: st.st_ino,
                        dir: Some(d),
                        data: Names { left: names, prefix: path.len() },
                    });
                }
            }
        }
    }
}

/// Every name of `dir` but `.` and `..`, in reverse byte order.
fn read_sorted(dir: &mut Dir) -> nix::Result<Vec<CString>> {
    let mut names = Vec::new();
    for e in dir.iter() {
        let e = e?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

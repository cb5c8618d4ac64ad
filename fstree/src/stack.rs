//! The explicit stack of directories a walk is in, with a bounded number of
//! open fds: only the top [`MAX_OPEN_DIRS`] levels stay open, and a level
//! closed to keep that bound is reopened through `..` of its child when the
//! walk climbs back to it, then checked to be the inode it was.
use crate::error::Error;
use crate::MAX_OPEN_DIRS;
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, Mode};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, RawFd};

/// Opens the directory `name` of `parent` without following a symlink.
pub(crate) fn open_dir_at(parent: RawFd, name: &CStr) -> nix::Result<Dir> {
    Dir::openat(
        Some(parent),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// (device, inode) of an open directory.
pub(crate) fn identity(dir: &Dir) -> nix::Result<(u64, u64)> {
    let st = fstat(dir.as_raw_fd())?;
    Ok((st.st_dev, st.st_ino))
}

/// Checks that `dir`, just opened as `name` below the stack's top, is the
/// inode `expected` (device, inode) that `fstatat` saw: a directory swapped
/// in between the two is [`Error::Changed`]. Returns its identity.
pub(crate) fn check_opened<T>(
    stack: &Stack<T>,
    dir: &Dir,
    name: &CStr,
    expected: (u64, u64),
) -> Result<(u64, u64), Error> {
    let id = identity(dir).map_err(|errno| Error::Sys { op: "fstat", path: stack.describe_child(name), errno })?;
    if id != expected {
        return Err(Error::Changed { path: stack.describe_child(name) });
    }
    Ok(id)
}

/// One directory on the way down.
pub(crate) struct Level<T> {
    /// Its name in its parent (for the root: the name it was opened by).
    pub name: CString,
    pub dev: u64,
    pub ino: u64,
    /// Open while among the deepest levels; always open for the top.
    pub dir: Option<Dir>,
    /// What the walk keeps per level (names still to visit, ...).
    pub data: T,
}

pub(crate) struct Stack<T> {
    /// How the root is shown in messages.
    root: String,
    levels: Vec<Level<T>>,
}

impl<T> Stack<T> {
    pub fn new(root: String) -> Self {
        Stack { root, levels: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.levels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    pub fn push(&mut self, level: Level<T>) {
        self.levels.push(level);
        let n = self.levels.len();
        if n > MAX_OPEN_DIRS {
            self.levels[n - MAX_OPEN_DIRS - 1].dir = None;
        }
    }

    pub fn top(&mut self) -> Option<&mut Level<T>> {
        self.levels.last_mut()
    }

    /// The fd of the top level (always open).
    pub fn top_fd(&self) -> Option<RawFd> {
        self.levels.last().and_then(|l| l.dir.as_ref()).map(|d| d.as_raw_fd())
    }

    /// Takes the top level off; the new top (its parent) is open afterwards.
    pub fn pop(&mut self) -> Result<Option<Level<T>>, Error> {
        let Some(child) = self.levels.pop() else {
            return Ok(None);
        };
        if self.levels.last().is_some_and(|p| p.dir.is_none()) {
            let reopened = match child.dir.as_ref() {
                None => Err(Error::Sys { op: "reopen", path: self.describe(), errno: Errno::EBADF }),
                Some(child_dir) => self.reopen_top(child_dir),
            };
            reopened?;
        }
        Ok(Some(child))
    }

    /// Reopens the (closed) top level as `..` of its child `child_dir`.
    fn reopen_top(&mut self, child_dir: &Dir) -> Result<(), Error> {
        let sys = |op, errno, s: &Self| Error::Sys { op, path: s.describe(), errno };
        let dir = open_dir_at(child_dir.as_raw_fd(), c"..").map_err(|e| sys("open ..", e, self))?;
        let id = identity(&dir).map_err(|e| sys("fstat", e, self))?;
        let Some(parent) = self.levels.last_mut() else { return Ok(()) };
        if id != (parent.dev, parent.ino) {
            return Err(Error::Changed { path: self.describe() });
        }
        parent.dir = Some(dir);
        Ok(())
    }

    /// The current place, abbreviated, for messages.
    pub fn describe(&self) -> String {
        self.describe_with(None)
    }

    /// The place of `name` inside the top level, for messages.
    pub fn describe_child(&self, name: &CStr) -> String {
        self.describe_with(Some(name))
    }

    /// Only the first and last few names are looked at (a message about a
    /// deep place costs as much as one about a shallow one).
    fn describe_with(&self, extra: Option<&CStr>) -> String {
        let below_root = &self.levels[self.levels.len().min(1)..];
        let owned = extra.map(CStr::to_owned);
        let total = below_root.len() + usize::from(owned.is_some());
        let at = |i: usize| match below_root.get(i) {
            Some(level) => &level.name,
            None => owned.as_ref().unwrap_or(&self.levels[0].name),
        };
        crate::path::describe(&self.root, total, at)
    }
}

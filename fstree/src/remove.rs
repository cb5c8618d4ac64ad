//! Deleting a tree: depth-first, fd-relative, iterative.
//!
//! Each directory is emptied in batches of names (`unlinkat` of each; a
//! name that turns out to be a directory is descended into), then removed
//! from its parent once a fresh read finds it empty. Nothing is recursive and
//! no path longer than one name is used, so a tree of any depth is removed in
//! constant stack and [`MAX_OPEN_DIRS`](crate::MAX_OPEN_DIRS) fds. Symlinks are
//! unlinked, never followed; a directory on another file system is an error
//! (never emptied). A directory without write or search permission for the
//! caller is made `0700` first (a sandbox can `chmod 000` its own dirs).
use crate::error::Error;
use crate::stack::{identity, open_dir_at, Level, Stack};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fchmod, fchmodat, fstatat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Names read from a directory at a time.
const BATCH: usize = 1024;
/// How often a directory found non-empty at `rmdir` is emptied again
/// (entries created concurrently) before giving up.
const MAX_PASSES: u32 = 16;

/// What a removal deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Entries removed, directories included.
    pub entries: u64,
    /// Deepest level reached below the root (the root is 0).
    pub max_depth: u64,
}

#[derive(Default)]
struct Pending {
    names: Vec<CString>,
    /// Times this directory was found non-empty at its removal.
    passes: u32,
    /// Already made writable once.
    chmodded: bool,
}

/// Removes `path` and, if it is a directory, everything under it. The path's
/// own parents are trusted (they are resolved normally); nothing below it is.
pub fn remove_tree(path: &Path) -> Result<Removed, Error> {
    let shown = path.display().to_string();
    let name =
        path.file_name().ok_or_else(|| Error::Sys { op: "remove", path: shown.clone(), errno: Errno::EINVAL })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fd = nix::fcntl::open(
        parent,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| Error::Sys { op: "open", path: parent.display().to_string(), errno })?;
    // SAFETY: open just returned this fd and nothing else owns it.
    let parent_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let cname = CString::new(name.as_bytes()).map_err(|_| Error::Sys {
        op: "remove",
        path: shown.clone(),
        errno: Errno::EINVAL,
    })?;
    remove_tree_at(parent_fd.as_fd(), &cname, &shown)
}

/// Removes the entry `name` of the open directory `parent` and everything
/// under it. `shown` names it in messages.
pub fn remove_tree_at(parent: BorrowedFd<'_>, name: &CStr, shown: &str) -> Result<Removed, Error> {
    let sys = |op: &'static str, path: &str| {
        let path = path.to_owned();
        move |errno| Error::Sys { op, path, errno }
    };
    let pfd = parent.as_raw_fd();
    let st = fstatat(Some(pfd), name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(sys("lstat", shown))?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        unlinkat(Some(pfd), name, UnlinkatFlags::NoRemoveDir).map_err(sys("unlink", shown))?;
        return Ok(Removed { entries: 1, max_depth: 0 });
    }
    let root_dev = st.st_dev;
    let dir = open_writable_dir(pfd, name, &mut false).map_err(sys("open", shown))?;
    let id = identity(&dir).map_err(sys("fstat", shown))?;
    if id != (st.st_dev, st.st_ino) {
        return Err(Error::Changed { path: shown.to_owned() });
    }
    let mut stack: Stack<Pending> = Stack::new(shown.to_owned());
    stack.push(Level { name: name.to_owned(), dev: id.0, ino: id.1, dir: Some(dir), data: Pending::default() });
    let mut done = Removed::default();
    loop {
        let fd =
            stack.top_fd().ok_or_else(|| Error::Sys { op: "walk", path: stack.describe(), errno: Errno::EBADF })?;
        let Some(top) = stack.top() else { break };
        if top.data.names.is_empty() {
            let Some(dir) = top.dir.as_mut() else { break };
            let batch = read_batch(dir);
            let batch = batch.map_err(|errno| Error::Sys { op: "readdir", path: stack.describe(), errno })?;
            if !batch.is_empty() {
                if let Some(top) = stack.top() {
                    top.data.names = batch;
                }
                continue;
            }
            // Empty: remove it from its parent (climbing back up).
            let Some(mut child) = stack.pop()? else { break };
            let parent_fd = stack.top_fd().unwrap_or(pfd);
            match unlinkat(Some(parent_fd), child.name.as_c_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) => done.entries += 1,
                Err(Errno::ENOTEMPTY) | Err(Errno::EEXIST) if child.data.passes < MAX_PASSES => {
                    child.data.passes += 1;
                    stack.push(child);
                    continue;
                }
                Err(Errno::ENOTEMPTY) => {
                    return Err(Error::NotEmpty { path: stack.describe_child(&child.name), passes: child.data.passes })
                }
                Err(errno) => return Err(Error::Sys { op: "rmdir", path: stack.describe_child(&child.name), errno }),
            }
            if stack.is_empty() {
                return Ok(done);
            }
            continue;
        }
        let Some(n) = top.data.names.pop() else { continue };
        match unlink_entry(fd, &n, &mut top.data.chmodded) {
            Ok(()) => done.entries += 1,
            Err(Errno::ENOENT) => {}
            Err(Errno::EISDIR) => {
                let cst = match fstatat(Some(fd), n.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(Errno::ENOENT) => continue,
                    Err(errno) => return Err(Error::Sys { op: "lstat", path: stack.describe_child(&n), errno }),
                };
                if cst.st_dev != root_dev {
                    return Err(Error::MountPoint { path: stack.describe_child(&n) });
                }
                let mut chmodded = false;
                let child = match open_writable_dir(fd, &n, &mut chmodded) {
                    Ok(d) => d,
                    Err(Errno::ENOENT) => continue,
                    Err(errno) => return Err(Error::Sys { op: "open", path: stack.describe_child(&n), errno }),
                };
                let id = crate::stack::check_opened(&stack, &child, &n, (cst.st_dev, cst.st_ino))?;
                stack.push(Level {
                    name: n,
                    dev: id.0,
                    ino: id.1,
                    dir: Some(child),
                    data: Pending { chmodded, ..Pending::default() },
                });
                done.max_depth = done.max_depth.max(stack.len() as u64 - 1);
            }
            Err(errno) => return Err(Error::Sys { op: "unlink", path: stack.describe_child(&n), errno }),
        }
    }
    Ok(done)
}

/// Up to [`BATCH`] names of `dir`, read from its start (what was removed
/// is gone, so a reread sees only what is left).
fn read_batch(dir: &mut nix::dir::Dir) -> nix::Result<Vec<CString>> {
    let mut names = Vec::new();
    for e in dir.iter() {
        let e = e?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
            if names.len() >= BATCH {
                break;
            }
        }
    }
    Ok(names)
}

/// Unlinks a non-directory `name` of `dir` (EISDIR for a directory); on a
/// permission error, makes `dir` itself writable once and retries.
fn unlink_entry(dir: RawFd, name: &CStr, chmodded: &mut bool) -> nix::Result<()> {
    match unlinkat(Some(dir), name, UnlinkatFlags::NoRemoveDir) {
        Err(Errno::EACCES) if !*chmodded => {
            *chmodded = true;
            fchmod(dir, Mode::from_bits_truncate(0o700))?;
            unlinkat(Some(dir), name, UnlinkatFlags::NoRemoveDir)
        }
        r => r,
    }
}

/// Opens the directory `name` of `parent`; on EACCES (a `chmod 000`
/// directory) makes it `0700` (not following a symlink) and tries again.
fn open_writable_dir(parent: RawFd, name: &CStr, chmodded: &mut bool) -> nix::Result<nix::dir::Dir> {
    match open_dir_at(parent, name) {
        Err(Errno::EACCES) => {
            *chmodded = true;
            fchmodat(Some(parent), name, Mode::from_bits_truncate(0o700), FchmodatFlags::NoFollowSymlink)?;
            open_dir_at(parent, name)
        }
        r => r,
    }
}

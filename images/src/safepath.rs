//! Path resolution confined to an image tree.
//!
//! Every lookup goes through `openat2(2)` with `RESOLVE_IN_ROOT`, so the tree's
//! root directory behaves like `/` for the lookup: absolute symlinks and `..`
//! are interpreted inside the tree and can never reach the host file system.
//! Final components are then created or changed with `*at` calls relative to
//! the resolved parent directory and never followed.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::errno::Errno;
use nix::fcntl::{openat2, readlinkat, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{mkdirat, Mode};

/// Deepest chain of dangling symlinks followed when creating parent directories.
const MAX_SYMLINK_DEPTH: u32 = 40;

/// Splits an archive path into clean components.
///
/// Leading `/` and `.`/empty components are dropped; a `..` component anywhere
/// or a NUL byte is refused, with the reason as the error.
pub(crate) fn clean(raw: &[u8]) -> Result<Vec<OsString>, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".to_owned());
    }
    let mut out = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("path contains a '..' component".to_owned()),
            c => out.push(OsString::from_vec(c.to_vec())),
        }
    }
    Ok(out)
}

/// Joins components with '/' ("." for none), for `openat2`.
pub(crate) fn join<S: AsRef<OsStr>>(comps: &[S]) -> OsString {
    if comps.is_empty() {
        return OsString::from(".");
    }
    let mut out = Vec::new();
    for (i, c) in comps.iter().enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        out.extend_from_slice(c.as_ref().as_bytes());
    }
    OsString::from_vec(out)
}

/// Opens `path` relative to `root`, treating `root` as the file system root.
pub(crate) fn open_in_root(root: BorrowedFd<'_>, path: &OsStr, flags: OFlag) -> nix::Result<OwnedFd> {
    let path: &OsStr = if path.is_empty() { OsStr::new(".") } else { path };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let mut attempts = 0;
    loop {
        match openat2(root.as_raw_fd(), path, how) {
            Ok(fd) => {
                // SAFETY: openat2 just returned this descriptor; nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            // EAGAIN: the kernel saw a concurrent rename/mount and wants a retry.
            Err(Errno::EAGAIN | Errno::EINTR) if attempts < 64 => attempts += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Opens a directory inside the tree as an `O_PATH` descriptor (usable as the
/// `dirfd` of `*at` calls). Symlinks along the way are followed inside the tree.
pub(crate) fn open_dir(root: BorrowedFd<'_>, path: &OsStr) -> nix::Result<OwnedFd> {
    open_in_root(root, path, OFlag::O_PATH | OFlag::O_DIRECTORY)
}

/// Opens a directory inside the tree for reading its entries or changing its
/// metadata. The final component must not be a symlink.
pub(crate) fn open_dir_rw(root: BorrowedFd<'_>, path: &OsStr) -> nix::Result<OwnedFd> {
    open_in_root(root, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW)
}

/// Why [`ensure_dir`] failed.
#[derive(Debug)]
pub(crate) enum EnsureError {
    /// A system call failed.
    Sys(Errno),
    /// The `on_create` callback failed.
    Callback(crate::Error),
}

impl From<Errno> for EnsureError {
    fn from(e: Errno) -> Self {
        EnsureError::Sys(e)
    }
}

/// Resolves directory `comps` inside the tree, creating missing directories.
///
/// A component that is a dangling symlink gets its target created (inside
/// the tree), which is what a container runtime unpacking the same layers
/// would do. `on_create(parent, name)` runs for every directory created, e.g.
/// to set its owner. Returns an `O_PATH` descriptor of the directory.
pub(crate) fn ensure_dir(
    root: BorrowedFd<'_>,
    comps: &[OsString],
    on_create: &mut dyn FnMut(BorrowedFd<'_>, &OsStr) -> Result<(), crate::Error>,
) -> Result<OwnedFd, EnsureError> {
    ensure_dir_depth(root, comps, on_create, 0)
}

fn ensure_dir_depth(
    root: BorrowedFd<'_>,
    comps: &[OsString],
    on_create: &mut dyn FnMut(BorrowedFd<'_>, &OsStr) -> Result<(), crate::Error>,
    depth: u32,
) -> Result<OwnedFd, EnsureError> {
    // Fast path: the whole directory already exists.
    match open_dir(root, &join(comps)) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let mut parent = open_dir(root, OsStr::new("."))?;
    for i in 0..comps.len() {
        let prefix = join(&comps[..=i]);
        match open_dir(root, &prefix) {
            Ok(fd) => {
                parent = fd;
                continue;
            }
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let name = comps[i].as_os_str();
        if name == ".." {
            // The parent exists, so its ".." does too; ENOENT here is a race.
            return Err(Errno::ENOENT.into());
        }
        match mkdirat(Some(parent.as_raw_fd()), name, Mode::from_bits_truncate(0o755)) {
            Ok(()) => on_create(parent.as_fd(), name).map_err(EnsureError::Callback)?,
            Err(Errno::EEXIST) => {
                // Something is there but does not resolve: a dangling symlink.
                let target = match readlinkat(Some(parent.as_raw_fd()), name) {
                    Ok(t) => t,
                    Err(Errno::EINVAL) => return Err(Errno::ENOTDIR.into()),
                    Err(e) => return Err(e.into()),
                };
                if depth >= MAX_SYMLINK_DEPTH {
                    return Err(Errno::ELOOP.into());
                }
                let target = target.as_bytes();
                let mut next: Vec<OsString> = if target.starts_with(b"/") { Vec::new() } else { comps[..i].to_vec() };
                next.extend(
                    target
                        .split(|&b| b == b'/')
                        .filter(|c| !c.is_empty() && *c != b".")
                        .map(|c| OsString::from_vec(c.to_vec())),
                );
                ensure_dir_depth(root, &next, on_create, depth + 1)?;
            }
            Err(e) => return Err(e.into()),
        }
        parent = open_dir(root, &prefix)?;
    }
    Ok(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths() {
        let c = |s: &str| clean(s.as_bytes()).map(|v| join(&v).into_string().unwrap());
        assert_eq!(c("a/b/c").unwrap(), "a/b/c");
        assert_eq!(c("./a//b/./c/").unwrap(), "a/b/c");
        assert_eq!(c("/abs/path").unwrap(), "abs/path");
        assert_eq!(c("///").unwrap(), ".");
        assert!(c("../x").is_err());
        assert!(c("a/../b").is_err());
        assert!(c("a/..").is_err());
        assert!(c("/..").is_err());
        assert!(clean(b"a\0b").is_err());
    }

    #[test]
    fn resolution_stays_inside() {
        let outer = tempfile::tempdir().unwrap();
        let tree = outer.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        std::os::unix::fs::symlink("/", tree.join("up")).unwrap();
        std::os::unix::fs::symlink("../../..", tree.join("dots")).unwrap();
        std::os::unix::fs::symlink(outer.path().join("gone"), tree.join("dangling")).unwrap();
        let root = std::fs::File::open(&tree).unwrap();
        let root = root.as_fd();
        let mut noop = |_: BorrowedFd<'_>, _: &OsStr| Ok(());

        // "up" and "dots" both resolve to the tree root itself.
        let fd = ensure_dir(root, &[OsString::from("up"), OsString::from("x")], &mut noop).unwrap();
        drop(fd);
        assert!(tree.join("x").is_dir());
        ensure_dir(root, &[OsString::from("dots"), OsString::from("y")], &mut noop).unwrap();
        assert!(tree.join("y").is_dir());

        // A dangling absolute symlink gets its target created inside the tree.
        ensure_dir(root, &[OsString::from("dangling"), OsString::from("z")], &mut noop).unwrap();
        let inside = tree.join(outer.path().strip_prefix("/").unwrap()).join("gone/z");
        assert!(inside.is_dir(), "{}", inside.display());
        assert!(!outer.path().join("gone").exists());

        // Loops are reported, not followed forever.
        std::os::unix::fs::symlink("loop2", tree.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", tree.join("loop2")).unwrap();
        assert!(ensure_dir(root, &[OsString::from("loop1"), OsString::from("a")], &mut noop).is_err());
    }
}

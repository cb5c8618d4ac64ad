//! Descriptor-relative file system helpers: recursive removal and size
//! accounting that never follow symlinks and keep only a couple of
//! descriptors open however deep the tree is.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmodat, fstatat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

fn open_sub(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_parent(dir: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    let fd =
        openat(Some(dir.as_raw_fd()), "..", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Names in a directory (without `.` and `..`).
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    // A fresh descriptor: `Dir` takes ownership and its read position is its own.
    let fd =
        openat(Some(dir.as_raw_fd()), ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut d = Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(names)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Gives the owner rwx on a directory so it can be emptied (only needed when
/// not root: root bypasses permission checks).
fn make_accessible(parent: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    if is_root() {
        return Ok(());
    }
    let st = fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR && st.st_mode & 0o700 != 0o700 {
        // Following is fine: it was just seen to be a directory, not a symlink.
        fchmodat(
            Some(parent.as_raw_fd()),
            name,
            Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700),
            FchmodatFlags::FollowSymlink,
        )?;
    }
    Ok(())
}

/// Removes `name` in `parent`, recursively if it is a directory. Missing is fine.
pub(crate) fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    match unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(e),
    }
    make_accessible(parent, name)?;
    let mut cur = open_sub(parent, name)?;
    // Names from `name` down to `cur`; going up uses "..", so only one
    // descriptor is open however deep the tree is.
    let mut stack: Vec<OsString> = Vec::new();
    loop {
        let mut subdir = None;
        for child in list_dir(cur.as_fd())? {
            match unlinkat(Some(cur.as_raw_fd()), child.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(Errno::EISDIR) => {
                    if subdir.is_none() {
                        subdir = Some(child);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(child) = subdir {
            make_accessible(cur.as_fd(), &child)?;
            cur = open_sub(cur.as_fd(), &child)?;
            stack.push(child);
            continue;
        }
        match stack.pop() {
            Some(child) => {
                let up = open_parent(cur.as_fd())?;
                match unlinkat(Some(up.as_raw_fd()), child.as_os_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(e) => return Err(e),
                }
                cur = up;
            }
            None => {
                drop(cur);
                return match unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => Ok(()),
                    Err(e) => Err(e),
                };
            }
        }
    }
}

/// Removes a path (file or directory tree) without following symlinks.
pub(crate) fn remove_all(path: &Path) -> io::Result<()> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name"));
    };
    let dir = std::fs::File::open(parent)?;
    remove_entry(dir.as_fd(), name).map_err(io::Error::from)
}

/// Apparent size of the regular files and symlinks under `dir`
/// (hardlinked files counted once).
pub(crate) fn tree_size(dir: BorrowedFd<'_>) -> nix::Result<u64> {
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut total = 0u64;
    let mut scan = |d: BorrowedFd<'_>| -> nix::Result<Vec<OsString>> {
        let mut subdirs = Vec::new();
        for name in list_dir(d)? {
            let st = fstatat(Some(d.as_raw_fd()), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind == SFlag::S_IFDIR {
                subdirs.push(name);
            } else if kind == SFlag::S_IFREG || kind == SFlag::S_IFLNK {
                if st.st_nlink > 1 && !seen.insert((st.st_dev, st.st_ino)) {
                    continue;
                }
                total += st.st_size as u64;
            }
        }
        Ok(subdirs)
    };
    let mut cur = open_sub(dir, OsStr::new("."))?;
    let mut pending = vec![scan(cur.as_fd())?];
    loop {
        let next = pending.last_mut().and_then(Vec::pop);
        match next {
            Some(name) => {
                cur = open_sub(cur.as_fd(), &name)?;
                let subdirs = scan(cur.as_fd())?;
                pending.push(subdirs);
            }
            None => {
                pending.pop();
                if pending.is_empty() {
                    break;
                }
                cur = open_parent(cur.as_fd())?;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_and_size_deep_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("top");
        let mut p = top.clone();
        for i in 0..300 {
            p = p.join(format!("d{}", i % 3));
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("f"), b"12345").unwrap();
        std::fs::write(top.join("g"), b"abc").unwrap();
        std::fs::hard_link(top.join("g"), top.join("h")).unwrap();
        std::os::unix::fs::symlink("/etc", top.join("s")).unwrap();
        let dir = std::fs::File::open(&top).unwrap();
        assert_eq!(tree_size(dir.as_fd()).unwrap(), 5 + 3 + 4);
        drop(dir);
        // A read-only directory in the middle must not stop removal.
        let mut ro = top.clone();
        ro.push("d0");
        std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o500)).unwrap();
        remove_all(&top).unwrap();
        assert!(!top.exists());
        assert!(Path::new("/etc").exists());
        // Removing something already gone is fine.
        remove_all(&top).unwrap();
    }
}

//! Files the agent writes into the sandbox's `/etc` (hostname, hosts,
//! resolv.conf), safely against what the image put there.
//!
//! The image controls `/etc`: `/etc` itself, or a file in it, may be a
//! symlink (Debian with systemd-resolved links `resolv.conf` into /run), and
//! the agent writes as the guest's root with every capability, where a link
//! into `/proc/sys` would be a way to set kernel parameters. So no symlink is
//! followed: `/etc` is opened with `O_NOFOLLOW` (a symlinked `/etc` is left
//! alone), the old entry is removed (a link is replaced, never written
//! through) and the file created anew with `O_EXCL | O_NOFOLLOW`.
use super::error::GuestError;
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Writes `content` as `<root>/etc/<name>` (mode 0644), replacing whatever
/// entry was there. Returns false, writing nothing, when `<root>/etc` is not
/// a directory (absent, or a symlink).
pub fn write_file(root: &Path, name: &str, content: &str) -> Result<bool, GuestError> {
    let etc_path = root.join("etc");
    let step = |what: &str| format!("{what} {}/{name}", etc_path.display());
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(GuestError::Io { step: step("write"), source: std::io::ErrorKind::InvalidInput.into() });
    }
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let etc = match nix::fcntl::open(&etc_path, dir_flags, Mode::empty()) {
        // SAFETY: open just returned this fd; nothing else owns it.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok(false),
        Err(e) => return Err(GuestError::sys(format!("open {}", etc_path.display()), e)),
    };
    match unlinkat(Some(etc.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(GuestError::sys(step("remove"), e)),
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(Some(etc.as_fd().as_raw_fd()), name, flags, Mode::from_bits_truncate(0o644))
        .map_err(|e| GuestError::sys(step("create"), e))?;
    // SAFETY: openat just returned this fd; nothing else owns it.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(content.as_bytes()).map_err(|e| GuestError::io(step("write"), e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn writes_a_new_file_and_replaces_an_old_one() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        assert!(write_file(root.path(), "hosts", "a\n").unwrap());
        assert!(write_file(root.path(), "hosts", "b\n").unwrap());
        assert_eq!(std::fs::read_to_string(root.path().join("etc/hosts")).unwrap(), "b\n");
    }

    #[test]
    fn a_symlinked_file_is_replaced_not_written_through() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        let target = root.path().join("precious");
        std::fs::write(&target, "keep\n").unwrap();
        symlink(&target, root.path().join("etc/resolv.conf")).unwrap();
        assert!(write_file(root.path(), "resolv.conf", "nameserver 10.0.2.3\n").unwrap());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n", "the link's target is untouched");
        let written = root.path().join("etc/resolv.conf");
        assert!(!std::fs::symlink_metadata(&written).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(written).unwrap(), "nameserver 10.0.2.3\n");
    }

    #[test]
    fn a_symlinked_or_missing_etc_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        assert!(!write_file(root.path(), "hosts", "x").unwrap(), "no /etc");
        let elsewhere = tempfile::tempdir().unwrap();
        symlink(elsewhere.path(), root.path().join("etc")).unwrap();
        assert!(!write_file(root.path(), "hosts", "x").unwrap(), "symlinked /etc");
        assert!(!elsewhere.path().join("hosts").exists());
    }

    #[test]
    fn names_with_slashes_are_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        for name in ["", "..", "a/b", "."] {
            assert!(write_file(root.path(), name, "x").is_err(), "{name:?}");
        }
    }
}

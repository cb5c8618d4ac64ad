//! Mount steps of the guest's boot, each failing with its step named.
//!
//! [`sandbox_dirs`] fills the new root the way the ns backend does
//! (`worker/src/ns/mounts.rs`): a fresh /proc, read-only /sys, a tmpfs /dev
//! with the usual nodes (not devtmpfs: the sandbox sees no disks), devpts,
//! /dev/shm and /tmp. The root is the image's, so what sits at a mount point
//! is the image's choice: a symlink there would lead the mount to the
//! initramfs side, so every such point is made a real directory first.
use super::error::GuestError;
use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

/// Character devices of the sandbox's /dev: (name, major, minor), all 0666.
const DEVICES: [(&str, u64, u64); 6] =
    [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)];

/// Symlinks of the sandbox's /dev: (name, target).
const DEV_LINKS: [(&str, &str); 5] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];

/// mount(2) with the step in the error: `mount FSTYPE SRC on TARGET`.
pub fn mount_fs(src: &str, target: &Path, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<(), GuestError> {
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(|e| GuestError::sys(format!("mount {fstype} {src} on {}", target.display()), e))
}

/// Detaches the mount at `target` (it stays alive while anything uses it).
pub fn detach(target: &Path) -> Result<(), GuestError> {
    umount2(target, MntFlags::MNT_DETACH).map_err(|e| GuestError::sys(format!("detach {}", target.display()), e))
}

/// Creates directory `p` (mode 0755) unless it is one already.
pub fn mkdir(p: &Path) -> Result<(), GuestError> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(GuestError::io(format!("mkdir {}", p.display()), e)),
    }
}

/// Makes `p` (a direct child of a directory the image controls) a real
/// directory: a symlink or file there is replaced, a directory kept.
pub fn mountpoint(p: &Path) -> Result<(), GuestError> {
    match fs::symlink_metadata(p) {
        Ok(md) if md.is_dir() => return Ok(()),
        Ok(_) => fs::remove_file(p).map_err(|e| GuestError::io(format!("replace {}", p.display()), e))?,
        Err(_) => {}
    }
    fs::create_dir(p).map_err(|e| GuestError::io(format!("mkdir {}", p.display()), e))
}

/// True when `p` is the root of a mount other than its parent's (a
/// filesystem is mounted there).
pub fn is_mounted(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(p), p.parent().map(fs::metadata)) {
        (Ok(md), Some(Ok(parent))) => md.dev() != parent.dev(),
        _ => false,
    }
}

/// Mounts proc, sysfs and devtmpfs in the initramfs, skipping any already
/// there (the kernel may have mounted devtmpfs; a retry may find proc).
pub fn initramfs_dirs() -> Result<(), GuestError> {
    let nsne = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    for (fstype, dir, flags) in
        [("proc", "/proc", nsne), ("sysfs", "/sys", nsne), ("devtmpfs", "/dev", MsFlags::MS_NOSUID)]
    {
        let dir = Path::new(dir);
        mkdir(dir)?;
        if is_mounted(dir) {
            continue;
        }
        match mount(Some(fstype), dir, Some(fstype), flags, None::<&str>) {
            Ok(()) | Err(Errno::EBUSY) => {}
            Err(e) => return Err(GuestError::sys(format!("mount {fstype} on {}", dir.display()), e)),
        }
    }
    Ok(())
}

/// Fills the new root `r` before the switch: /proc, /sys (read-only) with
/// cgroup2 when the kernel has it, /dev, /dev/pts, /dev/shm, /tmp.
/// `under_dev`: a directory bound at `/dev` before `/dev`'s tmpfs covers it
/// (isolated sessions' persistent uppers: see `crate::isolated::layout`).
pub fn sandbox_dirs(r: &Path, under_dev: Option<&Path>) -> Result<(), GuestError> {
    let nsd = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let nsde = nsd | MsFlags::MS_NOEXEC;

    mountpoint(&r.join("proc"))?;
    mount_fs("proc", &r.join("proc"), "proc", nsde, None)?;

    mountpoint(&r.join("sys"))?;
    mount_fs("sysfs", &r.join("sys"), "sysfs", nsde | MsFlags::MS_RDONLY, None)?;
    // Optional: a kernel without cgroup2 still runs sandboxes, only without
    // limits from inside the guest.
    let cgroup = r.join("sys/fs/cgroup");
    if cgroup.is_dir() {
        if let Err(e) = mount_fs("cgroup2", &cgroup, "cgroup2", nsde, None) {
            super::console::line(&format!("{e} (continuing without cgroup2)"));
        }
    }

    let dev = r.join("dev");
    mountpoint(&dev)?;
    if let Some(d) = under_dev {
        mount(Some(d), &dev, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| GuestError::sys(format!("bind {} at /dev", d.display()), e))?;
    }
    mount_fs("tmpfs", &dev, "tmpfs", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=1024k"))?;
    for (name, major, minor) in DEVICES {
        let node = dev.join(name);
        mknod(&node, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(major, minor))
            .map_err(|e| GuestError::sys(format!("mknod {}", node.display()), e))?;
        // mknod(2) applies the umask; the nodes are for everyone.
        fs::set_permissions(&node, fs::Permissions::from_mode(0o666))
            .map_err(|e| GuestError::io(format!("chmod {}", node.display()), e))?;
    }
    mkdir(&dev.join("pts"))?;
    mount_fs(
        "devpts",
        &dev.join("pts"),
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    mkdir(&dev.join("shm"))?;
    mount_fs("tmpfs", &dev.join("shm"), "tmpfs", nsd, Some("mode=1777"))?;
    for (name, target) in DEV_LINKS {
        symlink(target, dev.join(name)).map_err(|e| GuestError::io(format!("symlink /dev/{name}"), e))?;
    }

    mountpoint(&r.join("tmp"))?;
    mount_fs("tmpfs", &r.join("tmp"), "tmpfs", nsd, Some("mode=1777"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_replaces_symlinks_and_files_keeps_dirs() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        symlink(&outside, root.join("proc")).unwrap();
        fs::write(root.join("tmp"), b"file").unwrap();
        fs::create_dir(root.join("dev")).unwrap();
        fs::write(root.join("dev/keep"), b"").unwrap();
        symlink("/nonexistent", root.join("sys")).unwrap();

        for d in ["proc", "tmp", "dev", "sys", "new"] {
            mountpoint(&root.join(d)).unwrap();
            let md = fs::symlink_metadata(root.join(d)).unwrap();
            assert!(md.is_dir() && !md.file_type().is_symlink(), "{d} is a real directory");
        }
        assert!(root.join("dev/keep").exists(), "an existing directory is kept with its contents");
        assert!(outside.exists() && fs::read_dir(&outside).unwrap().next().is_none(), "the symlink's target untouched");
    }

    #[test]
    fn mkdir_is_idempotent_but_not_over_files() {
        let t = tempfile::tempdir().unwrap();
        mkdir(&t.path().join("d")).unwrap();
        mkdir(&t.path().join("d")).unwrap();
        fs::write(t.path().join("f"), b"").unwrap();
        let e = mkdir(&t.path().join("f")).unwrap_err();
        assert!(e.to_string().starts_with(&format!("mkdir {}/f: EEXIST", t.path().display())), "{e}");
    }

    #[test]
    fn is_mounted_sees_proc() {
        assert!(is_mounted(Path::new("/proc")), "/proc is a mount on every Linux host");
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("d")).unwrap();
        assert!(!is_mounted(&t.path().join("d")));
    }
}

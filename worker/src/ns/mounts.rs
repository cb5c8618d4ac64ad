//! The sandbox's root filesystem, built in the child's new mount namespace:
//! the image read-only as overlay lower, the sandbox's own upper, a fresh
//! /proc (with the worker's meminfo and cmdline over the host's), a minimal
//! /dev, tmpfs /tmp and /dev/shm sized from the limits, the volumes, then pivot_root.
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

/// Where the new root is assembled, in the child's private mount namespace
/// (nothing outside sees it). Any directory every user can traverse will do;
/// `/tmp` exists on every host.
const ASSEMBLY_POINT: &str = "/tmp";

pub struct RootfsSpec<'a> {
    pub lower: &'a Path,
    pub upper: &'a Path,
    pub work: &'a Path,
    /// Attached last, so a volume under /tmp or /dev lands on those mounts.
    pub volumes: &'a [super::volumes::Detached],
    /// No tmpfs on `/tmp`: it stays the overlay's (a restored snapshot's).
    pub tmp_on_root: bool,
    /// Sizes of the `/tmp` and `/dev/shm` tmpfs in bytes (see [`tmpfs_sizes`]).
    pub tmp_size: u64,
    pub shm_size: u64,
    /// Files bind-mounted read-only over `/proc` entries (super::procfs):
    /// (a path to the opened file, entry name).
    pub proc_files: &'a [(std::path::PathBuf, &'static str)],
    /// Isolated sessions' persistent uppers: bound at `/dev` under `/dev`'s
    /// tmpfs, where no sandbox process reaches it but a session's init, in
    /// its copy of the mount namespace, can uncover it (an overlay takes an
    /// upper only from a mount of its own namespace).
    pub under_dev: Option<&'a Path>,
}

/// `/tmp` and `/dev/shm` sizes for a sandbox's limits. A tmpfs holds memory
/// charged to the sandbox's memory cgroup, so a tmpfs as large as the limit
/// would end in the OOM killer, not ENOSPC: `/tmp` gets half the sandbox's
/// memory (the kernel's default is half the *host's* RAM), and no more than
/// the disk bound; `/dev/shm` a quarter.
pub fn tmpfs_sizes(memory_bytes: u64, disk_bytes: u64) -> (u64, u64) {
    let half = memory_bytes / 2;
    let tmp = match disk_bytes {
        0 => half,
        d => d.min(half),
    };
    (tmp, memory_bytes / 4)
}

/// Device nodes bind-mounted from the host (a user namespace cannot mknod).
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

fn m(src: Option<&str>, target: &Path, fstype: Option<&str>, flags: MsFlags, data: Option<&str>) -> Result<(), String> {
    mount(src, target, fstype, flags, data)
        .map_err(|e| format!("mount {} on {}: {e}", fstype.or(src).unwrap_or("?"), target.display()))
}

/// Makes `p` (a direct child of the new root) a real directory: the image
/// decides what is there, and before pivot_root a symlink would lead the
/// mount — or a `mkdir -p` — to the host's side.
fn mountpoint(p: &Path) -> Result<(), String> {
    match fs::symlink_metadata(p) {
        Ok(md) if md.is_dir() => return Ok(()),
        Ok(_) => fs::remove_file(p).map_err(|e| format!("replace {}: {e}", p.display()))?,
        Err(_) => {}
    }
    fs::create_dir(p).map_err(|e| format!("mkdir {}: {e}", p.display()))
}

/// A directory inside a tmpfs this function just mounted (no image content).
fn mkdir(p: &Path) -> Result<(), String> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()))
}

/// Builds the root filesystem and pivots into it.
pub fn setup(s: &RootfsSpec) -> Result<(), String> {
    m(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)?;
    let ovl = format!("lowerdir={},upperdir={},workdir={}", s.lower.display(), s.upper.display(), s.work.display());
    let with_userxattr = format!("{ovl},userxattr");
    let r = Path::new(ASSEMBLY_POINT);
    m(Some("overlay"), r, Some("overlay"), MsFlags::empty(), Some(&with_userxattr))
        .or_else(|_| m(Some("overlay"), r, Some("overlay"), MsFlags::empty(), Some(&ovl)))?;
    let nsd = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;

    mountpoint(&r.join("proc"))?;
    m(Some("proc"), &r.join("proc"), Some("proc"), nsd | MsFlags::MS_NOEXEC, None)?;
    for (src, name) in s.proc_files {
        let target = r.join("proc").join(name);
        let src = src.to_string_lossy();
        m(Some(&src), &target, None, MsFlags::MS_BIND, None)?;
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nsd | MsFlags::MS_NOEXEC;
        m(None, &target, None, ro, None)?;
    }

    let dev = r.join("dev");
    mountpoint(&dev)?;
    if let Some(d) = s.under_dev {
        m(Some(&d.to_string_lossy()), &dev, None, MsFlags::MS_BIND, None)?;
    }
    m(Some("tmpfs"), &dev, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=1024k"))?;
    for d in DEVICES {
        let node = dev.join(d);
        fs::write(&node, b"").map_err(|e| format!("create {}: {e}", node.display()))?;
        m(Some(&format!("/dev/{d}")), &node, None, MsFlags::MS_BIND, None)?;
    }
    mkdir(&dev.join("pts"))?;
    if m(
        Some("devpts"),
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .is_ok()
    {
        let _ = symlink("pts/ptmx", dev.join("ptmx"));
    }
    mkdir(&dev.join("shm"))?;
    let shm = format!("mode=1777,size={}", s.shm_size.max(4096));
    m(Some("tmpfs"), &dev.join("shm"), Some("tmpfs"), nsd, Some(&shm))?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = symlink(target, dev.join(name));
    }

    if !s.tmp_on_root {
        mountpoint(&r.join("tmp"))?;
        let tmp = format!("mode=1777,size={}", s.tmp_size.max(4096));
        m(Some("tmpfs"), &r.join("tmp"), Some("tmpfs"), nsd, Some(&tmp))?;
    }
    // Read-only sysfs is a convenience for tools; a host that refuses it is fine.
    if mountpoint(&r.join("sys")).is_ok() {
        let _ = m(Some("sysfs"), &r.join("sys"), Some("sysfs"), nsd | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY, None);
    }
    for v in s.volumes {
        super::volumes::attach(r, v)?;
    }
    std::env::set_current_dir(r).map_err(|e| format!("chdir {}: {e}", r.display()))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach old root: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // Only now, with the sandbox as `/`, may /etc be written (super::etc).
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_is_bounded_by_memory_and_disk() {
        assert_eq!(tmpfs_sizes(512 << 20, 0), (256 << 20, 128 << 20));
        assert_eq!(tmpfs_sizes(512 << 20, 10 << 30), (256 << 20, 128 << 20));
        assert_eq!(tmpfs_sizes(2 << 30, 64 << 20), (64 << 20, 512 << 20));
    }
}

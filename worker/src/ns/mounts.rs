//! The sandbox's root filesystem, built in the child's new mount namespace:
//! the image read-only as overlay lower, the sandbox's own upper, a fresh
//! /proc, a minimal /dev, tmpfs /tmp and /dev/shm, the volumes, then pivot_root.
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

    let dev = r.join("dev");
    mountpoint(&dev)?;
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
    m(Some("tmpfs"), &dev.join("shm"), Some("tmpfs"), nsd, Some("mode=1777"))?;
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
        m(Some("tmpfs"), &r.join("tmp"), Some("tmpfs"), nsd, Some("mode=1777"))?;
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

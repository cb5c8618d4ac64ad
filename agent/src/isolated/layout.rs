//! A session's root, built by its init in the new mount namespace (a private
//! copy of the sandbox's), before any session process exists:
//!
//! 1. the sandbox's root bound read-only (or a `/` overlay of it), with the
//!    sandbox's other mounts (volumes, `/sys`) bound read-only on it;
//! 2. a fresh `/proc` of the session's pid namespace (with the sandbox's
//!    overrides such as `/proc/meminfo` bound over it), a fresh `/dev`
//!    (the usual nodes, its own devpts and `/dev/shm`), `/run` a tmpfs,
//!    `/tmp` a tmpfs of its own (strict) or the sandbox's (balanced);
//! 3. the session's overlays, binds and `extra_writable`, shallowest first:
//!    `overlay` is copy-on-write over the sandbox's directory (upper on the
//!    sandbox's disk when persistent, else on a tmpfs), `rw` binds it,
//!    `ro` binds it read-only;
//! 4. `pivot_root`; the sandbox's tree leaves the namespace.
//!
//! Sources are resolved in the sandbox's view before anything is mounted
//! (a nested overlay's lower is the sandbox's directory, not its parent
//! overlay's). Missing overlay directories and bind destinations are made in
//! the sandbox (as `mkdir -p` would), where the session's root cannot hold them.
//!
//! Persistent uppers live on the sandbox's disk, in the directory the
//! sandbox's init (ns) or the guest's boot (vm) bound over `/dev` before
//! mounting `/dev`'s tmpfs on top: no sandbox process can reach it (nor
//! unmount the cover), and an overlay only takes an upper from a mount of its
//! own namespace, which a descriptor kept from before the root switch is
//! not. In the session's copy of the namespace the init uncovers it once its
//! own `/dev` is staged. A sandbox without it (no disk of its own) keeps
//! persistent uppers on the session's tmpfs too.
use pvisor_proto::agent::{IsolatedBind, IsolatedMount, MountMode};
use pvisor_proto::isolator::Layout;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a session could not be built; `invalid` when the request is at fault.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct LayoutError {
    pub message: String,
    pub invalid: bool,
}

type Result<T> = std::result::Result<T, LayoutError>;

fn sys(what: impl std::fmt::Display, e: impl std::fmt::Display) -> LayoutError {
    LayoutError { message: format!("{what}: {e}"), invalid: false }
}

fn invalid(message: String) -> LayoutError {
    LayoutError { message, invalid: true }
}

/// Where the root is assembled: a tmpfs over the sandbox's `/tmp`, in this
/// namespace only (the sandbox's `/tmp` was opened before).
const STAGE: &str = "/tmp";
const NEWROOT: &str = "/tmp/root";
/// The tmpfs holding memory-backed overlay uppers (never reachable from the session).
const EPHEMERAL: &str = "/tmp/uppers";

/// Mounts replaced by the session's own; the sandbox's are not carried over.
const REPLACED: [&str; 4] = ["/proc", "/dev", "/tmp", "/run"];

/// Device nodes bound from the sandbox's /dev (a user namespace cannot mknod).
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` of mount_setattr(2) (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| invalid(format!("{} contains NUL", p.display())))
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(src, target, fstype, MsFlags::from_bits_retain(flags), data).map_err(|e| {
        let what = fstype.map(str::to_string).or(src.map(|s| s.display().to_string())).unwrap_or_default();
        sys(format!("mount {what} on {}", target.display()), e)
    })
}

fn bind(src: &Path, target: &Path, recursive: bool) -> Result<()> {
    let rec = if recursive { libc::MS_REC } else { 0 };
    mount(Some(src), target, None, libc::MS_BIND | rec, None)
}

/// Makes the mount at `target` (and, `recursive`, every mount below it) read-only.
fn read_only(target: &Path, recursive: bool) -> Result<()> {
    let c = cpath(target)?;
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr reads the NUL-terminated path and a mount_attr of
    // the size passed, both alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(sys(format!("make {} read-only", target.display()), io::Error::last_os_error()));
    }
    Ok(())
}

fn open_path(p: &Path, what: &str) -> Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        // SAFETY: open(2) just returned this fd; nothing else owns it.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .map_err(|e| match e {
            nix::errno::Errno::ENOENT => invalid(format!("{what} {} does not exist in the sandbox", p.display())),
            e => sys(format!("open {what} {}", p.display()), e),
        })
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `p` below [`NEWROOT`].
fn in_root(p: &Path) -> PathBuf {
    Path::new(NEWROOT).join(p.strip_prefix("/").unwrap_or(p))
}

fn under(p: &Path, top: &str) -> bool {
    p.starts_with(top)
}

/// Whether a bind of the sandbox's `source` takes the mounts below it: not
/// for the sandbox's /tmp itself, on which the stage is mounted here.
fn recursive_from(source: &Path) -> bool {
    source != Path::new("/tmp")
}

/// Bytes of the file system at `p`, for sizing a tmpfs like the sandbox's.
fn fs_size(p: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(p).ok()?;
    Some(s.blocks() * s.fragment_size()).filter(|n| *n > 0)
}

/// Makes `p` a directory in the sandbox (`mkdir -p`), the last one owned by
/// `owner` (the session's: a workspace made for it is its own); an existing
/// non-directory is the request's fault.
fn ensure_dir(p: &Path, what: &str, owner: (u32, u32)) -> Result<()> {
    match fs::metadata(p) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(invalid(format!("{what} {} is not a directory", p.display()))),
        Err(_) => {
            fs::create_dir_all(p).map_err(|e| sys(format!("create {what} {}", p.display()), e))?;
            std::os::unix::fs::chown(p, Some(owner.0), Some(owner.1))
                .map_err(|e| sys(format!("chown {what} {} to {}:{}", p.display(), owner.0, owner.1), e))
        }
    }
}

/// A mount point at `target` (inside the new root) of the same kind as the
/// source: made there if missing, else (a read-only root) in the sandbox at
/// `orig`, where the root shows it.
fn mount_point(target: &Path, orig: &Path, dir: bool) -> Result<()> {
    match fs::metadata(target) {
        Ok(md) if md.is_dir() == dir => return Ok(()),
        Ok(_) => {
            let want = if dir { "a directory" } else { "a file" };
            return Err(invalid(format!("{} is not {want}, as its source is", orig.display())));
        }
        Err(_) => {}
    }
    let make = |p: &Path| -> io::Result<()> {
        if dir {
            fs::create_dir_all(p)
        } else {
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::OpenOptions::new().write(true).create(true).truncate(false).open(p).map(drop)
        }
    };
    match make(target) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            make(orig).map_err(|e| sys(format!("create {}", orig.display()), e))
        }
        Err(e) => Err(sys(format!("create {}", target.display()), e)),
    }
}

/// One mount of the session's own, in attach order.
enum Item<'a> {
    Overlay(usize, &'a IsolatedMount),
    Bind(usize, &'a IsolatedBind),
}

impl Item<'_> {
    fn dest(&self) -> &Path {
        match self {
            Item::Overlay(_, m) => Path::new(&m.path),
            Item::Bind(_, b) => Path::new(&b.dest),
        }
    }
}

/// A sandbox mount to carry into the session, from `/proc/self/mountinfo`.
struct Carried {
    point: PathBuf,
}

/// What the session takes from the sandbox's mount table.
struct SandboxMounts {
    /// Mounts on the root itself (their own submounts come along).
    top: Vec<Carried>,
    /// The sandbox's overrides of proc entries.
    proc_overrides: Vec<Carried>,
    /// A mount under the sandbox's `/dev`: the directory of persistent uppers.
    covered_dev: bool,
}

/// Decodes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// The sandbox's mounts to carry over (see [`SandboxMounts`]), by mount point.
fn sandbox_mounts(mountinfo: &str) -> SandboxMounts {
    let entries: Vec<(u64, u64, PathBuf)> = mountinfo
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let id = f.next()?.parse().ok()?;
            let parent = f.next()?.parse().ok()?;
            let point = unescape(f.nth(2)?);
            Some((id, parent, point))
        })
        .collect();
    // The topmost mount on "/" is the root (earlier ones are below it).
    let Some(root) = entries.iter().rev().find(|e| e.2 == Path::new("/")).map(|e| e.0) else {
        return SandboxMounts { top: vec![], proc_overrides: vec![], covered_dev: false };
    };
    let proc_ = entries.iter().rev().find(|e| e.1 == root && e.2 == Path::new("/proc")).map(|e| e.0);
    let top = entries
        .iter()
        .filter(|e| e.1 == root && e.0 != root && !REPLACED.iter().any(|r| under(&e.2, r)))
        .map(|e| Carried { point: e.2.clone() })
        .collect();
    let proc_overrides = entries
        .iter()
        .filter(|e| Some(e.1) == proc_ && e.2.starts_with("/proc/"))
        .map(|e| Carried { point: e.2.clone() })
        .collect();
    let dev = Path::new("/dev");
    let covered_dev = entries
        .iter()
        .filter(|e| e.1 == root && e.2 == dev)
        .any(|below| entries.iter().any(|e| e.1 == below.0 && e.2 == dev));
    SandboxMounts { top, proc_overrides, covered_dev }
}

/// Uncovers the directory of persistent uppers under the sandbox's `/dev`
/// (in this namespace only) and opens the session's own in it.
fn uncover_uppers(id: &str) -> Result<OwnedFd> {
    nix::mount::umount2("/dev", nix::mount::MntFlags::MNT_DETACH).map_err(|e| sys("uncover the uppers", e))?;
    open_path(&Path::new("/dev").join(id), "the session's uppers")
}

/// Mounts an overlay of `lower` at `target`, its upper and work dirs in `dir`/`k`.
fn overlay(lower: &OwnedFd, dir: &Path, k: usize, target: &Path) -> Result<()> {
    let base = dir.join(k.to_string());
    let (upper, work) = (base.join("upper"), base.join("work"));
    for d in [&base, &upper, &work] {
        fs::create_dir(d).map_err(|e| sys(format!("create {}", d.display()), e))?;
    }
    // The merged root shows the upper's root: give it the lower's owner and mode.
    let md = fs::metadata(fd_path(lower)).map_err(|e| sys("stat overlay lower", e))?;
    std::os::unix::fs::chown(&upper, Some(md.uid()), Some(md.gid())).map_err(|e| sys("chown upper", e))?;
    fs::set_permissions(&upper, fs::Permissions::from_mode(md.mode() & 0o7777)).map_err(|e| sys("chmod upper", e))?;
    let opts = format!("lowerdir={},upperdir={},workdir={}", fd_path(lower).display(), upper.display(), work.display());
    // In a user namespace (ns) the overlay keeps its metadata in user.*
    // xattrs; a vm guest's (initial namespace) may use trusted.* ones.
    mount(Some(Path::new("overlay")), target, Some("overlay"), 0, Some(&format!("{opts},userxattr")))
        .or_else(|_| mount(Some(Path::new("overlay")), target, Some("overlay"), 0, Some(&opts)))
}

/// Builds session `id`'s root and switches to it; returns it (O_PATH).
pub fn build(l: &Layout, id: &str) -> Result<OwnedFd> {
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None)?;

    // 1. Everything the session takes from the sandbox, resolved in its view.
    for m in l.overlays.iter().filter(|m| m.path != "/") {
        ensure_dir(Path::new(&m.path), "overlay path", (l.uid, l.gid))?;
    }
    let lowers =
        l.overlays.iter().map(|m| open_path(Path::new(&m.path), "overlay path")).collect::<Result<Vec<_>>>()?;
    let sources = l
        .binds
        .iter()
        .map(|b| {
            let fd = open_path(Path::new(&b.source), "bind source")?;
            let dir = fs::metadata(fd_path(&fd)).map_err(|e| sys("stat bind source", e))?.is_dir();
            Ok((fd, dir))
        })
        .collect::<Result<Vec<_>>>()?;
    let root_fd = open_path(Path::new("/"), "root")?;
    let tmp_fd = open_path(Path::new("/tmp"), "/tmp")?;
    let tmp_size = fs_size(Path::new("/tmp")).unwrap_or(256 << 20);
    let shm_size = fs_size(Path::new("/dev/shm")).unwrap_or(64 << 20);
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| sys("read mountinfo", e))?;
    let SandboxMounts { top: carried, proc_overrides, covered_dev } = sandbox_mounts(&mountinfo);
    let proc_fds = proc_overrides
        .iter()
        .map(|c| Ok((open_path(&c.point, "proc entry")?, c.point.clone())))
        .collect::<Result<Vec<_>>>()?;

    // 2. The stage, over the sandbox's /tmp in this namespace only; the
    //    session's /dev is made there (from the sandbox's nodes) before the
    //    sandbox's /dev leaves this namespace to uncover the uppers.
    let nsd = libc::MS_NOSUID | libc::MS_NODEV;
    mount(Some(Path::new("tmpfs")), Path::new(STAGE), Some("tmpfs"), nsd, Some("mode=0700,size=64k"))?;
    let newroot = Path::new(NEWROOT);
    fs::create_dir(newroot).map_err(|e| sys("create the new root", e))?;
    let dev = Path::new(STAGE).join("dev");
    fs::create_dir(&dev).map_err(|e| sys("create the staged /dev", e))?;
    make_dev(&dev, shm_size)?;
    let persisted = match (covered_dev, l.overlays.iter().any(|m| m.mode() == MountMode::Overlay && m.persist)) {
        (true, true) => Some(uncover_uppers(id)?),
        _ => None,
    };
    let ephemeral = Path::new(EPHEMERAL);
    if l.overlays.iter().any(|m| m.mode() == MountMode::Overlay && (!m.persist || persisted.is_none())) {
        fs::create_dir(ephemeral).map_err(|e| sys("create the upper tmpfs", e))?;
        let opts = format!("mode=0700,size={tmp_size}");
        mount(Some(Path::new("tmpfs")), ephemeral, Some("tmpfs"), nsd, Some(&opts))?;
    }
    let upper_dir = |m: &IsolatedMount| -> PathBuf {
        match (m.persist, &persisted) {
            (true, Some(fd)) => fd_path(fd),
            _ => ephemeral.to_path_buf(),
        }
    };

    // 3. The root: the sandbox's, read-only, or an overlay of it.
    let root_spec = l.overlays.iter().position(|m| m.path == "/");
    match root_spec.map(|i| (i, &l.overlays[i])) {
        Some((i, m)) if m.mode() == MountMode::Overlay => overlay(&root_fd, &upper_dir(m), i, newroot)?,
        Some((_, m)) if m.mode() == MountMode::Rw => bind(&fd_path(&root_fd), newroot, false)?,
        _ => {
            bind(&fd_path(&root_fd), newroot, false)?;
            read_only(newroot, false)?;
        }
    }
    for c in &carried {
        let target = in_root(&c.point);
        if fs::symlink_metadata(&target).is_err() {
            continue; // not in a `/` overlay's lower: nothing to mount on
        }
        bind(&c.point, &target, true)?;
        read_only(&target, true)?;
    }

    // 4. /proc, /dev, /tmp, /run of the session's own.
    let proc_ = in_root(Path::new("/proc"));
    mount(Some(Path::new("proc")), &proc_, Some("proc"), nsd | libc::MS_NOEXEC, None)?;
    for (fd, point) in &proc_fds {
        let target = in_root(point);
        if fs::symlink_metadata(&target).is_ok() {
            bind(&fd_path(fd), &target, false)?;
            read_only(&target, false)?;
        }
    }
    mount(Some(&dev), &in_root(Path::new("/dev")), None, libc::MS_MOVE, None)?;
    let tmp = in_root(Path::new("/tmp"));
    mount_point(&tmp, Path::new("/tmp"), true)?;
    if l.private_tmp {
        mount(Some(Path::new("tmpfs")), &tmp, Some("tmpfs"), nsd, Some(&format!("mode=1777,size={tmp_size}")))?;
    } else {
        // Not recursive: the stage is mounted on the sandbox's /tmp here.
        bind(&fd_path(&tmp_fd), &tmp, false)?;
    }
    let run = in_root(Path::new("/run"));
    if fs::metadata(&run).map(|m| m.is_dir()).unwrap_or(false) {
        mount(Some(Path::new("tmpfs")), &run, Some("tmpfs"), nsd, Some(&format!("mode=755,size={tmp_size}")))?;
    }

    // 5. The session's own mounts, shallowest first (a nested one shadows its parent there).
    let mut items: Vec<Item> = l
        .overlays
        .iter()
        .enumerate()
        .filter(|(_, m)| m.path != "/")
        .map(|(i, m)| Item::Overlay(i, m))
        .chain(l.binds.iter().enumerate().map(|(i, b)| Item::Bind(i, b)))
        .collect();
    items.sort_by_key(|it| it.dest().components().count());
    for it in &items {
        let target = in_root(it.dest());
        match it {
            Item::Overlay(i, m) => {
                mount_point(&target, Path::new(&m.path), true)?;
                match m.mode() {
                    MountMode::Overlay => overlay(&lowers[*i], &upper_dir(m), *i, &target)?,
                    mode => {
                        bind(&fd_path(&lowers[*i]), &target, recursive_from(Path::new(&m.path)))?;
                        if mode == MountMode::Ro {
                            read_only(&target, true)?;
                        }
                    }
                }
            }
            Item::Bind(i, b) => {
                let (fd, dir) = &sources[*i];
                mount_point(&target, Path::new(&b.dest), *dir)?;
                bind(&fd_path(fd), &target, recursive_from(Path::new(&b.source)))?;
                if b.readonly {
                    read_only(&target, true)?;
                }
            }
        }
    }

    // 6. Into the new root; the sandbox's tree (and the stage) leave the namespace.
    std::env::set_current_dir(newroot).map_err(|e| sys("chdir to the new root", e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| sys("pivot_root", e))?;
    nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH).map_err(|e| sys("detach the sandbox's root", e))?;
    std::env::set_current_dir("/").map_err(|e| sys("chdir /", e))?;
    if !l.share_net {
        pvisor_net::iface::loopback_up().map_err(|e| sys("loopback", e))?;
    }
    drop((lowers, sources, root_fd, tmp_fd, proc_fds, persisted));
    open_path(Path::new("/"), "the session's root")
}

/// A /dev of the session's own at `dev`: a tmpfs with the sandbox's usual
/// nodes bound in, its own devpts and `/dev/shm`.
fn make_dev(dev: &Path, shm_size: u64) -> Result<()> {
    let nsd = libc::MS_NOSUID | libc::MS_NODEV;
    mount(
        Some(Path::new("tmpfs")),
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=1024k"),
    )?;
    for d in DEVICES {
        let node = dev.join(d);
        fs::write(&node, b"").map_err(|e| sys(format!("create {}", node.display()), e))?;
        bind(&Path::new("/dev").join(d), &node, false)?;
    }
    fs::create_dir(dev.join("pts")).map_err(|e| sys("create /dev/pts", e))?;
    let pts = Some("newinstance,ptmxmode=0666,mode=0620");
    if mount(Some(Path::new("devpts")), &dev.join("pts"), Some("devpts"), libc::MS_NOSUID | libc::MS_NOEXEC, pts)
        .is_ok()
    {
        let _ = symlink("pts/ptmx", dev.join("ptmx"));
    }
    fs::create_dir(dev.join("shm")).map_err(|e| sys("create /dev/shm", e))?;
    mount(Some(Path::new("tmpfs")), &dev.join("shm"), Some("tmpfs"), nsd, Some(&format!("mode=1777,size={shm_size}")))?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = symlink(target, dev.join(name));
    }
    Ok(())
}

/// Whether sessions can be built here: in a throwaway child of the isolator
/// (the session's namespaces), a tmpfs, an overlay on it and a proc mount.
pub fn probe() -> Result<()> {
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    let nsd = libc::MS_NOSUID | libc::MS_NODEV;
    mount(Some(Path::new("tmpfs")), Path::new(STAGE), Some("tmpfs"), nsd, Some("mode=0700,size=64k"))?;
    let base = Path::new(STAGE);
    for d in ["lower", "merged", "proc", "u"] {
        fs::create_dir(base.join(d)).map_err(|e| sys(format!("create {d}"), e))?;
    }
    let lower = open_path(&base.join("lower"), "lower")?;
    overlay(&lower, &base.join("u"), 0, &base.join("merged"))?;
    fs::write(base.join("merged/probe"), b"x").map_err(|e| sys("write to an overlay", e))?;
    mount(Some(Path::new("proc")), &base.join("proc"), Some("proc"), nsd | libc::MS_NOEXEC, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_top_level_and_proc_overrides() {
        let mi = "\
20 1 0:1 / / rw - overlay overlay rw
21 20 0:2 / /proc rw - proc proc rw
22 21 0:3 /meminfo /proc/meminfo ro - ext4 /dev/x rw
23 20 0:4 / /dev rw - tmpfs tmpfs rw
24 23 0:5 / /dev/pts rw - devpts devpts rw
25 20 0:6 / /tmp rw - tmpfs tmpfs rw
26 20 0:7 / /sys ro - sysfs sysfs ro
27 20 0:8 / /data\\040set rw - ext4 /dev/y rw
28 27 0:9 / /data\\040set/inner rw - ext4 /dev/z rw
";
        let m = sandbox_mounts(mi);
        let names = |v: &[Carried]| v.iter().map(|c| c.point.display().to_string()).collect::<Vec<_>>();
        assert_eq!(names(&m.top), ["/sys", "/data set"], "submounts of carried mounts come with them");
        assert_eq!(names(&m.proc_overrides), ["/proc/meminfo"]);
        assert!(!m.covered_dev);
    }

    #[test]
    fn a_mount_under_dev_is_the_uppers() {
        let mi = "\
20 1 0:1 / / rw - overlay overlay rw
40 20 0:9 /isolated /dev rw - ext4 /dev/loop1 rw
41 40 0:4 / /dev rw - tmpfs tmpfs rw
42 41 0:5 / /dev/pts rw - devpts devpts rw
";
        let m = sandbox_mounts(mi);
        assert!(m.covered_dev);
        assert!(m.top.is_empty(), "neither /dev mount is carried");
    }

    #[test]
    fn the_topmost_root_wins() {
        let mi = "1 0 0:1 / / rw - rootfs rootfs rw\n30 1 0:2 / / rw - overlay o rw\n31 1 0:3 / /old rw - x x rw\n32 30 0:4 / /sys ro - sysfs s ro\n";
        let m = sandbox_mounts(mi);
        assert_eq!(m.top.iter().map(|c| c.point.display().to_string()).collect::<Vec<_>>(), ["/sys"]);
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("/a\\040b\\011c"), PathBuf::from("/a b\tc"));
        assert_eq!(unescape("/trailing\\04"), PathBuf::from("/trailing\\04"));
    }
}

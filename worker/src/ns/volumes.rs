//! Volumes of an ns sandbox, mounted by file descriptor so that no path is
//! looked up twice.
//!
//! * [`detach`]: the source is resolved beneath the root the broker trusts
//!   (an allowed host prefix, a named volume's data directory) with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, and that fd is cloned
//!   into a detached mount tree (`open_tree(OPEN_TREE_CLONE)`), read-only and
//!   private before it is attached anywhere (`mount_setattr`). A symlink
//!   swapped in later changes nothing: the tree is the resolved directory.
//! * [`idmap`]: with a root worker, the tree is idmapped through the
//!   sandbox's user namespace (host id `i` appears as sandbox id `i`), so
//!   sandbox root can write a root-owned host directory. The kernel allows
//!   this only to host CAP_SYS_ADMIN; an unprivileged worker's sandbox root
//!   is the invoking user, which owns what it can write anyway.
//! * [`attach`]: in the sandbox's init, before `pivot_root`: the mount point
//!   is resolved inside the new root (`RESOLVE_IN_ROOT`: an image symlink
//!   there cannot lead out), created if missing, and the tree moved onto its
//!   fd (`move_mount`).
//!
//! The sandbox never holds CAP_SYS_ADMIN, so it can neither unmount a volume
//! nor remount a read-only one read-write.
use crate::config::Volume;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `struct mount_attr` of mount_setattr(2) (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: u32 = 0x1;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `openat2(dir, rel, flags, resolve)`; an empty `rel` opens `dir` itself.
pub fn openat2(dir: BorrowedFd, rel: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let c = cpath(rel)?;
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: 0, resolve };
    // SAFETY: `c` is a NUL-terminated path and `how` a valid open_how of the
    // size passed; the kernel only reads both.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), c.as_ptr(), &how as *const OpenHow, size_of::<OpenHow>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens a directory (O_PATH) the caller trusts.
pub fn open_dir(p: &Path) -> io::Result<OwnedFd> {
    let c = cpath(p)?;
    // SAFETY: open with a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The normal components of a relative path (`..` and the like refused).
fn parts(rel: &Path) -> io::Result<Vec<&std::ffi::OsStr>> {
    rel.components()
        .filter(|c| !matches!(c, Component::CurDir | Component::RootDir))
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: `..` is not allowed", rel.display()))),
        })
        .collect()
}

/// How the last component of a path is created when missing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    Dir,
    File,
}

/// `mkdir -p` of `rel` under `root`, every prefix resolved from `root` with
/// `resolve` (RESOLVE_BENEATH for host prefixes, RESOLVE_IN_ROOT inside a
/// sandbox root); returns an O_PATH fd of the result.
pub fn create_under(root: BorrowedFd, rel: &Path, resolve: u64, leaf: Leaf) -> io::Result<OwnedFd> {
    let parts = parts(rel)?;
    let mut sofar = PathBuf::new();
    for (i, name) in parts.iter().enumerate() {
        let next = sofar.join(name);
        let last = i + 1 == parts.len();
        match openat2(root, &next, libc::O_PATH, resolve) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let parent = openat2(root, &sofar, libc::O_PATH | libc::O_DIRECTORY, resolve)?;
                let c = cpath(Path::new(name))?;
                let r = if last && leaf == Leaf::File {
                    // SAFETY: openat with a directory fd and a one-component name.
                    let fd = unsafe {
                        libc::openat(
                            parent.as_raw_fd(),
                            c.as_ptr(),
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                            0o644,
                        )
                    };
                    // SAFETY: a non-negative fd is ours to close.
                    (fd >= 0).then(|| drop(unsafe { OwnedFd::from_raw_fd(fd) })).map_or(-1, |_| 0)
                } else {
                    // SAFETY: mkdirat with a directory fd and a one-component name.
                    unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o755) }
                };
                if r != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(e);
                    }
                }
            }
            Err(e) => return Err(e),
        }
        sofar = next;
    }
    openat2(root, &sofar, libc::O_PATH, resolve)
}

/// Whether an fd is a directory.
fn is_dir(fd: BorrowedFd) -> io::Result<bool> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(io::Error::from)?;
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

fn setattr(tree: BorrowedFd, attr: &MountAttr) -> io::Result<()> {
    let empty = c"";
    // SAFETY: mount_setattr on an fd we own with an empty path, a valid
    // mount_attr of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A volume's source as a detached mount tree, ready to attach.
pub struct Detached {
    pub name: String,
    pub tree: OwnedFd,
    pub mount_path: String,
    pub is_dir: bool,
}

/// Resolves a volume's source beneath its root and clones it into a
/// detached, private mount tree (read-only if asked).
pub fn detach(v: &Volume) -> Result<Detached, String> {
    let err = |what: &str, e: io::Error| format!("volume {}: {what}: {e}", v.name);
    let root = open_dir(Path::new(&v.source_root)).map_err(|e| err(&format!("open {}", v.source_root), e))?;
    let src = openat2(
        root.as_fd(),
        Path::new(&v.source_path),
        libc::O_PATH,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::EXDEV) | Some(libc::ELOOP) => {
            format!("volume {}: {:?} leads outside {}", v.name, v.source_path, v.source_root)
        }
        _ => err(&format!("resolve {:?} beneath {}", v.source_path, v.source_root), e),
    })?;
    let is_dir = is_dir(src.as_fd()).map_err(|e| err("stat", e))?;
    let empty = c"";
    // SAFETY: open_tree on an fd we own with an empty path; returns a new fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32,
        )
    };
    if fd < 0 {
        return Err(err("open_tree", io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned a fresh fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: if v.read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    setattr(tree.as_fd(), &attr).map_err(|e| err("mount_setattr", e))?;
    Ok(Detached { name: v.name.clone(), tree, mount_path: v.mount_path.clone(), is_dir })
}

/// Idmaps a detached tree through a user namespace (`/proc/<pid>/ns/user`).
pub fn idmap(tree: &OwnedFd, userns: &OwnedFd) -> io::Result<()> {
    let attr =
        MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: userns.as_raw_fd() as u64 };
    setattr(tree.as_fd(), &attr)
}

/// Moves a detached tree onto its mount point inside `root` (the new root,
/// before pivot_root), creating the mount point if it is missing.
pub fn attach(root: &Path, d: &Detached) -> Result<(), String> {
    let err = |what: &str, e: io::Error| format!("volume {} at {}: {what}: {e}", d.name, d.mount_path);
    let root_fd = open_dir(root).map_err(|e| err("open root", e))?;
    let rel = Path::new(d.mount_path.trim_start_matches('/'));
    let leaf = if d.is_dir { Leaf::Dir } else { Leaf::File };
    let target = create_under(root_fd.as_fd(), rel, libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS, leaf)
        .map_err(|e| err("mount point", e))?;
    if is_dir(target.as_fd()).map_err(|e| err("stat mount point", e))? != d.is_dir {
        let want = if d.is_dir { "a directory" } else { "a file" };
        return Err(format!("volume {} at {}: the mount point is not {want}", d.name, d.mount_path));
    }
    let empty = c"";
    // SAFETY: move_mount from a detached tree fd onto a target fd, both
    // ours, with empty paths.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            d.tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(err("move_mount", io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child inside new user and mount namespaces
    /// (fork: the test harness is multi-threaded, unshare needs a single
    /// thread); the child's exit code 0 means `f` returned Ok.
    fn in_namespaces(f: impl FnOnce() -> Result<(), String>) {
        // SAFETY: the child only makes syscalls and allocates (glibc's fork
        // resets the allocator's locks), then exits without unwinding.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let r =
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS)
                        .map_err(|e| format!("unshare: {e}"))
                        .and_then(|()| f());
                if let Err(e) = &r {
                    eprintln!("{e}");
                }
                // SAFETY: _exit ends the forked child at once.
                unsafe { libc::_exit(r.is_err() as i32) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let st = nix::sys::wait::waitpid(child, None).expect("waitpid");
                assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0), "child failed (see its stderr)");
            }
        }
    }

    fn volume(root: &Path, rel: &str, mount_path: &str, read_only: bool) -> Volume {
        Volume {
            name: "t".into(),
            source_root: root.to_string_lossy().into_owned(),
            source_path: rel.into(),
            mount_path: mount_path.into(),
            read_only,
        }
    }

    #[test]
    fn the_resolved_directory_is_mounted_even_if_swapped_for_a_symlink() {
        let d = tempfile::tempdir().expect("tempdir");
        let (allowed, newroot) = (d.path().join("allowed"), d.path().join("root"));
        std::fs::create_dir_all(allowed.join("vol")).expect("mkdir");
        std::fs::create_dir_all(&newroot).expect("mkdir");
        std::fs::write(allowed.join("vol/marker"), "original").expect("write");
        in_namespaces(|| {
            let tree = detach(&volume(&allowed, "vol", "/mnt/v", true))?;
            // Swapped after the resolution: the path now leads to /etc.
            std::fs::rename(allowed.join("vol"), allowed.join("moved")).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink("/etc", allowed.join("vol")).map_err(|e| e.to_string())?;
            attach(&newroot, &tree)?;
            let got = std::fs::read_to_string(newroot.join("mnt/v/marker")).map_err(|e| e.to_string())?;
            if got != "original" {
                return Err(format!("mounted {got:?}"));
            }
            match std::fs::write(newroot.join("mnt/v/new"), "x") {
                Err(e) if e.raw_os_error() == Some(libc::EROFS) => Ok(()),
                other => Err(format!("write to a read-only volume: {other:?}")),
            }
        });
    }

    #[test]
    fn sources_leading_out_of_their_root_are_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let allowed = d.path().join("allowed");
        std::fs::create_dir_all(&allowed).expect("mkdir");
        std::os::unix::fs::symlink("/", allowed.join("abs")).expect("symlink");
        std::os::unix::fs::symlink("..", allowed.join("up")).expect("symlink");
        std::os::unix::fs::symlink("/proc/self/root", allowed.join("magic")).expect("symlink");
        in_namespaces(|| {
            for rel in ["abs", "abs/etc", "up", "magic", "../"] {
                if detach(&volume(&allowed, rel, "/m", false)).is_ok() {
                    return Err(format!("{rel} was resolved"));
                }
            }
            Ok(())
        });
    }

    #[test]
    fn mount_points_resolve_inside_the_new_root() {
        let d = tempfile::tempdir().expect("tempdir");
        let (src, newroot, outside) = (d.path().join("src"), d.path().join("root"), d.path().join("outside"));
        for p in [&src, &newroot, &outside] {
            std::fs::create_dir_all(p).expect("mkdir");
        }
        std::fs::write(src.join("marker"), "vol").expect("write");
        // An image symlink pointing at a host path (absolute, as the host
        // sees it), whose target the image also has.
        std::os::unix::fs::symlink(&outside, newroot.join("link")).expect("symlink");
        let rel_outside = outside.strip_prefix("/").expect("absolute").to_path_buf();
        std::fs::create_dir_all(newroot.join(&rel_outside)).expect("mkdir");
        in_namespaces(|| {
            let tree = detach(&volume(&src, "", "/link/sub", false))?;
            attach(&newroot, &tree)?;
            // Resolved as if newroot were `/`: <newroot><outside>/sub.
            let inside = newroot.join(&rel_outside).join("sub/marker");
            let got = std::fs::read_to_string(&inside).map_err(|e| format!("{}: {e}", inside.display()))?;
            if got != "vol" || outside.join("sub").exists() {
                return Err("the mount point left the new root".into());
            }
            Ok(())
        });
    }
}

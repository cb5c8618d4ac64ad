//! netd jails itself before it reads anything from the sandbox: no new
//! privileges, a user and mount namespace of its own whose root is an empty
//! read-only tmpfs (no file can be reached or opened), every capability
//! dropped, non-dumpable, then the netd seccomp filter (an allow list that
//! kills on anything else: no open, no exec, only AF_INET sockets).
//!
//! All of it works unprivileged (the user namespace provides what the mount
//! needs); as root it is the same, root inside maps to the caller only.
use std::fs;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{chdir, getgid, getuid, pivot_root};

use crate::error::Error;

fn jail_err(what: &str) -> impl FnOnce(nix::Error) -> Error + '_ {
    move |e| Error::Jail(format!("{what}: {e}"))
}

/// Where the empty root is mounted before netd pivots into it.
const NEW_ROOT: &str = "/tmp";

pub fn jail() -> Result<(), Error> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(Error::Jail(format!("no_new_privs: {}", std::io::Error::last_os_error())));
    }
    let (uid, gid) = (getuid(), getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(jail_err("unshare user+mount namespace"))?;
    // Map netd's own ids, where the kernel lets it: mapping host root needs
    // CAP_SETFCAP, which a worker-spawned netd (no capabilities) lacks. The
    // jail needs no mapping (nothing below creates files or changes ids), so
    // an unmapped netd runs as the overflow id inside, which is fine.
    let write = |path: &str, s: String| fs::write(path, s);
    if write("/proc/self/setgroups", "deny".into()).is_ok() && write("/proc/self/uid_map", format!("0 {uid} 1")).is_ok()
    {
        let _ = write("/proc/self/gid_map", format!("0 {gid} 1"));
    }

    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(jail_err("make mounts private"))?;
    let nothing = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), NEW_ROOT, Some("tmpfs"), nothing, Some("size=4k,nr_inodes=2,mode=0500"))
        .map_err(jail_err("mount the empty root"))?;
    chdir(NEW_ROOT).map_err(jail_err("chdir to the empty root"))?;
    // pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new one.
    pivot_root(".", ".").map_err(jail_err("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(jail_err("detach the old root"))?;
    chdir("/").map_err(jail_err("chdir /"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nothing, None::<&str>)
        .map_err(jail_err("remount the empty root read-only"))?;

    drop_capabilities()?;
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };

    let filter = pvisor_seccomp::filter(pvisor_seccomp::FilterKind::Netd).map_err(|e| Error::Jail(e.to_string()))?;
    pvisor_seccomp::apply_to_thread(&filter).map_err(|e| Error::Jail(e.to_string()))
}

/// Empties every capability set (the user namespace granted a full one).
fn drop_capabilities() -> Result<(), Error> {
    use caps::CapSet;
    let err = |e: caps::errors::CapsError| Error::Jail(format!("drop capabilities: {e}"));
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(err)?;
    }
    for set in [CapSet::Ambient, CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(err)?;
    }
    Ok(())
}

//! Jailing `pvisor-imaged` once its mount is live: it keeps only what serving needs.
//!
//! In order: not dumpable (no ptrace, no core dumps, /proc/PID files owned by root); every
//! capability dropped from every set (bounding and ambient included, so nothing comes back);
//! `no_new_privs`; the seccomp allow list `pvisor_seccomp::image_server_filter` on all
//! threads. After that the process can serve requests on the fds it already holds and nothing
//! else: it cannot open a file, unmount, exec or fork. Unmounting is therefore the broker's
//! job (`umount2(MNT_DETACH)` once the server has exited).

use std::io;

use caps::{CapSet, CapsHashSet};

use super::error::{Error, Result};

/// Jails the calling process (all its threads for seccomp; capabilities are per thread, so call
/// this before starting any thread).
pub fn jail() -> Result<()> {
    prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE")?;
    drop_capabilities()?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")?;
    let filter = pvisor_seccomp::image_server_filter()?;
    pvisor_seccomp::apply_to_all_threads(&filter)?;
    Ok(())
}

fn prctl(option: libc::c_int, value: libc::c_ulong, step: &'static str) -> Result<()> {
    // SAFETY: PR_SET_DUMPABLE and PR_SET_NO_NEW_PRIVS take an integer and no pointers.
    let rc = unsafe { libc::prctl(option, value, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc != 0 {
        return Err(Error::Jail { step, source: io::Error::last_os_error() });
    }
    Ok(())
}

/// Empties every capability set of the calling thread. The bounding set needs CAP_SETPCAP to
/// shrink; without it (a non-root server) it is left alone: with `no_new_privs` and no
/// `execve` it can never raise anything.
fn drop_capabilities() -> Result<()> {
    let fail = |step: &'static str| move |e: caps::errors::CapsError| Error::Jail { step, source: io::Error::other(e) };
    if caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP).map_err(fail("capabilities"))? {
        for cap in caps::all() {
            caps::drop(None, CapSet::Bounding, cap).map_err(fail("bounding capabilities"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(fail("ambient capabilities"))?;
    for (set, step) in [
        (CapSet::Inheritable, "inheritable capabilities"),
        (CapSet::Effective, "effective capabilities"),
        (CapSet::Permitted, "permitted capabilities"),
    ] {
        caps::set(None, set, &CapsHashSet::new()).map_err(fail(step))?;
    }
    Ok(())
}

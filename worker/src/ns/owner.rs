//! Who owns the sandbox's user namespace, and so where the kernel charges
//! its per-user counts.
//!
//! The kernel keeps per-user counts (`ucounts`: inotify instances and
//! watches, POSIX message-queue bytes, pending signals, processes, user
//! namespaces) per (user namespace, uid), and charges each count at every
//! level up to the initial namespace; one level up, a namespace's charges
//! land on its *owner*, the creator's effective uid at `clone`. A root
//! worker that clones as uid 0 makes every sandbox's charges land on (init,
//! 0): one sandbox taking all 128 inotify instances starves the others and
//! host root. So a root worker clones with the effective uid
//! [`OWNER_UID_BASE`] + its own pid: unique among live workers (pids are),
//! used by no host process, mapped in no sandbox. The sandbox lives no
//! longer than its worker (it dies with its init, which has PDEATHSIG), so
//! a reused pid never meets a namespace of the same owner still charged.
//!
//! Only the effective uid changes around the `clone`: the real and saved
//! uids stay 0 (so the worker can go back), the file-system uid is set back
//! to 0 (the child opens the state dir and `/dev/net/tun` by owner
//! permission before its maps exist, as it did when it cloned as root), and
//! the worker regains its effective capabilities with its euid. An
//! unprivileged worker cannot change uids: all its sandboxes, and the user's
//! own processes, share one owner.
use crate::error::{Result, WorkerError};

/// First host uid of sandbox user-namespace owners (`0x70000000`): above
/// the sandboxes' mapped range and any `/etc/subuid` range in use, below
/// 2^31 (tools that treat uids as signed), with room for every pid
/// (`pid_max` is at most 2^22).
pub const OWNER_UID_BASE: u32 = 0x7000_0000;

/// The owner a worker with pid `pid` gives its sandbox.
pub fn owner_uid(pid: u32) -> u32 {
    OWNER_UID_BASE + pid
}

fn set_euid(uid: u32) -> Result<()> {
    // SAFETY: setresuid with -1 for the real and saved ids changes only the
    // effective (and file-system) uid of the calling, single-threaded process.
    let r = unsafe { libc::setresuid(u32::MAX, uid, u32::MAX) };
    if r != 0 {
        return Err(WorkerError::sys(format!("seteuid {uid}"), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Runs `clone` (or anything creating a user namespace) with the effective
/// uid `owner`, when this process is root; else just runs it.
pub fn as_owner<T>(owner: u32, clone: impl FnOnce() -> Result<T>) -> Result<T> {
    if !nix::unistd::geteuid().is_root() || owner == 0 {
        return clone();
    }
    set_euid(owner)?;
    // SAFETY: setfsuid only changes the calling thread's file-system uid;
    // 0 is the real uid, which an unprivileged process may always take.
    unsafe { libc::setfsuid(0) };
    let r = clone();
    // Back to euid 0: the kernel copies the permitted capabilities (kept, as
    // the real and saved uids stayed 0) into the effective set.
    set_euid(0)?;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_distinct_and_outside_the_sandbox_range() {
        assert_ne!(owner_uid(1), owner_uid(2));
        assert!(owner_uid(4 << 20) < 1 << 31);
        const { assert!(OWNER_UID_BASE > 100_000 + 65_536) };
    }
}

//! Processes the broker did not start in this run (workers and image
//! servers of a previous broker): found by pid, proven to be the same
//! process by its start time and name, then held by a pidfd, so no later
//! signal or wait can reach a recycled pid.
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// Who a process is: its pid, when it started (clock ticks since boot,
/// field 22 of `/proc/<pid>/stat`) and the start of its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: u32,
    pub start_ticks: u64,
}

/// Names a pvisor process may have (`comm` is cut at 15 bytes).
const OUR_NAMES: &[&str] = &["pvisor-worker", "pvisor-imaged"];

/// `comm` and start time of `pid`, if it exists.
fn stat_of(pid: u32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // Fields after comm start at field 3; start time is field 22.
    let start = stat.get(close + 2..)?.split_whitespace().nth(19)?.parse().ok()?;
    Some((comm, start))
}

impl ProcId {
    /// The identity of a live process.
    pub fn of(pid: u32) -> Option<ProcId> {
        stat_of(pid).map(|(_, start_ticks)| ProcId { pid, start_ticks })
    }

    /// A pidfd of the process, if it is still the one recorded (same start
    /// time, a pvisor name) and has not exited. The identity is checked
    /// again after the pidfd is open, so a pid recycled in between is not
    /// taken for it.
    pub fn open(&self) -> Option<OwnedFd> {
        let is_ours = || {
            stat_of(self.pid).is_some_and(|(comm, start)| {
                start == self.start_ticks && OUR_NAMES.iter().any(|n| n.starts_with(comm.as_str()) && !comm.is_empty())
            })
        };
        if !is_ours() {
            return None;
        }
        let fd = pidfd_open(self.pid)?;
        (is_ours() && !exited(&fd)).then_some(fd)
    }
}

/// A pidfd for `pid` (None if it is gone or the kernel has no pidfd_open).
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// True once the process of `fd` has exited (a pidfd polls readable then).
pub fn exited(fd: &OwnedFd) -> bool {
    let mut pfd = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut pfd, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Sends `sig` through a pidfd.
pub fn pidfd_signal(fd: &OwnedFd, sig: libc::c_int) {
    // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo, no flags.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0);
    }
}

/// Waits (asynchronously) until the process of `fd` exits.
pub async fn wait_exit(fd: &OwnedFd) {
    let dup = match fd.try_clone() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("pidfd: {e}; polling instead");
            while !exited(fd) {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            return;
        }
    };
    // SAFETY: `dup` is an OwnedFd moved into the AsyncFd: it stays open, and
    // is the same description, for as long as the AsyncFd lives.
    let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) };
    match registered {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!("pidfd: {e}; polling instead");
            while !exited(fd) {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity_is_read_but_not_taken_for_a_pvisor_process() {
        let me = ProcId::of(std::process::id()).expect("own stat");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_ticks > 0);
        // The test binary is not named pvisor-worker/-imaged: never adopted.
        assert!(me.open().is_none());
        let other = ProcId { pid: me.pid, start_ticks: me.start_ticks + 1 };
        assert!(other.open().is_none());
    }

    #[test]
    fn an_exited_child_polls_readable() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let fd = pidfd_open(child.id()).expect("pidfd");
        let _ = child.wait();
        assert!(exited(&fd));
    }
}

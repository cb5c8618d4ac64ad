//! Keeping the worker and the sandbox's agent responsive under the sandbox's
//! own memory pressure.
//!
//! Without swap, the only memory a cgroup can reclaim is file-backed pages:
//! under a fork bomb or a memory hog the kernel evicts the text of the
//! worker and of the agent and they thrash, unable to run the very timeout
//! or kill that would end the pressure. Both lock the pages they touch
//! (`MCL_ONFAULT`: nothing is prefaulted; locked pages are charged to the
//! sandbox's group like any other) and keep out of the OOM killer's way.
//!
//! CPU is the same story: a fork bomb's thousands of runnable processes share
//! the group's quota with the worker and agent. Both run at nice -20; nice
//! only arbitrates *inside* the sandbox's cpu cgroup (the group's quota and
//! shares bound it against the host), and the agent's commands start at 0.

/// Locked memory allowed to the worker and the agent.
pub const MEMLOCK_LIMIT: u64 = 64 << 20;

/// Raises `RLIMIT_MEMLOCK` (inherited by the sandbox's init), locks this
/// process's current mappings on fault and lowers its OOM score. Best effort:
/// an unprivileged worker may be refused each step; it logs and carries on.
pub fn protect_worker() {
    let lim = libc::rlimit { rlim_cur: MEMLOCK_LIMIT, rlim_max: MEMLOCK_LIMIT };
    // SAFETY: setrlimit reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        tracing::debug!("RLIMIT_MEMLOCK: {}", std::io::Error::last_os_error());
    }
    lock_current_mappings();
    // SAFETY: setpriority on this process with plain integers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) } != 0 {
        tracing::debug!("nice -20: {}", std::io::Error::last_os_error());
    }
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-999") {
        tracing::debug!("oom_score_adj: {e}");
    }
}

/// `mlockall(MCL_CURRENT | MCL_ONFAULT)`, best effort.
pub fn lock_current_mappings() {
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_ONFAULT) } != 0 {
        tracing::debug!("mlockall: {}", std::io::Error::last_os_error());
    }
}

//! Ending a sandbox: the worker, every process of its cgroup, its files.
use super::record::Runtime;
use super::SandboxEntry;
use std::sync::Arc;

/// Releases everything the sandbox holds, then saves its record without a
/// worker (a later broker has nothing of it to find). Safe to call more
/// than once.
pub async fn teardown(entry: &Arc<SandboxEntry>) {
    let Some(rt) = entry.take_runtime() else {
        return;
    };
    let id = entry.id.clone();
    let _ = tokio::task::spawn_blocking(move || release(&id, rt)).await;
    entry.save();
}

fn release(id: &str, rt: Runtime) {
    let Runtime {
        worker_pid,
        worker_pidfd,
        worker_proc: _,
        cgroup,
        state_dir,
        socket,
        log,
        lifeline,
        channel,
        volumes,
    } = rt;
    drop(channel);
    // SIGKILL the worker; its sandbox init dies with it (PDEATHSIG), and the
    // cgroup sweep below catches anything else.
    match &worker_pidfd {
        Some(fd) => pidfd_kill(fd),
        None => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(worker_pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    drop(lifeline);
    super::pool::release_files(&socket, &log, cgroup.as_ref());
    // Iterative and fd-relative: the tenant shaped this tree (logged on failure).
    let _ = super::trees::remove_state_dir(id, &state_dir);
    // Named volumes released (and those made for this sandbox alone deleted).
    drop(volumes);
    tracing::info!(sandbox = id, "sandbox torn down");
}

/// A pidfd for a live child (None if the kernel has no pidfd_open).
pub fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// SIGKILL through a pidfd.
fn pidfd_kill(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

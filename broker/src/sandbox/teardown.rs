//! Ending a sandbox: the worker, every process of its cgroup, its files.
use super::record::Runtime;
use super::SandboxEntry;
use std::sync::Arc;

/// Releases everything the sandbox holds. Safe to call more than once.
pub async fn teardown(entry: &Arc<SandboxEntry>) {
    let Some(rt) = entry.take_runtime() else {
        return;
    };
    let id = entry.id.clone();
    let _ = tokio::task::spawn_blocking(move || release(&id, rt)).await;
}

fn release(id: &str, rt: Runtime) {
    let Runtime { worker_pid, cgroup, state_dir, socket, log, lifeline, channel } = rt;
    drop(channel);
    // SIGKILL the worker; its sandbox init dies with it (PDEATHSIG), and the
    // cgroup sweep below catches anything else.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker_pid as i32), nix::sys::signal::Signal::SIGKILL);
    drop(lifeline);
    super::pool::release_files(&socket, &log, cgroup.as_ref());
    if let Err(e) = std::fs::remove_dir_all(&state_dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(sandbox = id, "removing {}: {e}", state_dir.display());
        }
    }
    tracing::info!(sandbox = id, "sandbox torn down");
}

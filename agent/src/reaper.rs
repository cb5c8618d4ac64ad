//! Child reaping for PID 1.
//!
//! The agent reaps every child itself (orphans re-parented to it included) and
//! hands exit statuses to whoever registered the pid. Spawning happens under the
//! same lock the reaper takes, so a child cannot be reaped before it is
//! registered.
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use tokio::sync::oneshot;

type Waiters = HashMap<i32, oneshot::Sender<i32>>;

fn waiters() -> &'static Mutex<Waiters> {
    static W: OnceLock<Mutex<Waiters>> = OnceLock::new();
    W.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Runs `spawn` (which must start exactly one child and return its pid) with
/// the reaper locked, and returns a receiver for the child's exit code
/// (`128 + signal` when killed by a signal).
pub fn spawn_registered<T>(
    spawn: impl FnOnce() -> std::io::Result<(T, i32)>,
) -> std::io::Result<(T, oneshot::Receiver<i32>)> {
    let mut w = waiters().lock().unwrap_or_else(|e| e.into_inner());
    let (value, pid) = spawn()?;
    let (tx, rx) = oneshot::channel();
    w.insert(pid, tx);
    Ok((value, rx))
}

/// Reaps every exited child; delivers codes of registered ones.
pub fn reap_all() {
    let mut w = waiters().lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let (pid, code) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, code),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, 128 + sig as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(_) => continue,
        };
        if let Some(tx) = w.remove(&pid.as_raw()) {
            let _ = tx.send(code);
        }
    }
}

/// Reaps on every SIGCHLD, forever.
pub async fn run() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sig = signal(SignalKind::child())?;
    reap_all();
    loop {
        sig.recv().await;
        reap_all();
    }
}

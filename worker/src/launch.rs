//! How a worker process is started (used by the broker and by tests): the
//! listening socket becomes fd 3 and the lifeline pipe fd 4 of the worker.
use crate::config::WorkerConfig;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

pub const LISTEN_FD: RawFd = 3;
pub const LIFELINE_FD: RawFd = 4;

/// A command that runs `worker_bin` for `cfg`, with `listen` and `lifeline`
/// (fds of the calling process, which must stay open until spawn returns)
/// moved to [`LISTEN_FD`] and [`LIFELINE_FD`], and output going to `log`.
pub fn command(
    worker_bin: &Path,
    cfg: &WorkerConfig,
    listen: RawFd,
    lifeline: RawFd,
    log: std::fs::File,
) -> std::io::Result<Command> {
    let mut cfg = cfg.clone();
    cfg.listen_fd = LISTEN_FD;
    cfg.lifeline_fd = LIFELINE_FD;
    let json = serde_json::to_string(&cfg).map_err(std::io::Error::other)?;
    let mut cmd = Command::new(worker_bin);
    cmd.arg("--config")
        .arg(json)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: runs in the forked child before exec; only fcntl/dup2 on fds
    // that the parent keeps open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let a = libc::fcntl(listen, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(lifeline, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 || libc::dup2(a, LISTEN_FD) < 0 || libc::dup2(b, LIFELINE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

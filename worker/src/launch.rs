//! How a worker process is started (used by the broker and by tests).
//!
//! A worker is spawned *before* its sandbox is known: it joins its cgroup
//! (given on the command line) and then blocks, still single-threaded, on
//! reading its [`WorkerConfig`] from [`CONFIG_FD`]. The broker keeps a few
//! such warm workers so that creating a sandbox does not pay for process
//! start-up and cgroup migration. Closing the config pipe without writing
//! makes a waiting worker exit.
use crate::cgroup::GroupPaths;
use crate::config::WorkerConfig;
use std::io::Write;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

pub const LISTEN_FD: RawFd = 3;
pub const LIFELINE_FD: RawFd = 4;
pub const CONFIG_FD: RawFd = 5;

/// A command that runs `worker_bin` in `cgroup`, with `listen`, `lifeline`
/// and `config` (fds of the calling process, which must stay open until spawn
/// returns) moved to [`LISTEN_FD`], [`LIFELINE_FD`] and [`CONFIG_FD`], and
/// its output going to `log`.
pub fn command(
    worker_bin: &Path,
    cgroup: Option<&GroupPaths>,
    fds: [RawFd; 3],
    log: std::fs::File,
) -> std::io::Result<Command> {
    let mut cmd = Command::new(worker_bin);
    match cgroup {
        Some(g) => {
            cmd.arg("--cgroup").arg(serde_json::to_string(g).map_err(std::io::Error::other)?);
        }
        // The group's JSON leaves room for the title (crate::title); without
        // one, a padded argv[0] does (its trailing spaces do not show).
        None => {
            cmd.arg0(format!("{:<width$}", worker_bin.display(), width = crate::title::ROOM));
        }
    }
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    pass_fds(&mut cmd, fds);
    Ok(cmd)
}

/// Makes the child of `cmd` get `fds` (fds of the calling process, which must
/// stay open until spawn returns) as fds 3, 4, ... in that order, marks every
/// fd above them close-on-exec (nothing else of the caller's crosses over,
/// fds it inherited from its own parent included) and gives the child a
/// session of its own (no controlling terminal shared with the operator).
pub fn pass_fds<const N: usize>(cmd: &mut Command, fds: [RawFd; N]) {
    const FIRST: RawFd = 3;
    // SAFETY: runs in the forked child before exec; only fcntl/dup2/
    // close_range/setsid on fds that the parent keeps open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // Out of the way first, so no target overwrites a later source.
            let mut tmp = [0; N];
            for (t, fd) in tmp.iter_mut().zip(fds) {
                *t = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, FIRST + N as RawFd + 10);
                if *t < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, t) in tmp.into_iter().enumerate() {
                if libc::dup2(t, FIRST + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            let above = (FIRST + N as RawFd) as libc::c_uint;
            if libc::syscall(libc::SYS_close_range, above, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends a warm worker the work to do before its configuration (the pipe stays open).
pub fn send_ahead(config_pipe: &OwnedFd, ahead: &crate::config::Ahead) -> std::io::Result<()> {
    std::fs::File::from(config_pipe.try_clone()?).write_all(&crate::config::encode_ahead(ahead))
}

/// Hands a waiting worker its configuration (a `pvisor.worker.v1.WorkerConfig`
/// in a `PipeMessage`), then closes the pipe.
pub fn send_config(config_pipe: OwnedFd, cfg: &WorkerConfig) -> std::io::Result<()> {
    std::fs::File::from(config_pipe).write_all(&crate::config::encode(cfg))
}

/// Opens a gRPC channel to a Unix socket (a worker's, or an agent's in tests).
pub async fn connect_unix(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://unix")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

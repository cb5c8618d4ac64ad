//! Launching a sandbox: its directory, cgroup, socket and worker process,
//! then waiting for the worker to report the agent ready.
use super::record::Runtime;
use super::teardown::teardown;
use super::{SandboxEntry, State};
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::http::StatusCode;
use hyper_util::rt::TokioIo;
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_worker::config::{Limits, WorkerConfig};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// How long a worker may take to report its sandbox ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct LaunchSpec {
    pub id: String,
    pub image_root: PathBuf,
    pub limits: Limits,
    pub agent_config: serde_json::Value,
}

/// Opens a gRPC channel to a worker's Unix socket.
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://worker")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

fn start_failed(msg: impl Into<String>) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "SANDBOX_START_FAILED",
        msg,
    )
}

/// Leftovers of a launch that failed half-way.
struct Partial {
    cgroup: Option<pvisor_worker::cgroup::GroupPaths>,
    state_dir: PathBuf,
    socket: PathBuf,
}

impl Partial {
    fn cleanup(self) {
        if let Some(g) = self.cgroup {
            let _ = g.destroy();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Starts the worker and returns the live runtime plus the worker child.
pub async fn launch(
    ctx: &Ctx,
    spec: &LaunchSpec,
) -> Result<(Runtime, tokio::process::Child), ApiError> {
    let state_dir = ctx.sandboxes_dir.join(&spec.id);
    let socket = ctx.run_dir.join(format!("{}.sock", spec.id));
    let mut partial = Partial {
        cgroup: None,
        state_dir: state_dir.clone(),
        socket: socket.clone(),
    };
    let r = launch_inner(ctx, spec, &mut partial).await;
    if r.is_err() {
        tokio::task::spawn_blocking(move || partial.cleanup())
            .await
            .ok();
    }
    r
}

async fn launch_inner(
    ctx: &Ctx,
    spec: &LaunchSpec,
    partial: &mut Partial,
) -> Result<(Runtime, tokio::process::Child), ApiError> {
    std::fs::create_dir_all(&partial.state_dir)
        .map_err(|e| start_failed(format!("sandbox dir: {e}")))?;
    if let Some(layout) = &ctx.cgroups {
        let name = format!("pvisor-{}", spec.id);
        partial.cgroup = Some(
            layout
                .create_group(&name, &spec.limits)
                .map_err(|e| start_failed(e.to_string()))?,
        );
    }
    let listener = std::os::unix::net::UnixListener::bind(&partial.socket)
        .map_err(|e| start_failed(format!("worker socket {}: {e}", partial.socket.display())))?;
    let (life_rd, life_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| start_failed(format!("pipe: {e}")))?;
    let cfg = WorkerConfig {
        sandbox_id: spec.id.clone(),
        backend: Default::default(),
        listen_fd: pvisor_worker::launch::LISTEN_FD,
        lifeline_fd: pvisor_worker::launch::LIFELINE_FD,
        cgroup: partial.cgroup.clone(),
        limits: spec.limits,
        image_root: spec.image_root.clone(),
        state_dir: partial.state_dir.clone(),
        ids: ctx.ids,
        hostname: format!("sandbox-{}", &spec.id[..8.min(spec.id.len())]),
        agent_path: ctx.agent_bin.clone(),
        agent_config: spec.agent_config.clone(),
    };
    let log = std::fs::File::create(partial.state_dir.join("worker.log"))
        .map_err(|e| start_failed(format!("worker log: {e}")))?;
    let cmd = pvisor_worker::launch::command(
        &ctx.worker_bin,
        &cfg,
        listener.as_raw_fd(),
        life_rd.as_raw_fd(),
        log,
    )
    .map_err(|e| start_failed(format!("worker command: {e}")))?;
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(false);
    let child = cmd
        .spawn()
        .map_err(|e| start_failed(format!("spawn {}: {e}", ctx.worker_bin.display())))?;
    drop((listener, life_rd));
    let worker_pid = child.id().unwrap_or(0);
    let runtime_parts = (worker_pid, life_wr);
    match wait_ready(&partial.socket).await {
        Ok(channel) => {
            let (worker_pid, lifeline) = runtime_parts;
            Ok((
                Runtime {
                    channel,
                    worker_pid,
                    cgroup: partial.cgroup.clone(),
                    state_dir: partial.state_dir.clone(),
                    socket: partial.socket.clone(),
                    lifeline,
                },
                child,
            ))
        }
        Err(msg) => {
            kill_worker(worker_pid, runtime_parts.1);
            let mut child = child;
            let _ = child.wait().await;
            let tail = log_tail(&partial.state_dir.join("worker.log"));
            Err(start_failed(if tail.is_empty() {
                msg
            } else {
                format!("{msg}; worker log: {tail}")
            }))
        }
    }
}

fn kill_worker(pid: u32, lifeline: OwnedFd) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    drop(lifeline);
}

async fn wait_ready(socket: &Path) -> Result<Channel, String> {
    let channel = connect_unix(socket)
        .await
        .map_err(|e| format!("connect to worker: {e}"))?;
    let mut client = WorkerClient::new(channel.clone());
    match tokio::time::timeout(READY_TIMEOUT, client.ready(pvisor_proto::worker::Empty {})).await {
        Ok(Ok(_)) => Ok(channel),
        Ok(Err(s)) => Err(s.message().to_string()),
        Err(_) => Err(format!(
            "sandbox not ready within {} s",
            READY_TIMEOUT.as_secs()
        )),
    }
}

/// The last meaningful lines of a worker log, for error reports.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// Watches the worker: if it exits while the sandbox is live, the sandbox is
/// marked Failed with the reason and its resources are released.
pub fn monitor(entry: Arc<SandboxEntry>, mut child: tokio::process::Child, log: PathBuf) {
    tokio::spawn(async move {
        let status = child.wait().await;
        if entry.is_deleting() {
            return;
        }
        let tail = log_tail(&log);
        let status = match status {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        let msg = if tail.is_empty() {
            format!("worker {status}")
        } else {
            format!("worker {status}: {tail}")
        };
        tracing::warn!(sandbox = %entry.id, "{msg}");
        entry.set_state(State::Failed, Some("WORKER_EXITED".into()), Some(msg));
        teardown(&entry).await;
    });
}

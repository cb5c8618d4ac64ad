//! Launching a sandbox: its directory, cgroup, socket and worker process,
//! then waiting for the worker to report the agent ready.
use super::pool::{release_files, WarmWorker};
use super::record::Runtime;
use super::rootfs::RootFs;
use super::teardown::teardown;
use super::{SandboxEntry, State};
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::http::StatusCode;
use pvisor_proto::agent::AgentConfig;
use pvisor_proto::worker as pb;
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_worker::config::{BackendConfig, Limits, NsConfig, VmConfig, WorkerConfig};
use pvisor_worker::expiry::EXPIRED_EXIT_CODE;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

// ctx.ready_timeout (`--ready-timeout-secs`, 20 s by default): how long a worker may take to
// report its sandbox ready: below the SDK's 30 s request timeout, so a slow start fails (and
// is cleaned up) before the client gives up on a create it would never learn the id of.

pub struct LaunchSpec {
    pub id: String,
    pub root: RootFs,
    pub limits: Limits,
    pub agent: AgentConfig,
    /// `WorkerConfig.net`: the network, or `None` for loopback only.
    pub net: Option<pvisor_proto::net::NetConfig>,
    /// `NsConfig.volumes` (crate::volumes::prepare).
    pub volumes: Vec<pvisor_worker::config::Volume>,
    /// ns: keep `/tmp` in the root file system (a restored snapshot's).
    pub tmp_on_root: bool,
    /// When the sandbox expires (the worker enforces it too).
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// vm: the snapshot this sandbox resumes (a restore or a template's clone), if any.
    pub vm_restore: Option<super::vm::VmRestoreFiles>,
    /// vm: capture a template during this create (see [`super::templates`]).
    pub vm_capture: Option<pvisor_proto::worker::TemplateCapture>,
    /// How much longer than `--ready-timeout-secs` the start may take: the
    /// pre-start hook's timeout, which the agent enforces.
    pub pre_start_budget: Duration,
}

/// The limits of the sandbox's whole group. A vm's guest RAM is the memory
/// limit; the VMM (or the test engine) that holds it is charged to the same
/// group, so the group gets the engine's overhead on top.
fn group_limits(ctx: &Ctx, spec: &LaunchSpec) -> Limits {
    match (&spec.root, &ctx.vm) {
        (RootFs::Disk(_), Ok(vm)) => {
            Limits { memory_bytes: spec.limits.memory_bytes + vm.overhead_bytes(), ..spec.limits }
        }
        _ => spec.limits,
    }
}

/// The backend part of the worker's configuration.
fn backend_config(ctx: &Ctx, spec: &LaunchSpec, state_dir: &Path) -> Result<BackendConfig, String> {
    match &spec.root {
        RootFs::Tree(image_root) => Ok(BackendConfig::Ns(NsConfig {
            image_root: image_root.to_string_lossy().into_owned(),
            state_dir: state_dir.to_string_lossy().into_owned(),
            ids: Some(ctx.ids.into()),
            agent_path: ctx.agent_bin.to_string_lossy().into_owned(),
            volumes: spec.volumes.clone(),
            tmp_on_root: spec.tmp_on_root,
            disk_template: ctx
                .disks
                .template(spec.limits.disk_bytes)?
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            memory_merge: ctx.memory_merge.is_some(),
        })),
        RootFs::Disk(disk) => {
            let vm = ctx.vm.as_ref().map_err(|e| format!("the vm backend is not available on this server: {e}"))?;
            let memory_merge = ctx.memory_merge.is_some();
            let template_capture = spec.vm_capture.clone();
            vm.config(disk.clone(), &spec.limits, state_dir, spec.vm_restore.as_ref())
                .map(|c| BackendConfig::Vm(VmConfig { memory_merge, template_capture, ..c }))
        }
    }
}

fn start_failed(msg: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "SANDBOX_START_FAILED", msg)
}

/// Starts the sandbox on a warm worker; returns the live runtime, the
/// worker process and what its worker said when ready.
pub async fn launch(
    ctx: &Arc<Ctx>,
    spec: &LaunchSpec,
) -> Result<(Runtime, tokio::process::Child, pvisor_proto::worker::ReadyReply), ApiError> {
    let t0 = std::time::Instant::now();
    let ready_timeout = ctx.ready_timeout + spec.pre_start_budget;
    let c = ctx.clone();
    let w = tokio::task::spawn_blocking(move || c.pool.take(&c))
        .await
        .map_err(|e| start_failed(e.to_string()))?
        .map_err(start_failed)?;
    let state_dir = ctx.sandboxes_dir.join(&spec.id);
    let WarmWorker { mut child, socket, log, lifeline, config, cgroup, disk_ahead } = w;
    // A disk made ahead that this create does not take; removed once the
    // launch's outcome is known (the worker may still be making it until it
    // reads its configuration), off the create's path.
    let mut unused_disk = disk_ahead;
    let prepared = (|| -> Result<(), String> {
        // The state dir: the worker's disk made ahead, moved, where it is this sandbox's.
        let taken = match (&unused_disk, &spec.root) {
            (Some(d), RootFs::Tree(_)) => d.take(ctx.disks.template(spec.limits.disk_bytes)?.as_deref(), &state_dir),
            _ => false,
        };
        if taken {
            unused_disk = None;
        } else {
            std::fs::create_dir_all(&state_dir).map_err(|e| format!("sandbox dir: {e}"))?;
        }
        if let Some(g) = &cgroup {
            // Everything but the CPU quota now; that one once the sandbox is ready.
            g.set_bounds(&group_limits(ctx, spec)).map_err(|e| e.to_string())?;
            g.set_cpu(None).map_err(|e| e.to_string())?;
        }
        let backend = backend_config(ctx, spec, &state_dir)?;
        let cfg = WorkerConfig {
            sandbox_id: spec.id.clone(),
            cgroup: cgroup.as_ref().map(pb::CgroupPaths::from),
            limits: Some(spec.limits.into()),
            // The ns init sets it; a guest gets it on its kernel command line.
            hostname: format!("sandbox-{}", &spec.id[..8.min(spec.id.len())]),
            agent: Some(spec.agent.clone()),
            net: spec.net.clone(),
            backend: Some(backend),
            outlive_broker: ctx.durable,
            deadline_unix_ms: spec.expires_at.map(|t| t.timestamp_millis()).unwrap_or(0),
            ready_timeout_ms: u32::try_from(ready_timeout.as_millis()).unwrap_or(u32::MAX),
        };
        pvisor_worker::launch::send_config(config, &cfg).map_err(|e| format!("configure worker: {e}"))
    })();
    let t_configured = t0.elapsed();
    let ready = match prepared {
        Ok(()) => wait_ready(&socket, ready_timeout).await.and_then(|r| {
            match &cgroup {
                Some(g) => g.set_cpu(Some(spec.limits.cpu_millis)).map_err(|e| NotReady::Failed(e.to_string())),
                None => Ok(()),
            }
            .map(|()| r)
        }),
        Err(e) => Err(NotReady::Failed(e)),
    };
    tracing::debug!(sandbox = %spec.id, configured = ?t_configured, ready = ?t0.elapsed(), "launch");
    super::pool::Pool::refill(ctx.clone());
    match ready {
        Ok((channel, ready)) => {
            if let Some(d) = unused_disk {
                // The worker read its configuration: it is done with the directory.
                tokio::task::spawn_blocking(move || d.remove());
            }
            let worker_pid = child.id().unwrap_or(0);
            let worker_pidfd = super::teardown::pidfd_open(worker_pid);
            let worker_proc = crate::durable::proc::ProcId::of(worker_pid);
            let lifeline = Some(lifeline);
            Ok((
                Runtime {
                    channel,
                    worker_pid,
                    worker_pidfd,
                    worker_proc,
                    cgroup,
                    state_dir,
                    socket,
                    log,
                    lifeline,
                    volumes: None,
                },
                child,
                ready,
            ))
        }
        Err(NotReady::PreStart(failure, msg)) => {
            // The sandbox's own hook failed: it goes, and the hook's account is the answer.
            let left = Leftovers { child, lifeline, socket, log, cgroup, state_dir, unused_disk };
            left.remove(&spec.id).await;
            Err(super::hooks::pre_start_failed(&failure, &msg))
        }
        Err(NotReady::Failed(msg)) => {
            // A worker that died first (killed, crashed) says how: "transport error" alone does not.
            // (Its exit follows the closing of its socket by a moment.)
            let died = match tokio::time::timeout(std::time::Duration::from_millis(200), child.wait()).await {
                Ok(Ok(status)) => format!(" (the worker exited: {status})"),
                _ => String::new(),
            };
            let msg = format!("{msg}{died}");
            let tail = log_tail(&log);
            let left = Leftovers { child, lifeline, socket, log, cgroup, state_dir, unused_disk };
            left.remove(&spec.id).await;
            Err(start_failed(if tail.is_empty() { msg } else { format!("{msg}; worker log: {tail}") }))
        }
    }
}

/// Why a worker did not report its sandbox ready.
enum NotReady {
    /// The sandbox's pre-start hook failed (the agent's account of it).
    PreStart(pvisor_proto::agent::HookFailure, String),
    /// Anything else, in words.
    Failed(String),
}

/// What a create whose sandbox did not start leaves: its worker and files.
struct Leftovers {
    child: tokio::process::Child,
    lifeline: std::os::fd::OwnedFd,
    socket: PathBuf,
    log: PathBuf,
    cgroup: Option<pvisor_worker::cgroup::GroupPaths>,
    state_dir: PathBuf,
    unused_disk: Option<super::pool::DiskAhead>,
}

impl Leftovers {
    /// Ends the worker and removes the rest.
    async fn remove(self, id: &str) {
        let Leftovers { mut child, lifeline, socket, log, cgroup, state_dir, unused_disk } = self;
        let _ = child.start_kill();
        let _ = child.wait().await;
        drop(lifeline);
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            release_files(&socket, &log, cgroup.as_ref());
            let _ = super::trees::remove_state_dir(&id, &state_dir);
            // The worker is gone: nothing makes the directory any more.
            if let Some(d) = unused_disk {
                d.remove();
            }
        })
        .await
        .ok();
    }
}

async fn wait_ready(socket: &Path, timeout: Duration) -> Result<(Channel, pvisor_proto::worker::ReadyReply), NotReady> {
    let channel = pvisor_worker::launch::connect_unix(socket)
        .await
        .map_err(|e| NotReady::Failed(format!("connect to worker: {e}")))?;
    let mut client = WorkerClient::new(channel.clone());
    match tokio::time::timeout(timeout, client.ready(pvisor_proto::worker::Empty {})).await {
        Ok(Ok(r)) => Ok((channel, r.into_inner())),
        Ok(Err(s)) => Err(match pvisor_proto::hook_failure_of(&s) {
            Some(f) => NotReady::PreStart(f, s.message().to_string()),
            None => NotReady::Failed(s.message().to_string()),
        }),
        Err(_) => Err(NotReady::Failed(format!("sandbox not ready within {} s", timeout.as_secs()))),
    }
}

/// The last meaningful lines of a worker log, for error reports.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// Watches the worker: if it exits while the sandbox is live, the sandbox is
/// marked Failed with the reason and its resources are released; a worker
/// that ended its expired sandbox itself ([`EXPIRED_EXIT_CODE`]) ends it as
/// the expiry sweep would.
pub fn monitor(ctx: Arc<Ctx>, entry: Arc<SandboxEntry>, mut child: tokio::process::Child, log: PathBuf) {
    // `log` lives until teardown, which runs after the tail is read.
    tokio::spawn(async move {
        let status = child.wait().await;
        let expired = status.as_ref().is_ok_and(|s| s.code() == Some(EXPIRED_EXIT_CODE));
        let status = match status {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        worker_ended(&ctx, &entry, expired, &status, &log).await;
    });
}

/// [`monitor`] for a worker re-adopted after a broker restart (not a child
/// of this broker): its exit is seen through its pidfd, without a status.
pub fn monitor_adopted(ctx: Arc<Ctx>, entry: Arc<SandboxEntry>) {
    let Some((fd, log)) = entry.worker_watch() else { return };
    tokio::spawn(async move {
        crate::durable::proc::wait_exit(&fd).await;
        worker_ended(&ctx, &entry, false, "exited", &log).await;
    });
}

/// Slack for a worker that ended its sandbox at the deadline a moment
/// before the broker's sweep would have.
const EXPIRY_SLACK: chrono::Duration = chrono::Duration::seconds(2);

async fn worker_ended(ctx: &Ctx, entry: &Arc<SandboxEntry>, expired: bool, status: &str, log: &Path) {
    // Deleted, or ended by someone else (its image server died) meanwhile.
    if entry.is_deleting() || matches!(entry.status().state, State::Failed | State::Terminated) {
        return;
    }
    let due = entry.status().expires_at.is_some_and(|t| t <= chrono::Utc::now() + EXPIRY_SLACK);
    if expired || due {
        if let Some(e) = ctx.registry.remove(&entry.id) {
            tracing::info!(sandbox = %e.id, "expired (ended by its worker)");
            e.save();
            teardown(&e).await;
            e.forget();
        }
        return;
    }
    let tail = log_tail(log);
    let msg = if tail.is_empty() { format!("worker {status}") } else { format!("worker {status}: {tail}") };
    tracing::warn!(sandbox = %entry.id, "{msg}");
    entry.set_state(State::Failed, Some("WORKER_EXITED".into()), Some(msg));
    teardown(entry).await;
}

//! Taking a snapshot of a live sandbox, in the background of the 202.
//!
//! ns: freeze (the worker's cgroup freezer, as pause does), capture the
//! writable state to a spool file, thaw — the sandbox is frozen only that
//! long — then import the spool into the pool as a layer over the
//! sandbox's image and mark the record Ready (or Failed with the reason).
//!
//! vm: the worker stops the vCPUs, writes the machine's state, copies the
//! scratch disk (sparse) while they are stopped and lets them run on
//! (`Worker.Snapshot`); the record gets the machine's [`VmSnapshot`].
use super::capture::{self, Sources};
use super::store::{SnapState, SnapshotRecord, MESSAGE_READY, REASON_FAILED, REASON_READY, REASON_TIMEOUT};
use super::{image_name, Origin, VmSnapshot};
use crate::sandbox::egress::with_policy_locked;
use crate::sandbox::SandboxEntry;
use crate::server::Ctx;
use pvisor_images::{DerivedImage, ImageConfig};
use pvisor_proto::worker::worker_client::WorkerClient;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a snapshot may take before it is Failed with `snapshot_runtime_timeout`.
const TIMEOUT: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("the sandbox is no longer running")]
    Gone,
    #[error("freezing the sandbox: {0}")]
    Freeze(String),
    #[error("thawing the sandbox: {0}")]
    Thaw(String),
    #[error("capturing the sandbox's files: {0}")]
    Capture(#[from] capture::CaptureError),
    #[error("importing the snapshot into the image pool: {0}")]
    Import(#[from] pvisor_images::Error),
    #[error("{0}")]
    Task(String),
    #[error("saving the machine's state: {0}")]
    Machine(String),
}

/// What a finished snapshot produced.
enum Taken {
    /// ns: the snapshot's image in the pool.
    Image(String),
    Vm(Box<VmSnapshot>),
}

/// Runs the snapshot `rec` of `sb` to its end state (spawned by the API).
pub fn spawn(ctx: Arc<Ctx>, sb: Arc<SandboxEntry>, rec: SnapshotRecord) {
    tokio::spawn(async move {
        let started = Instant::now();
        let vm = sb.origin.vm.is_some();
        // One snapshot of a sandbox at a time (see SandboxEntry::snapshot_lock).
        let turn = sb.snapshot_lock.lock().await;
        let r = match vm {
            true => {
                tokio::time::timeout(TIMEOUT, async { run_vm(&ctx, &sb, &rec).await.map(|v| Taken::Vm(Box::new(v))) })
                    .await
            }
            false => tokio::time::timeout(TIMEOUT, async { run(&ctx, &sb, &rec).await.map(Taken::Image) }).await,
        };
        let (state, reason, message, taken) = match r {
            Ok(Ok(taken)) => (SnapState::Ready, REASON_READY, MESSAGE_READY.to_string(), Some(taken)),
            Ok(Err(e)) => (SnapState::Failed, REASON_FAILED, e.to_string(), None),
            Err(_) => (
                SnapState::Failed,
                REASON_TIMEOUT,
                format!("the snapshot did not finish within {} s", TIMEOUT.as_secs()),
                None,
            ),
        };
        drop(turn);
        let _ = std::fs::remove_file(ctx.snapshots.spool_path(&rec.id));
        if state != SnapState::Ready {
            ctx.snapshots.remove_vm_files(&rec.id);
        }
        let (image_id, vm) = match taken {
            Some(Taken::Image(id)) => (Some(id), None),
            Some(Taken::Vm(v)) => (None, Some(*v)),
            None => (None, None),
        };
        tracing::info!(snapshot = %rec.id, sandbox = %sb.id, state = state.as_str(), %message,
            seconds = started.elapsed().as_secs_f64(), "snapshot finished");
        let updated = ctx.snapshots.update(&rec.id, |r| {
            r.image_id = image_id.clone();
            r.vm = vm.clone();
            r.transition(state, reason, message);
        });
        if let Err(e) = updated {
            tracing::warn!(snapshot = %rec.id, "recording the snapshot's end: {e}");
        }
    });
}

/// The image config of a snapshot: the source image's entrypoint and cmd,
/// the sandbox's environment, workdir and user.
fn config_of(base: &ImageConfig, origin: &Origin) -> ImageConfig {
    ImageConfig {
        entrypoint: base.entrypoint.clone(),
        cmd: base.cmd.clone(),
        env: origin.env.clone(),
        working_dir: origin.working_dir.clone(),
        user: origin.user.clone(),
    }
}

async fn run(ctx: &Arc<Ctx>, sb: &Arc<SandboxEntry>, rec: &SnapshotRecord) -> Result<String, TakeError> {
    let spool = ctx.snapshots.spool_path(&rec.id);
    let (state_dir, cgroup) = sb.runtime_dirs().ok_or(TakeError::Gone)?;
    let freeze_started = Instant::now();
    let stats = with_policy_locked(sb, true, async {
        let mut client = WorkerClient::new(sb.channel()?);
        client
            .pause(pvisor_proto::worker::Empty {})
            .await
            .map_err(|s| crate::api::error::ApiError::internal(s.message().to_string()))?;
        let (c, sp, tmp_on_root) = (ctx.clone(), spool.clone(), sb.origin.tmp_on_root);
        let pids = cgroup.as_ref().map(|g| g.pids()).unwrap_or_default();
        let captured = tokio::task::spawn_blocking(move || capture_frozen(&c, &state_dir, &pids, tmp_on_root, &sp))
            .await
            .map_err(|e| TakeError::Task(e.to_string()));
        // Thawed whatever the capture did.
        let thawed = client.resume(pvisor_proto::worker::Empty {}).await;
        Ok::<_, crate::api::error::ApiError>((captured, thawed))
    })
    .await;
    let (captured, thawed) = stats.map_err(|e| TakeError::Freeze(e.message))?;
    thawed.map_err(|s| TakeError::Thaw(s.message().to_string()))?;
    let stats = captured??;
    tracing::info!(snapshot = %rec.id, frozen_ms = freeze_started.elapsed().as_millis() as u64, ?stats, "captured");

    let base = ctx.images.resolve(&sb.image_id)?;
    let config = config_of(&base.config, &sb.origin);
    let c = ctx.clone();
    let (sid, base_id) = (rec.id.clone(), sb.image_id.clone());
    let record = tokio::task::spawn_blocking(move || {
        let name = image_name(&sid);
        c.images.import_layer(&DerivedImage { base: &base_id, layer: &spool, config, name: &name, label: &sid })
    })
    .await
    .map_err(|e| TakeError::Task(e.to_string()))??;
    Ok(record.id)
}

async fn run_vm(ctx: &Arc<Ctx>, sb: &Arc<SandboxEntry>, rec: &SnapshotRecord) -> Result<VmSnapshot, TakeError> {
    let shape = sb.origin.vm.ok_or(TakeError::Gone)?;
    let assets = ctx.vm.as_ref().map_err(|e| TakeError::Machine(e.clone()))?.identity().to_string();
    sb.runtime_dirs().ok_or(TakeError::Gone)?;
    let dir = ctx.snapshots.vm_dir(&rec.id);
    std::fs::create_dir_all(&dir).map_err(|e| TakeError::Machine(format!("{}: {e}", dir.display())))?;
    let (state, scratch, memory) = (dir.join("state"), dir.join("scratch.img"), dir.join("memory"));
    let r = with_policy_locked(sb, true, async {
        let mut client = WorkerClient::new(sb.channel()?);
        let req = pvisor_proto::worker::SnapshotRequest {
            state_path: state.to_string_lossy().into_owned(),
            scratch_path: scratch.to_string_lossy().into_owned(),
            memory_path: memory.to_string_lossy().into_owned(),
        };
        Ok::<_, crate::api::error::ApiError>(client.snapshot(req).await)
    })
    .await;
    let reply = r
        .map_err(|e| TakeError::Machine(e.message))?
        .map_err(|s| TakeError::Machine(s.message().to_string()))?
        .into_inner();
    // On disk before the record says Ready, as snapshot records are.
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        // The memory file is the project's VMM's only (QEMU's state holds guest RAM).
        let memory = memory.exists().then_some(memory);
        for f in [Some(&state), Some(&scratch), memory.as_ref(), Some(&dir)].into_iter().flatten() {
            std::fs::File::open(f)?.sync_all()?;
        }
        Ok(())
    })
    .await
    .map_err(|e| TakeError::Task(e.to_string()))?
    .map_err(|e| TakeError::Machine(format!("syncing the snapshot's files: {e}")))?;
    tracing::info!(snapshot = %rec.id, stopped_ms = reply.stopped_us / 1000,
        state_bytes = reply.state_bytes, "vm machine saved");
    Ok(VmSnapshot {
        image_id: sb.image_id.clone(),
        cmdline: reply.cmdline,
        vcpus: shape.vcpus,
        memory_mib: shape.memory_mib,
        net: shape.net,
        assets,
        agent_env: sb.origin.agent_env.clone(),
        agent_workdir: sb.origin.working_dir.clone(),
        agent_user: sb.origin.user.clone(),
        agent_entrypoint: sb.entrypoint.clone(),
        agent_lifecycle: sb.origin.lifecycle.clone(),
        state_bytes: reply.state_bytes,
    })
}

/// The capture proper (the sandbox is frozen).
fn capture_frozen(
    ctx: &Ctx,
    state_dir: &Path,
    pids: &[i32],
    tmp_on_root: bool,
    spool: &Path,
) -> Result<capture::CaptureStats, TakeError> {
    let upper = crate::sandbox::disk::upper_dir(state_dir, pids).ok_or(TakeError::Gone)?;
    let root: Option<PathBuf> = match tmp_on_root {
        true => None,
        false => Some(capture::init_root(pids).ok_or(TakeError::Gone)?),
    };
    let src = Sources { upper: &upper, sandbox_root: root.as_deref(), ids: ctx.ids };
    Ok(capture::capture(&src, spool)?)
}

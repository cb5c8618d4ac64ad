//! Taking a snapshot of a live ns sandbox, in the background of the 202:
//! freeze (the worker's cgroup freezer, as pause does), capture the
//! writable state to a spool file, thaw — the sandbox is frozen only that
//! long — then import the spool into the pool as a layer over the
//! sandbox's image and mark the record Ready (or Failed with the reason).
use super::capture::{self, Sources};
use super::store::{SnapState, SnapshotRecord, MESSAGE_READY, REASON_FAILED, REASON_READY, REASON_TIMEOUT};
use super::{image_name, Origin};
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
}

/// Runs the snapshot `rec` of `sb` to its end state (spawned by the API).
pub fn spawn(ctx: Arc<Ctx>, sb: Arc<SandboxEntry>, rec: SnapshotRecord) {
    tokio::spawn(async move {
        let started = Instant::now();
        let r = tokio::time::timeout(TIMEOUT, run(&ctx, &sb, &rec)).await;
        let (state, reason, message, image_id) = match r {
            Ok(Ok(image_id)) => (SnapState::Ready, REASON_READY, MESSAGE_READY.to_string(), Some(image_id)),
            Ok(Err(e)) => (SnapState::Failed, REASON_FAILED, e.to_string(), None),
            Err(_) => (
                SnapState::Failed,
                REASON_TIMEOUT,
                format!("the snapshot did not finish within {} s", TIMEOUT.as_secs()),
                None,
            ),
        };
        let _ = std::fs::remove_file(ctx.snapshots.spool_path(&rec.id));
        tracing::info!(snapshot = %rec.id, sandbox = %sb.id, state = state.as_str(), %message,
            seconds = started.elapsed().as_secs_f64(), "snapshot finished");
        let updated = ctx.snapshots.update(&rec.id, |r| {
            r.image_id = image_id.clone();
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

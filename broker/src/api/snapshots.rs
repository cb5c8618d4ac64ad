//! The snapshot routes (`/v1/sandboxes/{id}/snapshots`, `/v1/snapshots...`)
//! and the restore half of a create (`snapshotId`). The work itself is in
//! [`crate::snapshot`].
use super::error::{parse_json, ApiError, ApiResult};
use super::models::{Pagination, StatusView};
use super::query::Query;
use crate::sandbox::State as SbState;
use crate::server::Ctx;
use crate::snapshot::store::{SnapState, SnapshotRecord, MESSAGE_ACCEPTED, REASON_ACCEPTED};
use crate::snapshot::{forget_image, take};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use pvisor_worker::config::BackendKind;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The entrypoint of a restore that names none (as the reference).
pub const RESTORE_ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
struct CreateSnapshotRequest {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    pub id: String,
    pub sandbox_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: String,
    pub status: StatusView,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListSnapshotsResponse {
    pub items: Vec<SnapshotView>,
    pub pagination: Pagination,
}

fn rfc3339(t: &chrono::DateTime<Utc>) -> String {
    crate::sandbox::record::rfc3339(t)
}

pub fn view(r: &SnapshotRecord) -> SnapshotView {
    SnapshotView {
        id: r.id.clone(),
        sandbox_id: r.sandbox_id.clone(),
        name: r.name.clone(),
        created_at: rfc3339(&r.created_at),
        status: StatusView {
            state: r.state.as_str().into(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            last_transition_at: rfc3339(&r.last_transition_at),
        },
    }
}

fn not_found(sid: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND", format!("snapshot {sid} not found"))
}

fn store_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("snapshot records: {e}"))
}

fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let variant = ["8", "9", "a", "b"][(b[8] >> 6) as usize];
    format!("{}-{}-4{}-{}{}-{}", &h[0..8], &h[8..12], &h[13..16], variant, &h[17..20], &h[20..32])
}

/// `POST /v1/sandboxes/{id}/snapshots`: 202 with the record (`Creating`).
#[utoipa::path(post, path = "/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")),
    request_body(content = Option<CreateSnapshotRequest>, description = "optional"),
    responses((status = 202, description = "accepted; it completes in the background", body = SnapshotView)))]
pub async fn create(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>, body: Bytes) -> ApiResult<Response> {
    let req: CreateSnapshotRequest =
        if body.iter().all(u8::is_ascii_whitespace) { Default::default() } else { parse_json(&body)? };
    if req.name.as_deref().is_some_and(|n| n.trim().is_empty() || n.len() > 253) {
        return Err(ApiError::bad_request("name must be 1 to 253 characters"));
    }
    let sb = ctx.registry.get(&id).ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    let vm = sb.origin.backend == Some(BackendKind::Vm);
    if vm {
        vm_snapshots_possible(&sb)?;
    }
    let state = sb.status().state;
    if state != SbState::Running || sb.is_deleting() || sb.runtime_dirs().is_none() {
        return Err(ApiError::conflict(
            "SNAPSHOT::INVALID_SOURCE_STATE",
            format!("sandbox {id} is {}; only a Running sandbox can be snapshotted", state.as_str()),
        ));
    }
    let now = Utc::now();
    let rec = SnapshotRecord {
        id: new_id(),
        sandbox_id: id.clone(),
        name: req.name,
        created_at: now,
        state: SnapState::Creating,
        reason: Some(REASON_ACCEPTED.into()),
        message: Some(MESSAGE_ACCEPTED.into()),
        last_transition_at: now,
        source_image: sb.image_uri.clone(),
        image_id: None,
        backend: if vm { "vm" } else { "ns" }.into(),
        vm: None,
    };
    ctx.snapshots.insert(rec.clone()).map_err(store_error)?;
    tracing::info!(snapshot = %rec.id, sandbox = %id, "snapshot accepted");
    take::spawn(ctx.clone(), sb, rec.clone());
    let location = format!("/v1/snapshots/{}", rec.id);
    Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(view(&rec))).into_response())
}

/// `GET /v1/snapshots`: filters `sandboxId`, `name`, `state` (repeatable,
/// ORed), paging as the sandbox list; newest first.
#[utoipa::path(get, path = "/snapshots", tag = "snapshots",
    params(
        ("sandboxId" = Option<Vec<String>>, Query, description = "only these sandboxes' snapshots", explode = true),
        ("name" = Option<Vec<String>>, Query, description = "only snapshots of these names", explode = true),
        ("state" = Option<Vec<String>>, Query, explode = true),
        ("page" = Option<u64>, Query, minimum = 1),
        ("pageSize" = Option<u64>, Query, minimum = 1, maximum = 200),
    ),
    responses((status = 200, body = ListSnapshotsResponse)))]
pub async fn list(State(ctx): State<Arc<Ctx>>, RawQuery(raw): RawQuery) -> ApiResult<Json<ListSnapshotsResponse>> {
    let q = Query::parse(raw.as_deref());
    let states: Vec<String> = q.all("state").iter().map(|s| s.to_ascii_lowercase()).collect();
    let sandbox: Vec<String> = q.all("sandboxId");
    let name: Vec<String> = q.all("name");
    let (page, page_size) = q.paging()?;
    let items: Vec<SnapshotRecord> = ctx
        .snapshots
        .list()
        .into_iter()
        .filter(|r| states.is_empty() || states.contains(&r.state.as_str().to_ascii_lowercase()))
        .filter(|r| sandbox.is_empty() || sandbox.contains(&r.sandbox_id))
        .filter(|r| name.is_empty() || r.name.as_ref().is_some_and(|n| name.contains(n)))
        .collect();
    let (items, pagination) = Pagination::page_of(items, page, page_size, |r| view(&r));
    Ok(Json(ListSnapshotsResponse { items, pagination }))
}

/// `GET /v1/snapshots/{sid}`.
#[utoipa::path(get, path = "/snapshots/{sid}", tag = "snapshots",
    params(("sid" = String, Path, description = "snapshot id")), responses((status = 200, body = SnapshotView)))]
pub async fn get_one(State(ctx): State<Arc<Ctx>>, Path(sid): Path<String>) -> ApiResult<Json<SnapshotView>> {
    ctx.snapshots.get(&sid).map(|r| Json(view(&r))).ok_or_else(|| not_found(&sid))
}

/// `DELETE /v1/snapshots/{sid}`: 204, synchronous (the next GET is 404).
/// A restore running from it keeps working: its image server holds the
/// image's index and packs open, and gc never takes what readers hold.
#[utoipa::path(delete, path = "/snapshots/{sid}", tag = "snapshots",
    params(("sid" = String, Path, description = "snapshot id")), responses((status = 204, description = "deleted")))]
pub async fn delete(State(ctx): State<Arc<Ctx>>, Path(sid): Path<String>) -> ApiResult<StatusCode> {
    let marked = ctx
        .snapshots
        .begin_delete(&sid, |r| match r.state {
            SnapState::Creating | SnapState::Deleting => Err(ApiError::conflict(
                "SNAPSHOT::INVALID_STATE",
                format!("snapshot {sid} is {}; wait until it is Ready or Failed", r.state.as_str()),
            )),
            _ => Ok(()),
        })
        .map_err(store_error)?;
    let rec = marked.ok_or_else(|| not_found(&sid))??;
    let c = ctx.clone();
    tokio::task::spawn_blocking(move || {
        forget_image(&c.images, &rec);
        c.snapshots.remove_vm_files(&rec.id);
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    ctx.snapshots.remove::<ApiError>(&sid, |_| Ok(())).map_err(store_error)?;
    tracing::info!(snapshot = %sid, "snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Any other route under `/v1/snapshots/{sid}/...`.
pub async fn unsupported() -> ApiError {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED", "this snapshot route is not supported by this server")
}

/// Whether this server can snapshot the vm sandbox `sb` (it recorded its machine's shape).
fn vm_snapshots_possible(sb: &crate::sandbox::SandboxEntry) -> ApiResult<()> {
    if sb.origin.vm.is_none() {
        return Err(ApiError::conflict(
            "SNAPSHOT::INVALID_SOURCE_STATE",
            format!("sandbox {} was created by a server that did not record its machine's shape", sb.id),
        ));
    }
    Ok(())
}

/// What a create with `snapshotId` starts from.
pub struct Restore {
    pub snapshot_id: String,
    pub image: pvisor_images::ImageRecord,
    /// The image the snapshot's source sandbox was created from.
    pub source_image: String,
    /// A vm snapshot: its machine and files.
    pub vm: Option<(crate::snapshot::VmSnapshot, crate::sandbox::vm::VmRestoreFiles)>,
}

fn invalid_restore(msg: String) -> ApiError {
    ApiError::conflict("SNAPSHOT::INVALID_RESTORE_CONFIG", msg)
}

/// A vm restore's request against its snapshot: the machine must be the
/// same (vCPUs and memory from `resourceLimits`, a network or none), and
/// the environment is the source's (the guest's processes keep theirs).
pub fn check_vm_restore(
    snap: &crate::snapshot::VmSnapshot,
    limits: &pvisor_worker::config::Limits,
    net: bool,
    env: &std::collections::BTreeMap<String, String>,
) -> ApiResult<()> {
    let (vcpus, memory_mib) = crate::sandbox::vm::VmAssets::shape(limits);
    if (vcpus, memory_mib) != (snap.vcpus, snap.memory_mib) {
        return Err(invalid_restore(format!(
            "a vm snapshot resumes its own machine: {} vCPU(s) and {} MiB (resourceLimits cpu \"{}\", memory \"{}Mi\"), \
             not {vcpus} vCPU(s) and {memory_mib} MiB",
            snap.vcpus, snap.memory_mib, snap.vcpus, snap.memory_mib
        )));
    }
    if net != snap.net {
        return Err(invalid_restore(format!(
            "a vm snapshot resumes its own devices: its source {} a network, this server would {}give it one",
            if snap.net { "had" } else { "had no" },
            if net { "" } else { "not " }
        )));
    }
    if !env.is_empty() {
        return Err(ApiError::bad_request(
            "env cannot be given to a restore of a vm snapshot: its processes run on with the source's environment",
        ));
    }
    Ok(())
}

/// Checks a restore request: the snapshot exists and is Ready, no image is
/// named besides it, and the backend can run it (ns).
pub fn restore_source(ctx: &Ctx, sid: &str, has_image: bool, backend: BackendKind) -> ApiResult<Restore> {
    if has_image {
        return Err(ApiError::bad_request("exactly one of image and snapshotId may be given"));
    }
    let rec = ctx.snapshots.get(sid).ok_or_else(|| not_found(sid))?;
    if rec.state != SnapState::Ready {
        return Err(ApiError::conflict(
            "SNAPSHOT::NOT_READY",
            format!("snapshot {sid} is {}, not Ready", rec.state.as_str()),
        ));
    }
    let image_gone = |e: pvisor_images::Error| {
        ApiError::new(StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND", format!("snapshot {sid}'s image: {e}"))
    };
    let Some(vm) = rec.vm else {
        if backend != BackendKind::Ns {
            return Err(invalid_restore(format!(
                "snapshot {sid} is of an ns sandbox; it cannot be restored on the {} backend",
                backend.name()
            )));
        }
        let image_id = rec.image_id.as_deref().ok_or_else(|| ApiError::internal("a Ready snapshot has no image"))?;
        let image = ctx.images.resolve(image_id).map_err(image_gone)?;
        return Ok(Restore { snapshot_id: sid.to_owned(), image, source_image: rec.source_image, vm: None });
    };
    if backend != BackendKind::Vm {
        return Err(invalid_restore(format!(
            "snapshot {sid} is of a vm sandbox (its machine's memory); it restores on the vm backend only, not {}",
            backend.name()
        )));
    }
    let assets = ctx.vm.as_ref().map_err(|e| invalid_restore(format!("the vm backend is not available: {e}")))?;
    if assets.identity() != vm.assets {
        return Err(invalid_restore(format!(
            "snapshot {sid} was taken with another guest kernel, initramfs or vm engine than this server's; \
             its machine cannot resume on them"
        )));
    }
    let image = ctx.images.resolve(&vm.image_id).map_err(image_gone)?;
    let dir = ctx.snapshots.vm_dir(sid);
    let memory = dir.join("memory");
    let files = crate::sandbox::vm::VmRestoreFiles {
        state: dir.join("state"),
        memory: memory.is_file().then_some(memory),
        scratch: dir.join("scratch.img"),
        cmdline: vm.cmdline.clone(),
    };
    Ok(Restore { snapshot_id: sid.to_owned(), image, source_image: rec.source_image, vm: Some((vm, files)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuid4() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!("89ab".contains(&id[19..20]));
    }
}

//! Lifecycle API handlers (`/v1/sandboxes...`).
use super::create_fields;
use super::egress;
use super::error::{parse_json, ApiError, ApiResult};
use super::limits;
use super::models::*;
use super::query::Query;
use super::snapshots;
use crate::sandbox::backend;
use crate::sandbox::egress::with_policy_locked;
use crate::sandbox::hooks::Lifecycle;
use crate::sandbox::launch::{self, LaunchSpec};
use crate::sandbox::record::rfc3339;
use crate::sandbox::requested::Requested;
use crate::sandbox::teardown::teardown;
use crate::sandbox::templates::Plan;
use crate::sandbox::{SandboxEntry, State as SbState};
use crate::server::Ctx;
use crate::snapshot::Origin;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use pvisor_net::policy::Policy;
use pvisor_proto::agent::AgentConfig;
use pvisor_proto::worker::worker_client::WorkerClient;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest sandbox lifetime a create may ask for (30 days).
const MAX_TIMEOUT_SECS: i64 = 30 * 24 * 3600;
const RESERVED_METADATA_PREFIX: &str = "opensandbox.io/";
pub const EXECD_PORT: u16 = 44772;
pub const TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";
/// What backs a sandbox, for the SDK: `template` (OpenSandbox's one value).
pub const ORIGIN_HEADER: &str = "OPEN-SANDBOX-ORIGIN";

pub fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-4{}-{}-{}", &h[0..8], &h[8..12], &h[13..16], &h[16..20], &h[20..32])
}

pub fn new_token() -> String {
    let b: [u8; 24] = rand::random();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn status_view(e: &SandboxEntry) -> StatusView {
    let s = e.status();
    StatusView {
        state: s.state.as_str().into(),
        reason: s.reason.clone(),
        message: s.message.clone(),
        last_transition_at: rfc3339(&s.since),
    }
}

pub fn view(e: &SandboxEntry) -> SandboxView {
    let status = status_view(e);
    let s = e.status();
    SandboxView {
        id: e.id.clone(),
        image: e.origin.snapshot_id.is_none().then(|| ImageRef { uri: e.image_uri.clone() }),
        snapshot_id: e.origin.snapshot_id.clone(),
        platform: e.requested.platform.clone(),
        status,
        entrypoint: e.entrypoint.clone(),
        created_at: rfc3339(&e.created_at),
        expires_at: s.expires_at.as_ref().map(rfc3339),
        metadata: s.metadata.clone(),
        extensions: e.requested.extensions.clone(),
        resource_requests: e.requested.resource_requests.clone(),
        allocation: e.requested.pool_ref.as_ref().map(|p| AllocationView {
            mode: "pool".into(),
            pool_ref: p.clone(),
            state: "allocated".into(),
        }),
    }
}

pub fn check_metadata(m: &BTreeMap<String, String>) -> ApiResult<()> {
    for k in m.keys() {
        if k.is_empty() {
            return Err(ApiError::bad_request("metadata keys must not be empty"));
        }
        if k.starts_with(RESERVED_METADATA_PREFIX) {
            return Err(ApiError::bad_request(format!(
                "metadata key {k:?} uses the reserved prefix {RESERVED_METADATA_PREFIX}"
            )));
        }
    }
    Ok(())
}

fn lookup(ctx: &Ctx, id: &str) -> ApiResult<Arc<SandboxEntry>> {
    ctx.registry.get(id).ok_or_else(|| ApiError::sandbox_not_found(id))
}

/// The image of a create: from the pool, or pulled into it first when the
/// server allows pulls (`pvisor serve --allow-pull`).
pub async fn resolve_image(ctx: &Arc<Ctx>, image: &ImageSpec) -> ApiResult<pvisor_images::ImageRecord> {
    let not_found = |e: &dyn std::fmt::Display| {
        ApiError::new(StatusCode::NOT_FOUND, "IMAGE_NOT_FOUND", format!("image {:?}: {e}", image.uri))
    };
    match ctx.images.resolve(&image.uri) {
        Ok(r) => return Ok(r),
        Err(pvisor_images::Error::NotFound(_)) if ctx.allow_pull => {}
        Err(e) => return Err(not_found(&e)),
    }
    // Only the request's own credentials: the server's would go to whatever
    // registry a request names.
    let mut opts = pvisor_images::registry::PullOptions::default();
    if let Some(a) = &image.auth {
        opts.username = a.username.clone();
        opts.password = a.password.clone();
    }
    let (c, uri) = (ctx.clone(), image.uri.clone());
    let pulled = tokio::task::spawn_blocking(move || c.images.pull(&uri, &opts, &mut |_| {}))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    match pulled {
        Ok(_) => ctx.images.resolve(&image.uri).map_err(|e| not_found(&e)),
        Err(pvisor_images::Error::Registry(e)) => {
            use pvisor_images::registry::RegistryError as R;
            let (status, code) = match &e {
                R::NotFound { .. } => (StatusCode::NOT_FOUND, "IMAGE_NOT_FOUND"),
                // Not 401: that would read as a bad API key for this server.
                R::Unauthorized { .. } => (StatusCode::BAD_GATEWAY, "IMAGE_PULL_UNAUTHORIZED"),
                R::InvalidReference { .. } | R::NoMatchingPlatform { .. } => {
                    (StatusCode::BAD_REQUEST, "IMAGE_PULL_FAILED")
                }
                _ => (StatusCode::BAD_GATEWAY, "IMAGE_PULL_FAILED"),
            };
            Err(ApiError::new(status, code, format!("pulling {:?}: {e}", image.uri)))
        }
        Err(e) => {
            Err(ApiError::new(StatusCode::BAD_GATEWAY, "IMAGE_PULL_FAILED", format!("pulling {:?}: {e}", image.uri)))
        }
    }
}

#[utoipa::path(post, path = "/sandboxes", tag = "sandboxes", request_body = CreateSandboxRequest,
    responses((status = 202, description = "the sandbox, starting or running", body = CreateSandboxResponse)))]
pub async fn create(State(ctx): State<Arc<Ctx>>, body: Bytes) -> Result<Response, Response> {
    let started = std::time::Instant::now();
    let admitted = ctx.admission.admit(ctx.registry.list().len()).await.map_err(|r| {
        crate::metrics::events().create_failed(r.error.code);
        r.into_response()
    })?;
    // A task of its own: a client that goes away mid-create (one that waits for a long
    // pre-start hook past its request timeout) must not cut the launch short and leave its
    // worker behind; the create ends whole, the sandbox registered (listed) or removed.
    let created = tokio::spawn(create_admitted(ctx, body, started, admitted))
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("the create failed: {e}"))));
    created.map_err(|e| {
        crate::metrics::events().create_failed(e.code);
        e.into_response()
    })
}

async fn create_admitted(
    ctx: Arc<Ctx>,
    body: Bytes,
    started: std::time::Instant,
    mut admitted: crate::http::admission::Creating,
) -> ApiResult<Response> {
    let raw: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    create_fields::check_unknown_fields(&raw)?;
    let req: CreateSandboxRequest = serde_json::from_value(serde_json::Value::Object(raw)).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", format!("invalid JSON body: {e}"))
    })?;
    // A blank templateId names no template (as the reference).
    let template = req.template_id.as_deref().map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned);
    let entry = match template {
        Some(t) => crate::catalog::sandboxes::create(&ctx, &t, req, started).await?,
        None => {
            let launched = launch_request(&ctx, &req, new_id(), started, Some(&mut admitted)).await?;
            register(&ctx, launched, None, started)
        }
    };
    Ok((StatusCode::ACCEPTED, Json(created_view(&entry))).into_response())
}

/// The 202's body.
fn created_view(entry: &SandboxEntry) -> CreateSandboxResponse {
    let v = view(entry);
    CreateSandboxResponse {
        id: v.id,
        status: v.status,
        created_at: v.created_at,
        entrypoint: v.entrypoint,
        expires_at: v.expires_at,
        metadata: v.metadata,
        platform: v.platform,
        extensions: v.extensions,
    }
}

/// A create's `timeout`, checked (seconds; None: no automatic expiry).
pub fn check_timeout(timeout: Option<i64>) -> ApiResult<Option<i64>> {
    match timeout {
        None => Ok(None),
        Some(t) if (1..=MAX_TIMEOUT_SECS).contains(&t) => Ok(Some(t)),
        Some(t) => {
            Err(ApiError::bad_request(format!("timeout must be between 1 and {MAX_TIMEOUT_SECS} seconds, got {t}")))
        }
    }
}

/// A sandbox started for a create, not in the registry yet ([`register`]
/// puts it there); a template's warm sandbox waits in this shape (see
/// [`crate::catalog::warm`]).
pub struct Launched {
    pub id: String,
    pub image_uri: String,
    pub image_id: String,
    pub entrypoint: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub metadata: BTreeMap<String, String>,
    pub requested: Requested,
    pub origin: Origin,
    pub policy: Option<Policy>,
    pub runtime: crate::sandbox::record::Runtime,
    pub child: tokio::process::Child,
}

impl Launched {
    /// Its record (with a fresh endpoint token), not registered; and its worker process.
    pub fn into_entry(self, created: Option<String>) -> (SandboxEntry, tokio::process::Child) {
        let mut entry = SandboxEntry::new(
            self.id,
            new_token(),
            self.image_uri,
            self.entrypoint,
            self.expires_at,
            self.metadata,
            self.runtime,
        )
        .with_created_at(self.created_at)
        .with_image_id(self.image_id)
        .with_origin(self.origin)
        .with_requested(self.requested)
        .with_egress(self.policy);
        if created.is_some() {
            let events = crate::sandbox::events::EventLog::default();
            events.push(crate::sandbox::events::EventKind::Created, created);
            entry.events = events;
        }
        (entry, self.child)
    }
}

/// Makes a launched sandbox known: its record on disk, then the registry,
/// its worker watched. `created`: a detail of its Created event.
pub fn register(
    ctx: &Arc<Ctx>,
    launched: Launched,
    created: Option<String>,
    started: std::time::Instant,
) -> Arc<SandboxEntry> {
    let log = launched.runtime.log.clone();
    let (entry, child) = launched.into_entry(created);
    let entry = Arc::new(entry);
    entry.events.push(crate::sandbox::events::EventKind::Ready, None);
    // On disk before anyone learns of it: a restarted broker finds it.
    if ctx.persist {
        entry.attach_store(ctx.state.clone());
        entry.save();
    }
    ctx.registry.insert(entry.clone());
    launch::monitor(ctx.clone(), entry.clone(), child, log);
    crate::metrics::events().created(&entry.id, entry.backend_name(), started);
    tracing::info!(sandbox = %entry.id, image = %entry.image_uri, "created");
    entry
}

/// Validates a create and starts its sandbox (`id`), up to its worker's Ready.
/// `admitted`: the create's admission, whose slot a create that only waits
/// for its pre-start hook gives to the next create.
pub async fn launch_request(
    ctx: &Arc<Ctx>,
    req: &CreateSandboxRequest,
    id: String,
    started: std::time::Instant,
    admitted: Option<&mut crate::http::admission::Creating>,
) -> ApiResult<Launched> {
    let ctx = ctx.clone();
    let platform = req.platform.as_ref().map(create_fields::check_platform).transpose()?;
    create_fields::check_extensions(req.extensions.as_ref())?;
    let pool_ref = create_fields::check_pool(req.extensions.as_ref(), ctx.pool.size(), req.snapshot_id.is_some())?;
    let volumes = crate::volumes::check(req.volumes.as_deref(), &ctx.volumes.allowed)?;
    let policy = req.network_policy.as_ref().map(Policy::from_json).transpose().map_err(egress::create_error)?;
    if req.credential_proxy.as_ref().and_then(|c| c.enabled) == Some(true) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "CREDENTIAL_PROXY_UNSUPPORTED",
            "credentialProxy (the credential vault) is not supported by this server yet",
        ));
    }
    let hooks = super::hooks::parse(req.lifecycle.as_ref())?;
    // A restore (`snapshotId`) names no image; `snapshots::restore_source` checks the pair.
    let image = match (&req.image, &req.snapshot_id) {
        (_, Some(_)) => None,
        (Some(i), None) => Some(i),
        (None, None) => return Err(ApiError::bad_request("image is required")),
    };
    if image.is_some_and(|i| i.uri.trim().is_empty()) {
        return Err(ApiError::bad_request("image.uri must not be empty"));
    }
    if let Some(ep) = &req.entrypoint {
        if ep.is_empty() || ep[0].is_empty() {
            return Err(ApiError::bad_request("entrypoint must have at least one non-empty element"));
        }
    }
    let timeout = check_timeout(req.timeout)?;
    let limits = limits::from_request(req.resource_limits.as_ref(), ctx.default_limits, &ctx.limit_bounds)?;
    let resource_requests = req.resource_requests.clone().unwrap_or_default();
    create_fields::check_requests(&resource_requests, &limits, &ctx.limit_bounds)?;
    let requested = Requested {
        platform,
        resource_requests,
        pool_ref,
        extensions: req.extensions.clone().unwrap_or_default(),
        template_id: None,
    };
    let metadata = req.metadata.clone().unwrap_or_default();
    check_metadata(&metadata)?;
    let env = req.env.clone().unwrap_or_default();
    if env.keys().any(|k| k.is_empty() || k.contains('=')) {
        return Err(ApiError::bad_request("env keys must be non-empty and must not contain '='"));
    }

    // A restore runs on its snapshot's backend unless the request names one.
    let snapshot_backend = req.snapshot_id.as_ref().and_then(|sid| ctx.snapshots.get(sid)).map(|r| match r.vm {
        Some(_) => pvisor_worker::config::BackendKind::Vm,
        None => pvisor_worker::config::BackendKind::Ns,
    });
    let backend = backend::choose(&ctx, req.extensions.as_ref(), snapshot_backend)?;
    if matches!(backend, pvisor_worker::config::BackendKind::Vm) && !volumes.is_empty() {
        return Err(crate::volumes::VolumeError::BackendCannotMount("vm").into());
    }
    backend::check_limits(backend, &limits)?;
    let restore = match &req.snapshot_id {
        Some(sid) => Some(snapshots::restore_source(&ctx, sid, req.image.is_some(), backend)?),
        None => None,
    };
    let (record, image_uri) = match (&restore, image) {
        (Some(r), _) => (r.image.clone(), r.source_image.clone()),
        (None, Some(image)) => (resolve_image(&ctx, image).await?, image.uri.clone()),
        (None, None) => return Err(ApiError::bad_request("image is required")),
    };
    let cfg = &record.config;
    let vm_restore = restore.as_ref().and_then(|r| r.vm.clone());
    let policy = ctx.net.initial_policy(policy);
    if let Some((snap, _)) = &vm_restore {
        snapshots::check_vm_restore(snap, &limits, policy.is_some(), &env)?;
        if hooks.is_some() {
            return Err(super::hooks::HookError::VmRestore.into());
        }
    }
    // A vm restore's agent runs on with its source's hooks (and must be
    // configured with them again).
    let hooks = match &vm_restore {
        Some((snap, _)) => snap.agent_lifecycle.clone(),
        None => hooks,
    };
    let entrypoint = match (&req.entrypoint, &vm_restore) {
        // A vm restore starts nothing: its machine's processes run on.
        (_, Some((snap, _))) => snap.agent_entrypoint.clone(),
        (Some(ep), None) => ep.clone(),
        (None, None) if restore.is_some() => snapshots::RESTORE_ENTRYPOINT.iter().map(|s| s.to_string()).collect(),
        (None, None) => cfg.entrypoint.iter().chain(cfg.cmd.iter()).cloned().collect(),
    };
    let mut env_list: Vec<String> = cfg.env.clone();
    env_list.push(format!("OPENSANDBOX_ID={id}"));
    env_list.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    let agent = match &vm_restore {
        // The restored agent is configured already, with its source's configuration.
        Some((snap, _)) => AgentConfig {
            env: snap.agent_env.clone(),
            workdir: snap.agent_workdir.clone(),
            user: snap.agent_user.clone(),
            entrypoint: snap.agent_entrypoint.clone(),
            lifecycle: hooks.as_ref().and_then(Lifecycle::to_agent),
        },
        None => AgentConfig {
            env: env_list,
            workdir: cfg.working_dir.clone(),
            user: cfg.user.clone(),
            entrypoint: entrypoint.clone(),
            lifecycle: hooks.as_ref().and_then(Lifecycle::to_agent),
        },
    };
    let origin = Origin {
        backend: Some(backend),
        env: match &vm_restore {
            Some(_) => agent.env.iter().filter(|e| !e.starts_with("OPENSANDBOX_ID=")).cloned().collect(),
            None => cfg.env.iter().cloned().chain(env.iter().map(|(k, v)| format!("{k}={v}"))).collect(),
        },
        working_dir: agent.workdir.clone(),
        user: agent.user.clone(),
        snapshot_id: restore.as_ref().map(|r| r.snapshot_id.clone()),
        tmp_on_root: restore.is_some(),
        agent_env: agent.env.clone(),
        lifecycle: hooks.clone(),
        vm: match (backend, &ctx.vm) {
            (pvisor_worker::config::BackendKind::Vm, Ok(_)) => {
                let (vcpus, memory_mib) = crate::sandbox::vm::VmAssets::shape(&limits);
                Some(crate::snapshot::VmShape { vcpus, memory_mib, net: policy.is_some() })
            }
            _ => None,
        },
    };
    let image_id = record.id.clone();
    let t_resolved = started.elapsed();
    let c = ctx.clone();
    let root = tokio::task::spawn_blocking(move || c.rootfs(backend).root(&record))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "IMAGE_SERVE_FAILED", e))?;
    let net = policy.as_ref().map(|p| ctx.net.config(p));
    let c = ctx.clone();
    let prepared = tokio::task::spawn_blocking(move || crate::volumes::prepare(&volumes, &c.volumes.store))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    // The sandbox's life starts here: createdAt, and expiresAt = createdAt + timeout (a vm that
    // boots for seconds still shows the whole timeout between the two).
    let created_at = Utc::now();
    let expires_at = timeout.map(|t| created_at + ChronoDuration::seconds(t));
    let restore_is_vm = vm_restore.is_some();
    let plan = template_plan(&ctx, &image_id, origin.vm.as_ref(), &limits, restore_is_vm, &id);
    let (template_clone, vm_capture) = match &plan {
        Plan::Clone { files, .. } => (Some(files.clone()), None),
        Plan::Capture(c) => (None, Some(c.request.clone())),
        Plan::None => (None, None),
    };
    let spec = LaunchSpec {
        id: id.clone(),
        root,
        limits,
        agent,
        net,
        volumes: prepared.mounts,
        tmp_on_root: origin.tmp_on_root,
        expires_at,
        vm_restore: vm_restore.map(|(_, files)| files).or(template_clone),
        vm_capture,
        // A restored machine's pre-start hook ran in its source.
        pre_start_budget: match restore_is_vm {
            true => std::time::Duration::ZERO,
            false => hooks.as_ref().map_or(std::time::Duration::ZERO, Lifecycle::pre_start_budget),
        },
    };
    let t_prepared = started.elapsed();
    let launched = {
        let launch = launch::launch(&ctx, &spec);
        tokio::pin!(launch);
        // Past the time a plain start may take, a create still waiting is
        // running its pre-start hook: it gives up its create slot (not its
        // place among the sandboxes), so long hooks do not hold up others.
        match spec.pre_start_budget.is_zero() {
            true => launch.await,
            false => tokio::select! {
                r = &mut launch => r,
                () = tokio::time::sleep(ctx.ready_timeout) => {
                    if let Some(admitted) = admitted {
                        admitted.release_slot();
                    }
                    launch.await
                }
            },
        }
    };
    let t_launched = started.elapsed();
    let captured =
        launched.as_ref().map(|(_, _, r)| (r.template_cmdline.clone(), r.template_capture_us)).unwrap_or_default();
    if let Some(t) = &ctx.templates {
        match plan {
            Plan::Clone { key, .. } if launched.is_err() => t.broken(&key),
            Plan::Capture(c) => {
                let c2 = ctx.clone();
                tokio::task::spawn_blocking(move || {
                    if let Some(t) = &c2.templates {
                        t.finish(c, &captured.0, captured.1)
                    }
                });
            }
            _ => {}
        }
    }
    let (mut runtime, child, _) = launched?;
    runtime.volumes = Some(prepared.held);
    tracing::debug!(sandbox = %id, resolved = ?t_resolved, prepared = ?t_prepared, launched = ?t_launched,
        "create phases (since the request)");
    Ok(Launched {
        id,
        image_uri,
        image_id,
        entrypoint,
        created_at,
        expires_at,
        metadata,
        requested,
        origin,
        policy,
        runtime,
        child,
    })
}

/// What a create does about vm templates (`--vm-templates`): only a vm create that is not
/// a restore of a snapshot takes part.
fn template_plan(
    ctx: &Ctx,
    image_id: &str,
    vm: Option<&crate::snapshot::VmShape>,
    limits: &pvisor_worker::config::Limits,
    restore: bool,
    id: &str,
) -> Plan {
    match (&ctx.templates, &ctx.vm, vm, restore) {
        (Some(t), Ok(assets), Some(shape), false) => {
            let shape = pvisor_worker::vm::template::Shape {
                vcpus: shape.vcpus,
                memory_mib: shape.memory_mib,
                net: shape.net,
                cmdline_extra: assets.cmdline_extra.clone(),
                disk_bytes: limits.disk_bytes,
            };
            t.plan(assets, image_id, shape, id)
        }
        _ => Plan::None,
    }
}

#[utoipa::path(get, path = "/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = SandboxView)))]
pub async fn get_one(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<Json<SandboxView>> {
    let e = lookup(&ctx, &id)?;
    Ok(Json(view(&e)))
}

/// Parses the SDK's `metadata` filter: `k1=v1&k2=v2`, each part percent-encoded.
pub fn parse_metadata_filter(raw: &str) -> Vec<(String, String)> {
    let dec = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (dec(k), dec(v)),
            None => (dec(p), String::new()),
        })
        .collect()
}

#[utoipa::path(get, path = "/sandboxes", tag = "sandboxes",
    params(
        ("state" = Option<Vec<String>>, Query, description = "states to keep (repeatable)", explode = true),
        ("metadata" = Option<String>, Query, description = "k1=v1&k2=v2, each part percent-encoded"),
        ("page" = Option<u64>, Query, minimum = 1, description = "from 1"),
        ("pageSize" = Option<u64>, Query, minimum = 1, maximum = 200),
    ),
    responses((status = 200, body = ListSandboxesResponse)))]
pub async fn list(State(ctx): State<Arc<Ctx>>, RawQuery(raw): RawQuery) -> ApiResult<Json<ListSandboxesResponse>> {
    let q = Query::parse(raw.as_deref());
    let states: Vec<String> = q.all("state").iter().map(|s| s.to_ascii_lowercase()).collect();
    let meta: Vec<(String, String)> = q.all("metadata").iter().flat_map(|m| parse_metadata_filter(m)).collect();
    let (page, page_size) = q.paging()?;
    let items: Vec<SandboxView> = ctx
        .registry
        .list()
        .iter()
        .map(|e| view(e))
        .filter(|v| states.is_empty() || states.contains(&v.status.state.to_ascii_lowercase()))
        .filter(|v| meta.iter().all(|(k, val)| v.metadata.get(k) == Some(val)))
        .collect();
    let (items, pagination) = Pagination::page_of(items, page, page_size, |v| v);
    Ok(Json(ListSandboxesResponse { items, pagination }))
}

#[utoipa::path(delete, path = "/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204, description = "deleted")))]
pub async fn delete(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let entry = ctx.registry.remove(&id).ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    // Recorded as deleting first: a broker that dies now finishes it at restart.
    entry.save();
    teardown(&entry).await;
    entry.forget();
    crate::metrics::events().deleted(&id, "api");
    tracing::info!(sandbox = %id, "deleted");
    Ok(StatusCode::NO_CONTENT)
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").ok().map(|n| n.and_utc()))
}

#[utoipa::path(post, path = "/sandboxes/{id}/renew-expiration", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = RenewRequest, responses((status = 200, body = RenewResponse)))]
pub async fn renew(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>, body: Bytes) -> ApiResult<Json<RenewResponse>> {
    lookup(&ctx, &id)?;
    let req: RenewRequest = parse_json(&body)?;
    let at = parse_time(&req.expires_at).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_EXPIRATION",
            format!("expiresAt {:?} is not an RFC 3339 time", req.expires_at),
        )
    })?;
    if at <= Utc::now() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "INVALID_EXPIRATION", "expiresAt is in the past"));
    }
    // The same cap as a create's timeout: a renewal cannot make a sandbox immortal.
    if at > Utc::now() + ChronoDuration::seconds(MAX_TIMEOUT_SECS) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_EXPIRATION",
            format!("expiresAt may be at most {} days from now", MAX_TIMEOUT_SECS / 86_400),
        ));
    }
    // Under the registry lock: the expiry sweep cannot remove it meanwhile.
    let r = ctx.registry.with_live(&id, |e| {
        let mut s = e.status();
        if s.expires_at.is_none() {
            return Err(ApiError::conflict(
                "MANUAL_CLEANUP",
                "sandbox was created without a timeout; it has no expiry to renew",
            ));
        }
        s.expires_at = Some(at);
        e.events.push(crate::sandbox::events::EventKind::Renewed, Some(format!("expires at {}", rfc3339(&at))));
        Ok(at)
    });
    let at = r.ok_or_else(|| ApiError::sandbox_not_found(&id))??;
    if let Some(e) = ctx.registry.get(&id) {
        e.save();
        send_deadline(&e, at).await;
    }
    Ok(Json(RenewResponse { expires_at: rfc3339(&at) }))
}

/// Tells the worker the new expiry, which it enforces when no broker runs.
/// A worker that misses it would end the sandbox at the old time, so a
/// failure is logged loudly; the broker's own sweep keeps the new time.
async fn send_deadline(e: &SandboxEntry, at: DateTime<Utc>) {
    let Ok(channel) = e.channel() else { return };
    let d = pvisor_proto::worker::Deadline { unix_ms: at.timestamp_millis() };
    if let Err(s) = WorkerClient::new(channel).set_deadline(d).await {
        tracing::error!(sandbox = %e.id, "the worker did not take the new deadline: {}", s.message());
    }
}

#[utoipa::path(get, path = "/sandboxes/{id}/endpoints/{port}", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id"), ("port" = String, Path, description = "a port inside the sandbox (1-65535)"),
        ("use_server_proxy" = Option<bool>, Query, description = "an endpoint through this server's /v1 proxy"),
        ("expires" = Option<u64>, Query, description = "a signed endpoint (OSEP-0011), open without headers until this Unix second")),
    responses((status = 200, body = EndpointView, headers((
        "OPEN-SANDBOX-ORIGIN" = String, description = "`template` for a sandbox created from a template"))),
        (status = 400, description = "a bad port, or an `expires` that is not a future Unix second")))]
pub async fn endpoint(
    State(ctx): State<Arc<Ctx>>,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let e = lookup(&ctx, &id)?;
    let port: u16 =
        port.parse().ok().filter(|p| *p > 0).ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?}")))?;
    let q = Query::parse(raw.as_deref());
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| ctx.listen.to_string());
    let (endpoint, headers) = match signed_expiry(&q)? {
        // Signed: the route is its own credential, so it is the direct one
        // (no API key) whichever proxy was asked for, and carries no header.
        Some(expires) => {
            let route = ctx.signing.sign(&id, port, expires);
            (format!("{host}/sandboxes/{id}/signed/{port}/{route}"), BTreeMap::new())
        }
        None => {
            let prefix = if q.flag("use_server_proxy") { "/v1" } else { "" };
            let endpoint = format!("{host}{prefix}/sandboxes/{id}/proxy/{port}");
            (endpoint, BTreeMap::from([(TOKEN_HEADER.to_string(), e.token.clone())]))
        }
    };
    let body = Json(EndpointView { endpoint, headers });
    // The SDK reads the origin from this header (`Sandbox.connect`); it then sends egress
    // policy changes to the lifecycle route, which pvisor serves as well as port 18080.
    Ok(match e.requested.template_id {
        Some(_) => ([(ORIGIN_HEADER, "template")], body).into_response(),
        None => body.into_response(),
    })
}

/// The `expires` of an endpoint request: none mints no signature; present,
/// it must be a decimal Unix second after now (an empty, malformed, past or
/// present second is a 400, as in OSEP-0011).
fn signed_expiry(q: &Query) -> ApiResult<Option<u64>> {
    let Some(raw) = q.one("expires") else { return Ok(None) };
    let expires: u64 = raw
        .parse()
        .ok()
        .filter(|_| raw.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| ApiError::bad_request(format!("expires must be a Unix time in seconds, got {raw:?}")))?;
    let now = Utc::now().timestamp().max(0) as u64;
    if expires <= now {
        return Err(ApiError::bad_request(format!("expires ({expires}) must be after the current time ({now})")));
    }
    Ok(Some(expires))
}

/// Pauses or resumes through the worker, the egress policy locked (see
/// [`crate::sandbox::egress`]): a resumed sandbox's netd gets the policy
/// again, edits made while it was paused included.
async fn worker_call(ctx: &Ctx, id: &str, pause: bool) -> ApiResult<()> {
    let e = lookup(ctx, id)?;
    let call = async {
        let mut client = WorkerClient::new(e.channel()?);
        let r = if pause {
            client.pause(pvisor_proto::worker::Empty {}).await
        } else {
            client.resume(pvisor_proto::worker::Empty {}).await
        };
        r.map_err(ApiError::from)?;
        e.transition_live(if pause { SbState::Paused } else { SbState::Running });
        Ok(())
    };
    with_policy_locked(&e, !pause, call).await
}

#[utoipa::path(post, path = "/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 202, description = "paused")))]
pub async fn pause(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    worker_call(&ctx, &id, true).await?;
    Ok(StatusCode::ACCEPTED)
}

#[utoipa::path(post, path = "/sandboxes/{id}/resume", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 202, description = "resumed")))]
pub async fn resume(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    worker_call(&ctx, &id, false).await?;
    Ok(StatusCode::ACCEPTED)
}

/// JSON merge patch of the metadata: a string sets a key, null deletes it.
#[utoipa::path(patch, path = "/sandboxes/{id}/metadata", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body(content = BTreeMap<String, Option<String>>,
        description = "JSON merge patch: a string sets a key, null deletes it"),
    responses((status = 200, body = SandboxView)))]
pub async fn patch_metadata(
    State(ctx): State<Arc<Ctx>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SandboxView>> {
    let e = lookup(&ctx, &id)?;
    let patch: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    let mut set = BTreeMap::new();
    let mut del = Vec::new();
    for (k, v) in patch {
        match v {
            serde_json::Value::Null => del.push(k),
            serde_json::Value::String(s) => {
                set.insert(k, s);
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "metadata value for {k:?} must be a string or null, got {other}"
                )))
            }
        }
    }
    check_metadata(&set)?;
    {
        let mut s = e.status();
        for k in del {
            s.metadata.remove(&k);
        }
        s.metadata.extend(set);
    }
    e.save();
    Ok(Json(view(&e)))
}

#[utoipa::path(post, path = "/metrics/events", tag = "sandboxes",
    request_body(content = Object, description = "a client metrics event (accepted and dropped)"),
    responses((status = 204, description = "accepted")))]
pub async fn metrics_event() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_decodes_each_part() {
        assert_eq!(
            parse_metadata_filter("team=a%26b&env=prod"),
            vec![("team".to_string(), "a&b".to_string()), ("env".to_string(), "prod".to_string())]
        );
    }

    #[test]
    fn times_parse_with_offsets_and_fractions() {
        assert!(parse_time("2026-11-30T04:44:49.797776+00:00").is_some());
        assert!(parse_time("2026-01-01T00:00:00Z").is_some());
        assert!(parse_time("yesterday").is_none());
    }

    #[test]
    fn the_view_shows_what_the_create_asked_for_and_omits_what_it_did_not() {
        let entry = || {
            SandboxEntry::new("id".into(), "t".into(), "busybox".into(), vec!["sh".into()], None, BTreeMap::new(), None)
        };
        let plain = serde_json::to_value(view(&entry())).unwrap();
        for key in ["platform", "resourceRequests", "allocation", "extensions"] {
            assert!(plain.get(key).is_none(), "{key} shown for a create that did not give it: {plain}");
        }
        let requested = Requested {
            platform: Some(crate::sandbox::requested::Platform { os: "linux".into(), arch: "amd64".into() }),
            resource_requests: BTreeMap::from([("memory".into(), "256Mi".into())]),
            pool_ref: Some("default".into()),
            extensions: BTreeMap::from([("poolRef".into(), "default".into())]),
            template_id: None,
        };
        let v = serde_json::to_value(view(&entry().with_requested(requested))).unwrap();
        assert_eq!(v["platform"], serde_json::json!({"os": "linux", "arch": "amd64"}));
        assert_eq!(v["resourceRequests"], serde_json::json!({"memory": "256Mi"}));
        assert_eq!(v["allocation"], serde_json::json!({"mode": "pool", "poolRef": "default", "state": "allocated"}));
        assert_eq!(v["extensions"], serde_json::json!({"poolRef": "default"}));
    }

    #[test]
    fn ids_look_like_uuid4() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}

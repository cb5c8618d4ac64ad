//! A create with `templateId`: the template fixes the sandbox's image,
//! entrypoint, environment and limits (a create that gives any of those, or
//! the other fields the reference refuses beside a template, is a 400);
//! `metadata` goes over the template's, `networkPolicy` and `extensions` are
//! the create's own, and `timeout` is required (as the reference). A warm
//! sandbox of the template is handed out where one fits ([`super::warm`]);
//! else the sandbox starts as a create of the template's settings would.
use super::record::TemplateRecord;
use super::warm;
use crate::api::create_fields;
use crate::api::error::{ApiError, ApiResult};
use crate::api::lifecycle;
use crate::api::models::{CreateSandboxRequest, ImageSpec};
use crate::sandbox::backend;
use crate::sandbox::record::rfc3339;
use crate::sandbox::requested::Requested;
use crate::sandbox::SandboxEntry;
use crate::server::Ctx;
use axum::http::StatusCode;
use std::sync::Arc;

pub fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "TEMPLATE::NOT_FOUND", format!("template {id} not found"))
}

/// The fields of a create that a template fixes, as the reference lists them.
fn fixed_fields(req: &CreateSandboxRequest) -> Vec<&'static str> {
    let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
    [
        ("credentialProxy", req.credential_proxy.is_some()),
        ("entrypoint", req.entrypoint.is_some()),
        ("env", req.env.is_some()),
        ("image", req.image.is_some()),
        ("lifecycle", req.lifecycle.is_some()),
        ("platform", req.platform.is_some()),
        ("resourceLimits", req.resource_limits.is_some()),
        ("resourceRequests", req.resource_requests.is_some()),
        ("secureAccess", req.secure_access == Some(true)),
        ("snapshotId", !blank(&req.snapshot_id)),
        ("volumes", req.volumes.is_some()),
    ]
    .into_iter()
    .filter(|(_, given)| *given)
    .map(|(name, _)| name)
    .collect()
}

/// What a create with `templateId` may not do, before anything else.
fn check(req: &CreateSandboxRequest) -> ApiResult<()> {
    let fixed = fixed_fields(req);
    if !fixed.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER",
            format!(
                "templateId cannot be combined with: {}; the template fixes the sandbox's image, \
                 entrypoint, environment and limits",
                fixed.join(", ")
            ),
        ));
    }
    if req.timeout.is_none() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMETER",
            "timeout is required when templateId is provided",
        ));
    }
    Ok(())
}

/// The create a template stands for, with what the request brings
/// (`metadata` over the template's, `networkPolicy`, `extensions`, `timeout`).
fn sandbox_request(tpl: &TemplateRecord, req: CreateSandboxRequest) -> CreateSandboxRequest {
    CreateSandboxRequest {
        timeout: req.timeout,
        metadata: Some(tpl.sandbox_metadata(req.metadata.as_ref())),
        network_policy: req.network_policy,
        extensions: req.extensions,
        ..warm_request(tpl)
    }
}

/// The create of a template's warm sandbox: its settings alone (no expiry
/// yet, the default backend and egress).
pub fn warm_request(tpl: &TemplateRecord) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: Some(ImageSpec { uri: tpl.image.clone(), auth: None }),
        snapshot_id: None,
        template_id: None,
        platform: None,
        entrypoint: Some(tpl.entrypoint()),
        timeout: None,
        resource_limits: tpl.create_limits(),
        resource_requests: None,
        env: tpl.env.clone(),
        metadata: None,
        volumes: None,
        network_policy: None,
        credential_proxy: None,
        lifecycle: None,
        secure_access: None,
        extensions: None,
    }
}

/// `POST /v1/sandboxes` with `templateId`.
pub async fn create(
    ctx: &Arc<Ctx>,
    template_id: &str,
    req: CreateSandboxRequest,
    started: std::time::Instant,
) -> ApiResult<Arc<SandboxEntry>> {
    check(&req)?;
    let tpl = ctx.catalog.store.get(template_id).ok_or_else(|| not_found(template_id))?;
    if let Some(entry) = claim(ctx, &tpl, &req, started).await? {
        return Ok(entry);
    }
    let mut launched =
        lifecycle::launch_request(ctx, &sandbox_request(&tpl, req), lifecycle::new_id(), started, None).await?;
    launched.requested.template_id = Some(tpl.id.clone());
    let entry = lifecycle::register(ctx, launched, Some(format!("from template {}", tpl.id)), started);
    // None was ready (or none fitted): have one ready for the next create.
    warm::top_up(ctx.clone(), tpl.id.clone(), warm::REFILL_DELAY);
    Ok(entry)
}

/// Hands out a warm sandbox of the template if one fits the create (see
/// [`super::warm`]); `None`: the create starts its own.
async fn claim(
    ctx: &Arc<Ctx>,
    tpl: &TemplateRecord,
    req: &CreateSandboxRequest,
    started: std::time::Instant,
) -> ApiResult<Option<Arc<SandboxEntry>>> {
    if req.network_policy.is_some() || ctx.catalog.warm.want() == 0 {
        return Ok(None);
    }
    // What a create checks of the fields that may come with a template.
    create_fields::check_extensions(req.extensions.as_ref())?;
    let pool_ref = create_fields::check_pool(req.extensions.as_ref(), ctx.pool.size(), false)?;
    let timeout = lifecycle::check_timeout(req.timeout)?;
    lifecycle::check_metadata(req.metadata.as_ref().unwrap_or(&Default::default()))?;
    let backend = backend::choose(ctx, req.extensions.as_ref(), None)?;
    // The image the template's name stands for now (an import may have moved the name).
    let Ok(image) = ctx.images.resolve(&tpl.image) else { return Ok(None) };
    let (found, stale) = ctx.catalog.warm.take(&tpl.id, backend, &image.id);
    warm::discard_later(stale);
    let Some(w) = found else { return Ok(None) };
    warm::top_up(ctx.clone(), tpl.id.clone(), warm::REFILL_DELAY);
    let created_at = chrono::Utc::now();
    let expires_at = timeout.map(|t| created_at + chrono::Duration::seconds(t));
    if let Some(at) = expires_at {
        // Before anyone learns of the sandbox: its worker enforces the expiry too.
        if let Err(e) = w.set_deadline(at).await {
            tracing::warn!(template = %tpl.id, sandbox = %w.id(), "a warm sandbox refused its deadline: {e}");
            warm::discard_later(vec![w]);
            return Ok(None);
        }
    }
    let made_at = w.made_at();
    let requested = Requested {
        platform: None,
        resource_requests: Default::default(),
        pool_ref,
        extensions: req.extensions.clone().unwrap_or_default(),
        template_id: Some(tpl.id.clone()),
    };
    let metadata = tpl.sandbox_metadata(req.metadata.as_ref());
    let Some(launched) = w.into_launched(created_at, expires_at, metadata, requested) else { return Ok(None) };
    let detail = format!("from template {}, started ahead at {}", tpl.id, rfc3339(&made_at));
    Ok(Some(lifecycle::register(ctx, launched, Some(detail), started)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: serde_json::Value) -> CreateSandboxRequest {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_what_the_template_leaves_open_may_come_with_it() {
        let ok = req(serde_json::json!({"templateId": "tpl-x", "timeout": 600, "metadata": {"a": "b"},
            "networkPolicy": {"defaultAction": "deny"}, "extensions": {"k": "v"}, "secureAccess": false,
            "snapshotId": "  "}));
        assert!(check(&ok).is_ok());
        for (field, value) in [
            ("entrypoint", serde_json::json!(["x"])),
            ("env", serde_json::json!({"A": "1"})),
            ("resourceLimits", serde_json::json!({"cpu": "1"})),
            ("resourceRequests", serde_json::json!({"cpu": "1"})),
            ("image", serde_json::json!({"uri": "busybox"})),
            ("snapshotId", serde_json::json!("snap")),
            ("secureAccess", serde_json::json!(true)),
            ("volumes", serde_json::json!([])),
            ("platform", serde_json::json!({"os": "linux", "arch": "amd64"})),
            ("lifecycle", serde_json::json!({})),
            ("credentialProxy", serde_json::json!({"enabled": false})),
        ] {
            let e =
                check(&req(serde_json::json!({"templateId": "tpl-x", "timeout": 600, field: value}))).expect_err(field);
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "INVALID_PARAMETER"), "{field}");
            assert!(e.message.contains(field), "{e}");
        }
        let e = check(&req(serde_json::json!({"templateId": "tpl-x"}))).unwrap_err();
        assert!(e.message.contains("timeout is required"), "{e}");
    }

    #[test]
    fn a_templates_create_carries_its_settings_and_the_requests_own_fields() {
        let now = chrono::Utc::now();
        let tpl = TemplateRecord {
            id: "tpl-x".into(),
            image: "busybox:latest".into(),
            publish: String::new(),
            format: Default::default(),
            resource_limits: Some([("disk".to_string(), "1Gi".to_string())].into()),
            entrypoint: None,
            env: Some([("A".to_string(), "1".to_string())].into()),
            metadata: [("team".to_string(), "t".to_string())].into(),
            readiness: None,
            phase: super::super::record::Phase::Succeeded,
            message: None,
            created_at: now,
            updated_at: now,
        };
        let asked = req(serde_json::json!({"templateId": "tpl-x", "timeout": 60, "metadata": {"team": "u"},
            "extensions": {"pvisor.io/backend": "ns"}}));
        let r = sandbox_request(&tpl, asked);
        assert_eq!(r.image.as_ref().map(|i| i.uri.as_str()), Some("busybox:latest"));
        assert_eq!(r.entrypoint.as_deref(), Some(&["tail".to_string(), "-f".into(), "/dev/null".into()][..]));
        assert_eq!(r.resource_limits.unwrap().get("ephemeral-storage").map(String::as_str), Some("1Gi"));
        assert_eq!(r.env.unwrap().get("A").map(String::as_str), Some("1"));
        assert_eq!(r.metadata.unwrap().get("team").map(String::as_str), Some("u"));
        assert_eq!(r.timeout, Some(60));
        assert!(r.template_id.is_none(), "the launch is an ordinary create");
        assert_eq!(r.extensions.unwrap().get("pvisor.io/backend").map(String::as_str), Some("ns"));
        let w = warm_request(&tpl);
        assert!(w.timeout.is_none() && w.metadata.is_none() && w.extensions.is_none() && w.network_policy.is_none());
    }
}

//! The template routes (`/v1/templates`, `/v1/templates/{templateId}`): see
//! [`crate::catalog`]. Creates from a template are `POST /v1/sandboxes`
//! with `templateId` ([`crate::catalog::sandboxes`]).
use super::create_fields;
use super::error::{parse_json, ApiError, ApiResult};
use super::lifecycle;
use super::limits;
use super::models::{ImageSpec, Pagination};
use super::query::Query;
use crate::catalog::record::{self, Format, Phase, Readiness, TemplateRecord, LIMIT_KEYS};
use crate::catalog::sandboxes::not_found;
use crate::catalog::warm;
use crate::sandbox::backend;
use crate::sandbox::record::rfc3339;
use crate::server::Ctx;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::ToSchema;

/// `POST /v1/templates`. A field not listed here is a 400 `UNKNOWN_FIELD`
/// unless it is empty (null, false, "", [], {}).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateTemplateRequest {
    /// The image: a name, id or digest reference in the pool (pulled first
    /// where the server may pull, `--allow-pull`). Resolved again at each
    /// sandbox's create, so a later import of the name is what they get.
    pub image: String,
    /// The reference server's publish target for the built artifacts: kept
    /// and shown back (pvisor builds nothing to publish).
    #[serde(default)]
    pub publish: Option<String>,
    /// `cpu`, `memory`, `disk` (the sandbox's `ephemeral-storage`) and
    /// `pids`, as a sandbox's `resourceLimits`; absent keys get the server's defaults.
    #[serde(default)]
    pub resource_limits: Option<BTreeMap<String, String>>,
    /// What the sandboxes run (default `["tail", "-f", "/dev/null"]`).
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Over the image's own environment; names `[A-Za-z_][A-Za-z0-9_]*`.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// The template's metadata; its sandboxes get it too, under their own.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// The gate of the sandboxes started ahead for this template.
    #[serde(default)]
    pub readiness: Option<Readiness>,
    /// The reference's storage encoding: kept and shown back (default `overlaybd`).
    #[serde(default)]
    pub format: Option<Format>,
}

const FIELDS: [&str; 8] =
    ["image", "publish", "resourceLimits", "entrypoint", "env", "metadata", "readiness", "format"];

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateStatusView {
    pub phase: Phase,
    /// Where the reference published the build; pvisor publishes none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A template as the API shows it (OpenSandbox's `FsbTemplate`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateView {
    /// `tpl-<uuid>`.
    pub template_id: String,
    pub image: String,
    pub publish: String,
    pub format: Format,
    pub status: TemplateStatusView,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_limits: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListTemplatesResponse {
    pub items: Vec<TemplateView>,
    pub pagination: Pagination,
}

pub fn view(r: &TemplateRecord) -> TemplateView {
    TemplateView {
        template_id: r.id.clone(),
        image: r.image.clone(),
        publish: r.publish.clone(),
        format: r.format,
        status: TemplateStatusView { phase: r.phase, manifest_ref: None, message: r.message.clone() },
        created_at: rfc3339(&r.created_at),
        updated_at: rfc3339(&r.updated_at),
        resource_limits: r.resource_limits.clone(),
        entrypoint: r.entrypoint.clone(),
        env: r.env.clone(),
        metadata: r.metadata.clone(),
        readiness: r.readiness.clone(),
    }
}

fn store_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("template records: {e}"))
}

fn env_name_ok(k: &str) -> bool {
    let mut b = k.bytes();
    b.next().is_some_and(|c| c == b'_' || c.is_ascii_alphabetic()) && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// A template's `resourceLimits`, checked as a sandbox's would be (and
/// against what the server's default backend can run).
fn check_limits(ctx: &Ctx, given: &BTreeMap<String, String>) -> ApiResult<()> {
    if let Some(k) = given.keys().find(|k| !LIMIT_KEYS.iter().any(|(t, _)| t == k)) {
        let known: Vec<&str> = LIMIT_KEYS.iter().map(|(t, _)| *t).collect();
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "RESOURCE_LIMIT_UNKNOWN",
            format!("resourceLimits: unknown key {k:?} (a template's: {})", known.join(", ")),
        ));
    }
    let mapped: BTreeMap<String, String> =
        given.iter().map(|(k, v)| (record::create_key(k).to_string(), v.clone())).collect();
    let l = limits::from_request(Some(&mapped), ctx.default_limits, &ctx.limit_bounds).map_err(|e| {
        let msg = e.to_string().replace(
            &format!("resourceLimits.{}", limits::EPHEMERAL_STORAGE),
            &format!("resourceLimits.{}", record::template_key(limits::EPHEMERAL_STORAGE)),
        );
        ApiError::new(StatusCode::BAD_REQUEST, e.code(), msg)
    })?;
    backend::check_limits(ctx.default_backend, &l)
}

/// Checks a create's body; the record it makes (image not resolved yet).
fn record_of(ctx: &Ctx, body: &[u8]) -> ApiResult<TemplateRecord> {
    let raw: serde_json::Map<String, serde_json::Value> = parse_json(body)?;
    create_fields::check_fields(&raw, &FIELDS)?;
    let req: CreateTemplateRequest = serde_json::from_value(serde_json::Value::Object(raw)).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", format!("invalid JSON body: {e}"))
    })?;
    let image = req.image.trim();
    if image.is_empty() {
        return Err(ApiError::bad_request("image must not be empty"));
    }
    if let Some(ep) = &req.entrypoint {
        if ep.first().is_none_or(|a| a.is_empty()) {
            return Err(ApiError::bad_request("entrypoint must have at least one non-empty element"));
        }
    }
    if let Some(k) = req.env.iter().flat_map(|e| e.keys()).find(|k| !env_name_ok(k)) {
        return Err(ApiError::bad_request(format!("env: {k:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")));
    }
    let metadata = req.metadata.unwrap_or_default();
    lifecycle::check_metadata(&metadata)?;
    if let Some(l) = &req.resource_limits {
        check_limits(ctx, l)?;
    }
    if let Some(r) = &req.readiness {
        r.probe().map_err(ApiError::bad_request)?;
        r.warmup().map_err(ApiError::bad_request)?;
    }
    let now = chrono::Utc::now();
    Ok(TemplateRecord {
        id: record::new_id(),
        image: image.to_string(),
        publish: req.publish.map(|p| p.trim().to_string()).unwrap_or_default(),
        format: req.format.unwrap_or_default(),
        resource_limits: req.resource_limits,
        entrypoint: req.entrypoint,
        env: req.env,
        metadata,
        readiness: req.readiness,
        phase: Phase::Succeeded,
        message: None,
        created_at: now,
        updated_at: now,
    })
}

/// `POST /v1/templates`: 201 with the template, `Succeeded` (its image is
/// in the pool); 404 `IMAGE_NOT_FOUND` when it is not (and cannot be pulled).
#[utoipa::path(post, path = "/templates", tag = "templates", request_body = CreateTemplateRequest,
    responses((status = 201, description = "the template, ready to create sandboxes from", body = TemplateView)))]
pub async fn create(State(ctx): State<Arc<Ctx>>, body: Bytes) -> ApiResult<Response> {
    let rec = record_of(&ctx, &body)?;
    lifecycle::resolve_image(&ctx, &ImageSpec { uri: rec.image.clone(), auth: None }).await?;
    ctx.catalog.store.insert(rec.clone()).map_err(store_error)?;
    tracing::info!(template = %rec.id, image = %rec.image, "template created");
    warm::top_up(ctx.clone(), rec.id.clone(), std::time::Duration::ZERO);
    let location = format!("/v1/templates/{}", rec.id);
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(view(&rec))).into_response())
}

/// `GET /v1/templates`: newest first; `metadata` filters (`k1=v1&k2=v2`,
/// each part percent-encoded, all must match), paging as the sandbox list.
#[utoipa::path(get, path = "/templates", tag = "templates",
    params(
        ("metadata" = Option<String>, Query, description = "k1=v1&k2=v2, each part percent-encoded"),
        ("page" = Option<u64>, Query, minimum = 1, description = "from 1"),
        ("pageSize" = Option<u64>, Query, minimum = 1, maximum = 200),
    ),
    responses((status = 200, body = ListTemplatesResponse)))]
pub async fn list(State(ctx): State<Arc<Ctx>>, RawQuery(raw): RawQuery) -> ApiResult<Json<ListTemplatesResponse>> {
    let q = Query::parse(raw.as_deref());
    let meta: Vec<(String, String)> =
        q.all("metadata").iter().flat_map(|m| lifecycle::parse_metadata_filter(m)).collect();
    let (page, page_size) = q.paging()?;
    let items: Vec<TemplateRecord> = ctx
        .catalog
        .store
        .list()
        .into_iter()
        .filter(|r| meta.iter().all(|(k, v)| r.metadata.get(k) == Some(v)))
        .collect();
    let (items, pagination) = Pagination::page_of(items, page, page_size, |r| view(&r));
    Ok(Json(ListTemplatesResponse { items, pagination }))
}

/// `GET /v1/templates/{templateId}`.
#[utoipa::path(get, path = "/templates/{templateId}", tag = "templates",
    params(("templateId" = String, Path, description = "template id")),
    responses((status = 200, body = TemplateView)))]
pub async fn get_one(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<Json<TemplateView>> {
    ctx.catalog.store.get(&id).map(|r| Json(view(&r))).ok_or_else(|| not_found(&id))
}

/// `DELETE /v1/templates/{templateId}`: 204; its warm sandboxes end with it,
/// the sandboxes created from it run on.
#[utoipa::path(delete, path = "/templates/{templateId}", tag = "templates",
    params(("templateId" = String, Path, description = "template id")),
    responses((status = 204, description = "deleted")))]
pub async fn delete(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    ctx.catalog.store.remove(&id).map_err(store_error)?.ok_or_else(|| not_found(&id))?;
    // One being started now is ended by its fill, which sees the template gone.
    ctx.catalog.warm.fill_done(&id).await;
    warm::discard(ctx.catalog.warm.remove_template(&id)).await;
    tracing::info!(template = %id, "template deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_shell_variable_names() {
        for ok in ["A", "_x", "PATH_2", "a1"] {
            assert!(env_name_ok(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A=B", "É"] {
            assert!(!env_name_ok(bad), "{bad}");
        }
    }

    #[test]
    fn the_view_omits_what_the_template_does_not_have() {
        let r = TemplateRecord::sample();
        let v = serde_json::to_value(view(&r)).unwrap();
        for key in ["resourceLimits", "entrypoint", "env", "metadata", "readiness"] {
            assert!(v.get(key).is_none(), "{key}: {v}");
        }
        assert_eq!(v["status"], serde_json::json!({"phase": "Succeeded"}));
        assert_eq!(v["format"], "overlaybd");
        assert_eq!(v["templateId"], r.id);
    }
}

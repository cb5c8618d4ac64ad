//! `/v1/isolated/*` (OSEP-0013, SDK 1.1.1's `sandbox.isolation`):
//! namespace-isolated sessions inside a sandbox, served by the sandbox's
//! agent (`pvisor_agent::isolated`). Each route is one agent call:
//!
//! * `GET /capabilities`: whether sessions can be built in this sandbox
//!   (the agent's isolator runs and its probe built one), what is supported;
//! * `POST /session` (201), `GET /sessions`, `GET|DELETE /session/{id}`;
//! * `POST /session/{id}/run`: SSE like `/command` ([`runs`]), or with
//!   `background: true` a 202 run handle; `GET .../runs/{rid}[/logs]`;
//! * `/session/{id}/files/...` and `/directories...`: the file routes, run
//!   inside the session's root as its identity (the agent reads the
//!   session from the call's metadata, [`super::identity::FileScope`]);
//! * `GET .../diff`, `POST .../commit`: 501 (not supported; capabilities say so).
//!
//! Errors: an unknown session 404 `SESSION_NOT_FOUND`, an unknown run 404
//! `RUN_NOT_FOUND`, a session whose processes were killed 409
//! `SESSION_NOT_ACTIVE`, no isolation in this sandbox 503
//! `ISOLATION_UNAVAILABLE` (the agent's `ErrorDetail`, mapped in
//! [`crate::api::error`]), bad options 400.
pub mod runs;
pub mod spec;

use super::command::rfc3339_ms;
use super::identity::FileScope;
use super::{agent, Sandbox};
use crate::api::error::{parse_json, ApiError, ApiResult};
use axum::body::Bytes;
use axum::extract::{Path, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use pvisor_proto::agent::{Empty, IsolatedSession, IsolatedSessionRef};
use serde_json::{json, Value};
use std::collections::HashMap;

/// The session id of a route (`{sid}`).
pub(crate) fn sid(p: &HashMap<String, String>) -> String {
    p.get("sid").cloned().unwrap_or_default()
}

async fn capabilities(Extension(sb): Sandbox) -> ApiResult<Json<Value>> {
    let c = agent(&sb)?.isolation_capabilities(Empty {}).await?.into_inner();
    let mut v = json!({
        "available": c.available,
        "isolator": "pvisor",
        "version": c.version,
        "setpriv_available": c.setpriv,
        "userns_available": c.userns,
        "commit_supported": false,
        "diff_supported": false,
        // OSEP-0018: what holds every process of the sandbox, sessions included.
        "hardening": {
            "init_mode": "pid1",
            "signal_shield": true,
            "cap_drop": {"state": "active"},
            "seccomp": {"state": "active"},
            "landlock": {"state": "disabled", "message": "pvisor confines sandboxes with namespaces, capabilities and seccomp, not Landlock"},
            "ebpf": {"state": "disabled", "message": "pvisor does not observe sandboxes with eBPF"},
        },
    });
    if !c.message.is_empty() {
        v["message"] = Value::String(c.message);
    }
    Ok(Json(v))
}

/// The session's state (`SessionState`): status, times, echoed parameters.
fn state_json(s: &IsolatedSession) -> Value {
    let mut v = json!({
        "status": if s.active { "active" } else { "dead" },
        "created_at": rfc3339_ms(s.created_at_ms),
        "last_run_at": rfc3339_ms(s.last_run_at_ms),
    });
    if let Some(r) = s.idle_remaining_seconds {
        v["idle_remaining_seconds"] = json!(r);
    }
    if let (Some(spec), Value::Object(m)) = (&s.spec, &mut v) {
        m.extend(spec::echo(spec, s.uid, s.gid));
    }
    v
}

async fn create(Extension(sb): Sandbox, body: Bytes) -> ApiResult<Response> {
    let spec = spec::resolve(parse_json(&body)?)?;
    let s = agent(&sb)?.create_isolated_session(spec).await?.into_inner();
    let mut v = json!({"session_id": s.id, "created_at": rfc3339_ms(s.created_at_ms)});
    if let (Some(spec), Value::Object(m)) = (&s.spec, &mut v) {
        m.extend(spec::echo(spec, s.uid, s.gid));
    }
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

async fn get_session(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<Json<Value>> {
    let s = agent(&sb)?.get_isolated_session(IsolatedSessionRef { id: sid(&p) }).await?.into_inner();
    Ok(Json(state_json(&s)))
}

async fn list(Extension(sb): Sandbox) -> ApiResult<Json<Value>> {
    let l = agent(&sb)?.list_isolated_sessions(Empty {}).await?.into_inner();
    let sessions: Vec<Value> = l
        .sessions
        .iter()
        .map(|s| {
            let mut v = json!({
                "session_id": s.id,
                "status": if s.active { "active" } else { "dead" },
                "created_at": rfc3339_ms(s.created_at_ms),
                "last_run_at": rfc3339_ms(s.last_run_at_ms),
            });
            if let Some(r) = s.idle_remaining_seconds {
                v["idle_remaining_seconds"] = json!(r);
            }
            v
        })
        .collect();
    Ok(Json(json!({ "sessions": sessions })))
}

async fn delete(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<StatusCode> {
    agent(&sb)?.delete_isolated_session(IsolatedSessionRef { id: sid(&p) }).await?;
    Ok(StatusCode::OK)
}

async fn not_supported() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "NOT_SUPPORTED",
        "diff and commit of an isolated session's uppers are not supported by this server (see /v1/isolated/capabilities)",
    )
}

/// Tags the file routes' calls with the session (`/session/{sid}/files/...`).
async fn in_session(Path(p): Path<HashMap<String, String>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(FileScope::Isolated(sid(&p)));
    next.run(req).await
}

/// The routes, with the file routes (`files`) nested under each session.
pub fn routes(files: Router) -> Router {
    let session = "/v1/isolated/session/{sid}";
    Router::new()
        .route("/v1/isolated/capabilities", get(capabilities))
        .route("/v1/isolated/session", post(create))
        .route("/v1/isolated/sessions", get(list))
        .route(session, get(get_session).delete(delete))
        .route(&format!("{session}/run"), post(runs::run))
        .route(&format!("{session}/runs/{{rid}}"), get(runs::status))
        .route(&format!("{session}/runs/{{rid}}/logs"), get(runs::logs))
        .route(&format!("{session}/diff"), get(not_supported))
        .route(&format!("{session}/commit"), post(not_supported))
        .nest(session, files.layer(axum::middleware::from_fn(in_session)))
}

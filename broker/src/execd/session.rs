//! `/session`: long-lived shells whose state persists between runs.
//!
//! Path parameters come as a map: the dispatcher's own parameters (`id`,
//! `port`, `rest`) are still on the request.
use super::{agent, sse, Sandbox};
use crate::api::error::{parse_json, ApiError, ApiResult};
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use pvisor_proto::agent::{CreateSessionRequest, SessionRef, SessionRunRequest};
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Debug, Default, Deserialize)]
struct CreateBody {
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RunBody {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
}

pub async fn create(Extension(sb): Sandbox, body: Bytes) -> ApiResult<Json<serde_json::Value>> {
    let b: CreateBody =
        if body.iter().all(u8::is_ascii_whitespace) { CreateBody::default() } else { parse_json(&body)? };
    let r = agent(&sb)?.create_session(CreateSessionRequest { cwd: b.cwd.unwrap_or_default() }).await?.into_inner();
    Ok(Json(serde_json::json!({"session_id": r.id})))
}

pub async fn run(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>, body: Bytes) -> ApiResult<Response> {
    let sid = p.get("sid").cloned().unwrap_or_default();
    let b: RunBody = parse_json(&body)?;
    if b.command.trim().is_empty() {
        return Err(ApiError::bad_request("command is required"));
    }
    let req = SessionRunRequest {
        session_id: sid,
        command: b.command,
        cwd: b.cwd.unwrap_or_default(),
        timeout_ms: b.timeout.unwrap_or(0),
    };
    let stream = agent(&sb)?.run_in_session(req).await?.into_inner();
    Ok(sse::response(sse::exec_stream(stream, false)))
}

pub async fn delete(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<StatusCode> {
    let sid = p.get("sid").cloned().unwrap_or_default();
    agent(&sb)?.delete_session(SessionRef { id: sid }).await?;
    Ok(StatusCode::OK)
}

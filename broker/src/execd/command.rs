//! `/command`: run (SSE), status, logs, interrupt.
use super::{agent, sse, Sandbox};
use crate::api::error::{parse_json, ApiError, ApiResult};
use crate::api::query::Query;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use chrono::{TimeZone, Utc};
use pvisor_proto::agent::{CommandRef, ExecRequest, LogsRequest};
use serde::Deserialize;
use std::collections::HashMap;

/// execd's `RunCommandRequest` (snake_case).
#[derive(Debug, Deserialize)]
pub struct RunCommandRequest {
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub background: Option<bool>,
    /// Milliseconds.
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    #[serde(default)]
    pub envs: Option<HashMap<String, String>>,
}

pub async fn run(Extension(sb): Sandbox, body: Bytes) -> ApiResult<Response> {
    let r: RunCommandRequest = parse_json(&body)?;
    let command = r.command.unwrap_or_default();
    let argv = r.argv.unwrap_or_default();
    if command.trim().is_empty() && argv.is_empty() {
        return Err(ApiError::bad_request("command or argv is required"));
    }
    if r.gid.is_some() && r.uid.is_none() {
        return Err(ApiError::bad_request("gid requires uid"));
    }
    let timeout_ms = match r.timeout {
        None => 0,
        Some(t) if t >= 0 => t as u64,
        Some(t) => return Err(ApiError::bad_request(format!("timeout must not be negative, got {t}"))),
    };
    let background = r.background.unwrap_or(false);
    let req = ExecRequest {
        command,
        argv,
        cwd: r.cwd.unwrap_or_default(),
        envs: r.envs.unwrap_or_default(),
        uid: r.uid,
        gid: r.gid,
        timeout_ms,
        background,
    };
    let stream = agent(&sb)?.exec(req).await?.into_inner();
    crate::metrics::events().command_started(&sb.id);
    Ok(sse::response(sse::exec_stream(stream, background)))
}

pub(crate) fn rfc3339_ms(ms: i64) -> Option<String> {
    Utc.timestamp_millis_opt(ms).single().map(|t| crate::sandbox::record::rfc3339(&t))
}

pub async fn status(
    Extension(sb): Sandbox,
    Path(p): Path<HashMap<String, String>>,
) -> ApiResult<Json<serde_json::Value>> {
    let id = p.get("cid").cloned().unwrap_or_default();
    let s = agent(&sb)?.command_status(CommandRef { id }).await.map_err(command_not_found)?.into_inner();
    let mut v = serde_json::json!({
        "id": s.id,
        "content": s.content,
        "running": s.running,
        "exit_code": s.exit_code,
        "started_at": rfc3339_ms(s.started_at_ms),
        "finished_at": s.finished_at_ms.and_then(rfc3339_ms),
    });
    if !s.error.is_empty() {
        v["error"] = serde_json::Value::String(s.error);
    }
    Ok(Json(v))
}

fn command_not_found(s: tonic::Status) -> ApiError {
    if s.code() == tonic::Code::NotFound {
        ApiError::new(StatusCode::NOT_FOUND, "COMMAND_NOT_FOUND", s.message().to_string())
    } else {
        s.into()
    }
}

pub async fn logs(
    Extension(sb): Sandbox,
    Path(p): Path<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let id = p.get("cid").cloned().unwrap_or_default();
    let cursor: u64 = Query::parse(raw.as_deref()).number("cursor")?.unwrap_or(0);
    let r = agent(&sb)?.command_logs(LogsRequest { id, cursor }).await.map_err(command_not_found)?.into_inner();
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
            (header::HeaderName::from_static("execd-commands-tail-cursor"), r.cursor.to_string()),
        ],
        r.text,
    )
        .into_response())
}

pub async fn interrupt(Extension(sb): Sandbox, RawQuery(raw): RawQuery) -> ApiResult<StatusCode> {
    let id = Query::parse(raw.as_deref()).required("id")?.to_string();
    agent(&sb)?.interrupt(CommandRef { id }).await.map_err(command_not_found)?;
    Ok(StatusCode::OK)
}

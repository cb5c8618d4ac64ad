//! Runs in an isolated session: `POST .../run` streams a foreground run as
//! SSE (the `/command` frames: `init`, `stdout`/`stderr` per line,
//! `execution_complete`, or `error` with the exit code as `evalue`), or
//! with `background: true` answers 202 with a run handle; `GET .../runs/{rid}`
//! is its status, `GET .../runs/{rid}/logs?cursor=N` its output from byte N
//! (next cursor in `EXECD-ISOLATED-TAIL-CURSOR`).
use super::super::command::rfc3339_ms;
use super::super::{agent, sse, Sandbox};
use super::sid;
use crate::api::error::{parse_json, ApiError, ApiResult};
use crate::api::query::Query;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use pvisor_proto::agent::{IsolatedRun, IsolatedRunLogsRequest, IsolatedRunRef, IsolatedRunRequest};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The header carrying the next cursor of a logs read.
pub const TAIL_CURSOR: &str = "execd-isolated-tail-cursor";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    code: String,
    #[serde(default)]
    envs: Option<HashMap<String, String>>,
    #[serde(default)]
    timeout_seconds: Option<i64>,
    #[serde(default)]
    background: Option<bool>,
}

fn run_json(r: &IsolatedRun) -> Value {
    let mut v = json!({
        "session_id": r.session_id,
        "run_id": r.run_id,
        "running": r.running,
        "started_at": rfc3339_ms(r.started_at_ms),
    });
    if let Some(c) = r.exit_code {
        v["exit_code"] = json!(c);
    }
    if !r.error.is_empty() {
        v["error"] = json!(r.error);
    }
    if let Some(f) = r.finished_at_ms.and_then(rfc3339_ms) {
        v["finished_at"] = json!(f);
    }
    v
}

pub async fn run(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>, body: Bytes) -> ApiResult<Response> {
    let b: RunBody = parse_json(&body)?;
    if b.code.trim().is_empty() {
        return Err(ApiError::bad_request("code is required"));
    }
    let background = b.background.unwrap_or(false);
    // Foreground only (the spec: a background run is not time-limited).
    let timeout_ms = match b.timeout_seconds {
        Some(t) if t < 0 => return Err(ApiError::bad_request(format!("timeout_seconds must be 0 or more, got {t}"))),
        Some(t) if !background => (t as u64).saturating_mul(1000),
        _ => 0,
    };
    let req = IsolatedRunRequest {
        session_id: sid(&p),
        code: b.code,
        envs: b.envs.unwrap_or_default().into_iter().collect(),
        timeout_ms,
    };
    let mut client = agent(&sb)?;
    if background {
        let r = client.start_isolated_run(req).await?.into_inner();
        let v = json!({"session_id": r.session_id, "run_id": r.run_id, "started_at": rfc3339_ms(r.started_at_ms)});
        return Ok((StatusCode::ACCEPTED, Json(v)).into_response());
    }
    // An unknown or dead session, or a bad variable name, is an HTTP error:
    // the agent refuses those before the stream's first event.
    let mut events = client.run_isolated(req).await?.into_inner();
    let first = events.message().await?;
    Ok(sse::response(sse::exec_stream_after(first, events)))
}

pub async fn status(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<Json<Value>> {
    let rid = p.get("rid").cloned().unwrap_or_default();
    let r = agent(&sb)?.get_isolated_run(IsolatedRunRef { session_id: sid(&p), run_id: rid }).await?.into_inner();
    Ok(Json(run_json(&r)))
}

pub async fn logs(
    Extension(sb): Sandbox,
    Path(p): Path<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let rid = p.get("rid").cloned().unwrap_or_default();
    let cursor: u64 = Query::parse(raw.as_deref()).number("cursor")?.unwrap_or(0);
    let req = IsolatedRunLogsRequest { session_id: sid(&p), run_id: rid, cursor };
    let r = agent(&sb)?.isolated_run_logs(req).await?.into_inner();
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()),
            (header::HeaderName::from_static(TAIL_CURSOR), r.cursor.to_string()),
        ],
        r.data,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_json_leaves_out_what_is_not_there() {
        let r = IsolatedRun {
            session_id: "s".into(),
            run_id: "r".into(),
            running: true,
            started_at_ms: 1_700_000_000_000,
            ..Default::default()
        };
        let v = run_json(&r);
        assert_eq!(v["running"], json!(true));
        assert!(v.get("exit_code").is_none() && v.get("finished_at").is_none() && v.get("error").is_none());
        let done = IsolatedRun { running: false, exit_code: Some(3), finished_at_ms: Some(1_700_000_001_000), ..r };
        let v = run_json(&done);
        assert_eq!((v["exit_code"].clone(), v["finished_at"].clone()), (json!(3), json!("2023-11-14T22:13:21.000Z")));
    }

    #[test]
    fn run_bodies() {
        let b: RunBody =
            parse_json(br#"{"code":"ls","envs":{"A":"1"},"timeout_seconds":5,"background":false}"#).unwrap();
        assert_eq!((b.code.as_str(), b.timeout_seconds, b.background), ("ls", Some(5), Some(false)));
        assert!(parse_json::<RunBody>(br#"{"envs":{}}"#).is_err(), "code is required");
        assert!(parse_json::<RunBody>(br#"{"code":"x","cwd":"/"}"#).is_err(), "unknown fields are refused");
    }
}

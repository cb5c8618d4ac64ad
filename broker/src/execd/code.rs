//! `/code`: the code interpreter (contexts, runs as SSE, interrupt), as the
//! official `opensandbox-code-interpreter` SDK calls it.
//!
//! Every route is one agent RPC (`CreateContext` … `InterruptCode`); the
//! agent owns the contexts and their interpreter processes. A run's events
//! become SSE frames in [`super::code_stream`]. The agent's gRPC errors map
//! onto the reference's vocabulary: `INVALID_ARGUMENT` (an unknown language,
//! or one whose interpreter the image lacks) is 400 `INVALID_REQUEST_BODY`
//! and `NOT_FOUND` is 404 `CONTEXT_NOT_FOUND`; a run answers them before its
//! stream starts.
use super::{agent, code_stream, sse, Sandbox};
use crate::api::error::{parse_json, ApiError, ApiResult};
use crate::api::query::Query;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use pvisor_proto::agent::{CodeContext, ContextRef, CreateContextRequest, ListContextsRequest, RunCodeRequest};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

/// `CodeContextRequest`: `{"language"?, "cwd"?}`.
#[derive(Debug, Default, Deserialize)]
struct CreateBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `RunCodeRequest`: `{"code", "context"?: {"language", "id"?}}`.
#[derive(Debug, Deserialize)]
struct RunBody {
    code: String,
    #[serde(default)]
    context: Option<ContextBody>,
    /// Accepted beside `context` (older clients send it at the top level).
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    envs: Option<HashMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct ContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

/// The agent's status in the code interpreter's error vocabulary.
pub fn code_error(s: tonic::Status) -> ApiError {
    match s.code() {
        tonic::Code::InvalidArgument => {
            ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", s.message().to_string())
        }
        tonic::Code::NotFound => ApiError::new(StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND", s.message().to_string()),
        _ => s.into(),
    }
}

fn context_json(c: &CodeContext) -> Value {
    json!({"id": c.id, "language": c.language})
}

fn path_id(p: &HashMap<String, String>) -> String {
    p.get("cid").cloned().unwrap_or_default()
}

/// The `language` query parameter, required and non-empty.
fn language_query(raw: Option<&str>) -> ApiResult<String> {
    match Query::parse(raw).one("language").map(str::trim) {
        Some(l) if !l.is_empty() => Ok(l.to_string()),
        _ => Err(ApiError::new(StatusCode::BAD_REQUEST, "MISSING_QUERY", "query parameter \"language\" is required")),
    }
}

pub async fn create_context(Extension(sb): Sandbox, body: Bytes) -> ApiResult<Json<Value>> {
    let b: CreateBody =
        if body.iter().all(u8::is_ascii_whitespace) { CreateBody::default() } else { parse_json(&body)? };
    let req = CreateContextRequest { language: b.language.unwrap_or_default(), cwd: b.cwd.unwrap_or_default() };
    let c = agent(&sb)?.create_context(req).await.map_err(code_error)?.into_inner();
    Ok(Json(context_json(&c)))
}

pub async fn get_context(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<Json<Value>> {
    let c = agent(&sb)?.get_context(ContextRef { id: path_id(&p) }).await.map_err(code_error)?.into_inner();
    Ok(Json(context_json(&c)))
}

/// Every context of `?language=` (all languages without it).
pub async fn list_contexts(Extension(sb): Sandbox, RawQuery(raw): RawQuery) -> ApiResult<Json<Value>> {
    let language = Query::parse(raw.as_deref()).one("language").unwrap_or("").trim().to_string();
    let l = agent(&sb)?.list_contexts(ListContextsRequest { language }).await.map_err(code_error)?.into_inner();
    Ok(Json(Value::Array(l.contexts.iter().map(context_json).collect())))
}

pub async fn delete_context(Extension(sb): Sandbox, Path(p): Path<HashMap<String, String>>) -> ApiResult<StatusCode> {
    agent(&sb)?.delete_context(ContextRef { id: path_id(&p) }).await.map_err(code_error)?;
    Ok(StatusCode::OK)
}

pub async fn delete_contexts(Extension(sb): Sandbox, RawQuery(raw): RawQuery) -> ApiResult<StatusCode> {
    let language = language_query(raw.as_deref())?;
    agent(&sb)?.delete_contexts(ListContextsRequest { language }).await.map_err(code_error)?;
    Ok(StatusCode::OK)
}

/// Runs a cell: waits for the agent's first event (so a bad language or
/// context is an HTTP error, not a stream), then streams.
pub async fn run(Extension(sb): Sandbox, body: Bytes) -> ApiResult<Response> {
    let b: RunBody = parse_json(&body)?;
    if b.code.trim().is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", "code is required"));
    }
    let ctx = b.context.unwrap_or_default();
    let req = RunCodeRequest {
        code: b.code,
        context_id: ctx.id.unwrap_or_default(),
        language: ctx.language.or(b.language).unwrap_or_default(),
        envs: b.envs.unwrap_or_default(),
    };
    let mut events = agent(&sb)?.run_code(req).await.map_err(code_error)?.into_inner();
    let first = events.message().await.map_err(code_error)?;
    Ok(sse::response(code_stream::frames(first, events)))
}

/// `DELETE /code?id=<context id>`: interrupts the cell running there.
pub async fn interrupt(Extension(sb): Sandbox, RawQuery(raw): RawQuery) -> ApiResult<StatusCode> {
    let id = match Query::parse(raw.as_deref()).one("id").map(str::trim) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => return Err(ApiError::new(StatusCode::BAD_REQUEST, "MISSING_QUERY", "query parameter \"id\" is required")),
    };
    agent(&sb)?.interrupt_code(ContextRef { id }).await.map_err(code_error)?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_errors_map_to_the_code_vocabulary() {
        let e = code_error(tonic::Status::invalid_argument("node is not installed"));
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY"));
        assert_eq!(e.message, "node is not installed");
        let e = code_error(tonic::Status::not_found("no context x"));
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND"));
        let e = code_error(tonic::Status::unavailable("gone"));
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn language_query_is_required() {
        assert_eq!(language_query(Some("language=python")).ok().as_deref(), Some("python"));
        for raw in [None, Some(""), Some("language="), Some("language=%20"), Some("lang=python")] {
            let e = language_query(raw).expect_err("must be rejected");
            assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "MISSING_QUERY"), "{raw:?}");
        }
    }

    #[test]
    fn run_body_takes_the_context_or_a_top_level_language() {
        let b: RunBody = parse_json(br#"{"code":"1","context":{"language":"bash","id":"c1"}}"#).expect("parses");
        let c = b.context.expect("context");
        assert_eq!((c.language.as_deref(), c.id.as_deref()), (Some("bash"), Some("c1")));
        let b: RunBody = parse_json(br#"{"code":"1","language":"python"}"#).expect("parses");
        assert!(b.context.is_none());
        assert_eq!(b.language.as_deref(), Some("python"));
        assert!(parse_json::<RunBody>(br#"{"context":{}}"#).is_err(), "code is required");
    }
}

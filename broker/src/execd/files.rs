//! `/files` and `/directories`.
use super::fileinfo::to_json;
use super::identity::{request, Who};
use super::upload_parts::{self, Perms};
use super::{agent, Sandbox};
use crate::api::error::{parse_json, ApiError, ApiResult};
use crate::api::query::Query;
use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, RawQuery};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use pvisor_proto::agent::*;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use tokio_stream::wrappers::ReceiverStream;

fn entry(path: String, p: Perms) -> ApiResult<PermissionEntry> {
    upload_parts::entry(path, p).map_err(ApiError::bad_request)
}

fn perms_map(body: &Bytes) -> ApiResult<Vec<PermissionEntry>> {
    let m: BTreeMap<String, Perms> = parse_json(body)?;
    if m.is_empty() {
        return Err(ApiError::bad_request("no paths given"));
    }
    m.into_iter().map(|(path, p)| entry(path, p)).collect()
}

fn paths(raw: &Option<String>) -> ApiResult<Vec<String>> {
    let p = Query::parse(raw.as_deref()).all("path");
    if p.is_empty() {
        return Err(ApiError::bad_request("query parameter \"path\" is required"));
    }
    Ok(p)
}

fn file_list(files: &[FileInfo]) -> Json<Value> {
    Json(Value::Array(files.iter().map(to_json).collect()))
}

pub async fn info(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery) -> ApiResult<Json<Value>> {
    let asked = paths(&raw)?;
    let files = agent(&sb)?.stat(request(PathsRequest { paths: asked.clone() }, &who)).await?.into_inner().files;
    // Keyed by the path as asked (the agent answers in order, normalized).
    let mut out = Map::new();
    for (p, f) in asked.iter().zip(&files) {
        out.insert(p.clone(), to_json(f));
    }
    Ok(Json(Value::Object(out)))
}

/// Cancels the agent call if the handler is dropped mid-upload (the client
/// went away): the agent then discards the partial file instead of
/// committing it as if the stream had ended normally.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::ops::Deref for AbortOnDrop<T> {
    type Target = tokio::task::JoinHandle<T>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<T> std::ops::DerefMut for AbortOnDrop<T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// Multipart upload: `metadata` and `file` parts in pairs, streamed to the
/// agent. If the body breaks off, the agent call is cancelled and the agent
/// discards the partial file (the target keeps its old content).
pub async fn upload(
    Extension(sb): Sandbox,
    who: Who,
    mp: Result<Multipart, MultipartRejection>,
) -> ApiResult<StatusCode> {
    let mut mp = mp.map_err(|e| ApiError::bad_request(format!("invalid multipart body: {e}")))?;
    let mut client = agent(&sb)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<UploadChunk>(8);
    let mut call =
        AbortOnDrop(tokio::spawn(async move { client.upload(request(ReceiverStream::new(rx), &who)).await }));
    let fed = upload_parts::feed(&mut mp, |c| {
        let tx = tx.clone();
        async move { tx.send(c).await.is_ok() }
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code(), e.to_string()));
    match fed {
        Err(e) => {
            call.0.abort();
            Err(e)
        }
        Ok(_) => {
            drop(tx);
            match (&mut *call).await {
                Ok(Ok(_)) => Ok(StatusCode::OK),
                Ok(Err(s)) => Err(s.into()),
                Err(e) => Err(ApiError::internal(e.to_string())),
            }
        }
    }
}

pub async fn remove(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery) -> ApiResult<StatusCode> {
    agent(&sb)?.remove_files(request(PathsRequest { paths: paths(&raw)? }, &who)).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
struct Mv {
    src: String,
    dest: String,
}

pub async fn rename(Extension(sb): Sandbox, who: Who, body: Bytes) -> ApiResult<StatusCode> {
    let moves: Vec<Mv> = parse_json(&body)?;
    let moves = moves.into_iter().map(|m| MovePair { src: m.src, dest: m.dest }).collect();
    agent(&sb)?.r#move(request(MoveRequest { moves }, &who)).await?;
    Ok(StatusCode::OK)
}

pub async fn permissions(Extension(sb): Sandbox, who: Who, body: Bytes) -> ApiResult<StatusCode> {
    agent(&sb)?.set_permissions(request(PermissionsRequest { entries: perms_map(&body)? }, &who)).await?;
    Ok(StatusCode::OK)
}

pub async fn search(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery) -> ApiResult<Json<Value>> {
    let q = Query::parse(raw.as_deref());
    let req =
        SearchRequest { path: q.required("path")?.to_string(), pattern: q.one("pattern").unwrap_or("").to_string() };
    Ok(file_list(&agent(&sb)?.search(request(req, &who)).await?.into_inner().files))
}

#[derive(Debug, Deserialize)]
struct Repl {
    old: String,
    new: String,
}

pub async fn replace(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery, body: Bytes) -> ApiResult<Response> {
    // An isolated session's route always answers with the counts: the SDK's isolated
    // files facade sends no `verbose` and reads the per-file map.
    let isolated = matches!(who, Some(Extension(super::identity::FileScope::Isolated(_))));
    let verbose = isolated || Query::parse(raw.as_deref()).flag("verbose");
    let m: BTreeMap<String, Repl> = parse_json(&body)?;
    let entries = m.into_iter().map(|(path, r)| ReplaceEntry { path, old: r.old, new: r.new }).collect();
    let counts = agent(&sb)?.replace(request(ReplaceRequest { entries }, &who)).await?.into_inner().counts;
    if !verbose {
        return Ok(StatusCode::OK.into_response());
    }
    let mut out = Map::new();
    for c in counts {
        out.insert(c.path, serde_json::json!({"replacedCount": c.replaced}));
    }
    Ok(Json(Value::Object(out)).into_response())
}

pub async fn list_dir(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery) -> ApiResult<Json<Value>> {
    let q = Query::parse(raw.as_deref());
    let req = ListDirRequest { path: q.required("path")?.to_string(), depth: q.number("depth")?.unwrap_or(1) };
    Ok(file_list(&agent(&sb)?.list_dir(request(req, &who)).await?.into_inner().files))
}

pub async fn make_dirs(Extension(sb): Sandbox, who: Who, body: Bytes) -> ApiResult<StatusCode> {
    agent(&sb)?.make_dirs(request(PermissionsRequest { entries: perms_map(&body)? }, &who)).await?;
    Ok(StatusCode::OK)
}

pub async fn remove_dirs(Extension(sb): Sandbox, who: Who, RawQuery(raw): RawQuery) -> ApiResult<StatusCode> {
    agent(&sb)?.remove_dirs(request(PathsRequest { paths: paths(&raw)? }, &who)).await?;
    Ok(StatusCode::OK)
}

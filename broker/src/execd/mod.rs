//! The execd data plane, served natively by the broker.
//!
//! `/sandboxes/{id}/proxy/{port}/...` (direct) and the same under `/v1`
//! (server proxy) land in [`dispatch`]: it checks the sandbox's data-plane
//! token, then serves port 44772 with the execd API below, port 18080 with
//! the egress policy API (the broker's own, [`crate::api::egress`]), and
//! tunnels any other port to `127.0.0.1:port` inside the sandbox ([`proxy`]).
pub mod code;
pub mod code_stream;
pub mod command;
pub mod download;
pub mod fileinfo;
pub mod files;
pub mod identity;
pub mod isolated;
pub mod metrics;
pub mod mode;
pub mod proxy;
pub mod session;
pub mod signed;
pub mod sse;
pub mod upload_parts;

use crate::api::auth::constant_time_eq;
use crate::api::egress::{self, EGRESS_AUTH_HEADER, EGRESS_PORT};
use crate::api::error::{ApiError, ApiResult};
use crate::api::lifecycle::{EXECD_PORT, TOKEN_HEADER};
use crate::sandbox::SandboxEntry;
use crate::server::Ctx;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Extension, Router};
use pvisor_proto::agent::agent_client::AgentClient;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::transport::Channel;
use tower::ServiceExt;

pub type Sandbox = Extension<Arc<SandboxEntry>>;

/// A gRPC client to the sandbox's agent (through its worker).
pub fn agent(sb: &SandboxEntry) -> ApiResult<AgentClient<Channel>> {
    Ok(AgentClient::new(sb.running_channel()?).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such execd route")
}

async fn not_supported() -> ApiError {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED", "PTYs are not supported by this server")
}

async fn ping(Extension(sb): Sandbox) -> ApiResult<StatusCode> {
    agent(&sb)?.ping(pvisor_proto::agent::Empty {}).await?;
    Ok(StatusCode::OK)
}

/// `/files` and `/directories`, served as the agent or (under
/// `/v1/filesystem/{uid}/{gid}`, [`identity`]) as another user.
fn file_routes() -> Router {
    Router::new()
        .route("/files/info", get(files::info))
        .route("/files/upload", post(files::upload).layer(axum::extract::DefaultBodyLimit::disable()))
        .route("/files/download", get(download::download))
        .route("/files", delete(files::remove))
        .route("/files/mv", post(files::rename))
        .route("/files/permissions", post(files::permissions))
        .route("/files/search", get(files::search))
        .route("/files/replace", post(files::replace))
        .route("/directories/list", get(files::list_dir))
        .route("/directories", post(files::make_dirs).delete(files::remove_dirs))
}

/// The execd API of one sandbox (the sandbox arrives as an extension).
fn execd_router() -> Router {
    Router::new()
        .route("/ping", get(ping))
        .route("/command", post(command::run).delete(command::interrupt))
        .route("/command/status/{cid}", get(command::status))
        .route("/command/{cid}/logs", get(command::logs))
        .route("/session", post(session::create))
        .route("/session/{sid}/run", post(session::run))
        .route("/session/{sid}", delete(session::delete))
        .merge(file_routes())
        .merge(identity::routes(file_routes()))
        .merge(isolated::routes(file_routes()))
        .route("/metrics", get(metrics::get))
        .route("/metrics/watch", get(metrics::watch))
        .route("/code", post(code::run).delete(code::interrupt))
        .route("/code/context", post(code::create_context))
        .route("/code/contexts", get(code::list_contexts).delete(code::delete_contexts))
        .route("/code/contexts/{cid}", get(code::get_context).delete(code::delete_context))
        .route("/pty", any(not_supported))
        .route("/pty/{*rest}", any(not_supported))
        .fallback(not_found)
}

/// Routes `/sandboxes/{id}/proxy/{port}[/...]` to [`dispatch`].
pub fn dispatch_router() -> Router<Arc<Ctx>> {
    let inner = execd_router();
    let handler = move |State(ctx): State<Arc<Ctx>>, Path(p): Path<HashMap<String, String>>, req: Request| {
        let inner = inner.clone();
        async move { dispatch(ctx, inner, p, req).await }
    };
    Router::new()
        .route("/sandboxes/{id}/proxy/{port}", any(handler.clone()))
        // The port's root as a browser asks for it (the catch-all needs one character at least).
        .route("/sandboxes/{id}/proxy/{port}/", any(handler.clone()))
        .route("/sandboxes/{id}/proxy/{port}/{*rest}", any(handler))
}

/// The data-plane token; on the egress port also under the sidecar's name.
pub(crate) fn check_token(sb: &SandboxEntry, req: &Request, egress: bool) -> ApiResult<()> {
    let token = req.headers().get(TOKEN_HEADER);
    let token = if egress { token.or_else(|| req.headers().get(EGRESS_AUTH_HEADER)) } else { token };
    match token {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "MISSING_ACCESS_TOKEN",
            format!("missing {TOKEN_HEADER} header"),
        )),
        Some(v) if !constant_time_eq(v.as_bytes(), sb.token.as_bytes()) => {
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_ACCESS_TOKEN", "invalid data-plane access token"))
        }
        Some(_) => Ok(()),
    }
}

async fn dispatch(ctx: Arc<Ctx>, inner: Router, p: HashMap<String, String>, req: Request) -> Response {
    let id = p.get("id").cloned().unwrap_or_default();
    let Some(sb) = ctx.registry.get(&id) else {
        return ApiError::sandbox_not_found(&id).into_response();
    };
    let port = p.get("port").and_then(|s| s.parse::<u16>().ok()).filter(|p| *p > 0);
    if let Err(e) = check_token(&sb, &req, port == Some(EGRESS_PORT)) {
        return e.into_response();
    }
    let Some(port) = port else {
        return ApiError::bad_request("invalid port").into_response();
    };
    let rest = p.get("rest").cloned().unwrap_or_default();
    serve(&ctx, inner, sb, port, &rest, req).await
}

/// Serves an authorized request for `port` of `sb`, `rest` the path after
/// the route's prefix.
async fn serve(ctx: &Ctx, inner: Router, sb: Arc<SandboxEntry>, port: u16, rest: &str, mut req: Request) -> Response {
    if port == EGRESS_PORT {
        return egress::sidecar(sb, rest, req).await;
    }
    if port != EXECD_PORT {
        return proxy::forward(sb, port, rest, req).await;
    }
    let pq = match req.uri().query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    match pq.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return ApiError::bad_request("invalid request path").into_response(),
    }
    req.extensions_mut().insert(sb);
    req.extensions_mut().insert(metrics::MemoryMerge(ctx.memory_merge.is_some()));
    match inner.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

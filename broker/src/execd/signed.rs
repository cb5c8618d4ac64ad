//! The data plane through a signed endpoint (OSEP-0011, see
//! [`crate::api::signing`]): `/sandboxes/{id}/signed/{port}/{expires_b36}/{signature}[/rest]`
//! serves `rest` of `port` as `/sandboxes/{id}/proxy/{port}/rest` does, the
//! route being the credential instead of the data-plane token.
//!
//! As OSEP-0011 has it for its access header: a request that carries the
//! token is judged by the token alone (a wrong one is a 401, with no fall
//! back to the signature); one without is judged by the signature.
use super::{check_token, execd_router, serve};
use crate::api::egress::{EGRESS_AUTH_HEADER, EGRESS_PORT};
use crate::api::error::ApiError;
use crate::api::lifecycle::TOKEN_HEADER;
use crate::api::signing::SignError;
use crate::server::Ctx;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use std::collections::HashMap;
use std::sync::Arc;

/// Routes the signed prefix, with and without a rest, to [`handle`].
pub fn router() -> Router<Arc<Ctx>> {
    let inner = execd_router();
    let handler = move |State(ctx): State<Arc<Ctx>>, Path(p): Path<HashMap<String, String>>, req: Request| {
        let inner = inner.clone();
        async move { handle(ctx, inner, p, req).await }
    };
    Router::new()
        .route("/sandboxes/{id}/signed/{port}/{exp}/{sig}", any(handler.clone()))
        // The root of the port, as a browser asks for it (an empty catch-all does not match).
        .route("/sandboxes/{id}/signed/{port}/{exp}/{sig}/", any(handler.clone()))
        .route("/sandboxes/{id}/signed/{port}/{exp}/{sig}/{*rest}", any(handler))
}

fn refusal(e: SignError) -> ApiError {
    match e {
        SignError::Malformed(m) => ApiError::bad_request(m),
        SignError::BadSignature => {
            ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_SIGNATURE", "not a valid signed endpoint")
        }
        SignError::Expired => {
            ApiError::new(StatusCode::UNAUTHORIZED, "SIGNATURE_EXPIRED", "the signed endpoint expired")
        }
    }
}

async fn handle(ctx: Arc<Ctx>, inner: Router, p: HashMap<String, String>, req: Request) -> Response {
    let get = |k: &str| p.get(k).map(String::as_str).unwrap_or_default();
    let id = get("id");
    let Some(port) = get("port").parse::<u16>().ok().filter(|p| *p > 0) else {
        return ApiError::bad_request("invalid port").into_response();
    };
    let h = req.headers();
    let has_token = h.contains_key(TOKEN_HEADER) || (port == EGRESS_PORT && h.contains_key(EGRESS_AUTH_HEADER));
    if !has_token {
        // Checked before the sandbox is looked up: no answer tells an
        // unsigned caller whether a sandbox exists.
        let now = chrono::Utc::now().timestamp().max(0) as u64;
        if let Err(e) = ctx.signing.verify(id, port, get("exp"), get("sig"), now) {
            return refusal(e).into_response();
        }
    }
    let Some(sb) = ctx.registry.get(id) else {
        return ApiError::sandbox_not_found(id).into_response();
    };
    if has_token {
        if let Err(e) = check_token(&sb, &req, port == EGRESS_PORT) {
            return e.into_response();
        }
    }
    let rest = get("rest").to_string();
    serve(&ctx, inner, sb, port, &rest, req).await
}

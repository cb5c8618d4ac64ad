//! API-key gate of the `/v1` routes (`OPEN-SANDBOX-API-KEY`).
use super::error::ApiError;
use crate::server::Ctx;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub const API_KEY_HEADER: &str = "open-sandbox-api-key";

/// Compares in time independent of where the strings differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn require_api_key(State(ctx): State<Arc<Ctx>>, req: Request, next: Next) -> Response {
    if let Some(key) = &ctx.api_key {
        match req.headers().get(API_KEY_HEADER) {
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "MISSING_API_KEY",
                    "missing OPEN-SANDBOX-API-KEY header",
                )
                .into_response()
            }
            Some(v) if !constant_time_eq(v.as_bytes(), key.as_bytes()) => {
                return ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_API_KEY", "invalid API key").into_response()
            }
            Some(_) => {}
        }
    }
    next.run(req).await
}

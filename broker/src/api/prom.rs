//! `GET /metrics`: the broker's Prometheus metrics ([`crate::metrics`]).
//!
//! Gated like `/v1` and `/pvisor`: with an API key set, a scrape sends it in
//! `OPEN-SANDBOX-API-KEY` (Prometheus: `http_headers` of the scrape config).
//! A client that accepts `application/openmetrics-text` gets OpenMetrics 1.0,
//! any other Prometheus' text format 0.0.4. Not to be confused with a
//! sandbox's own execd `/metrics` (data plane, JSON), which stays under
//! `/sandboxes/{id}/proxy/{port}/metrics`.
use super::error::{ApiError, ApiResult};
use crate::server::Ctx;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the client asked for OpenMetrics (`Accept`).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().starts_with("application/openmetrics-text"))
}

pub async fn metrics(State(ctx): State<Arc<Ctx>>, headers: HeaderMap) -> ApiResult<Response> {
    let openmetrics = wants_openmetrics(&headers);
    let body = crate::metrics::scrape::render(&ctx, openmetrics)
        .await
        .map_err(|e| ApiError::internal(format!("encoding the metrics: {e}")))?;
    let content_type =
        if openmetrics { OPENMETRICS } else { prometheus_client::encoding::prometheus_text::CONTENT_TYPE };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        let mut h = HeaderMap::new();
        assert!(!wants_openmetrics(&h));
        h.insert(header::ACCEPT, "text/plain;version=0.0.4;q=0.5, */*;q=0.1".parse().unwrap());
        assert!(!wants_openmetrics(&h));
        h.insert(header::ACCEPT, "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;q=0.5".parse().unwrap());
        assert!(wants_openmetrics(&h));
    }
}

//! Forwarding HTTP to a port inside the sandbox, through an agent tunnel.
use super::agent;
use crate::api::auth::API_KEY_HEADER;
use crate::api::egress::EGRESS_AUTH_HEADER;
use crate::api::error::ApiError;
use crate::api::lifecycle::TOKEN_HEADER;
use crate::sandbox::SandboxEntry;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use pvisor_proto::agent::TunnelData;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;

/// Request headers that belong to this hop or to pvisor, not to the app.
const STRIP: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    TOKEN_HEADER,
    API_KEY_HEADER,
    EGRESS_AUTH_HEADER,
];

fn backend_failed(msg: impl Into<String>) -> Response {
    ApiError::new(StatusCode::BAD_GATEWAY, "BACKEND_CONNECTION_FAILED", msg).into_response()
}

pub async fn forward(sb: Arc<SandboxEntry>, port: u16, rest: &str, req: Request) -> Response {
    let mut client = match agent(&sb) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let (to_agent, rx) = tokio::sync::mpsc::channel::<TunnelData>(16);
    let _ = to_agent.send(TunnelData { port: port as u32, data: Vec::new() }).await;
    let mut from_agent = match client.tunnel(ReceiverStream::new(rx)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return backend_failed(s.message().to_string()),
    };
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut rd, mut wr) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_agent.send(TunnelData { port: 0, data: buf[..n].to_vec() }).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        while let Ok(Some(m)) = from_agent.message().await {
            if wr.write_all(&m.data).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(ours)).await {
        Ok(x) => x,
        Err(e) => return backend_failed(e.to_string()),
    };
    tokio::spawn(conn);
    let (parts, body) = req.into_parts();
    let pq = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    let mut out = http::Request::builder().method(parts.method).uri(pq);
    for (k, v) in parts.headers.iter() {
        if !STRIP.iter().any(|s| k.as_str().eq_ignore_ascii_case(s)) && k != http::header::HOST {
            out = out.header(k, v);
        }
    }
    out = out.header(http::header::HOST, format!("127.0.0.1:{port}"));
    let out = match out.body(body) {
        Ok(r) => r,
        Err(e) => return ApiError::bad_request(e.to_string()).into_response(),
    };
    match sender.send_request(out).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => backend_failed(e.to_string()),
    }
}

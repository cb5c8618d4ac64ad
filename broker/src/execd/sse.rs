//! Server-sent events in execd's wire format.
use crate::api::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use pvisor_proto::agent::{exec_event, ExecEvent};
use pvisor_proto::now_ms;
use serde_json::{json, Value};

/// One `data: {json}\n\n` frame.
pub fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A streaming `text/event-stream` response.
pub fn response<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(stream),
    )
        .into_response()
}

pub fn complete(elapsed_ms: u64) -> Value {
    json!({"type": "execution_complete", "execution_time": elapsed_ms, "timestamp": now_ms()})
}

pub fn error_event(ename: &str, evalue: &str, traceback: &str) -> Value {
    json!({"type": "error", "error": {"ename": ename, "evalue": evalue, "traceback": [traceback]}, "timestamp": now_ms()})
}

/// Converts one agent event; returns the JSON and whether it ends the stream.
pub fn convert(ev: &ExecEvent) -> Option<(Value, bool)> {
    let ts = ev.timestamp_ms;
    Some(match ev.kind.as_ref()? {
        exec_event::Kind::Init(id) => (json!({"type": "init", "text": id, "timestamp": ts}), false),
        exec_event::Kind::Stdout(t) => (json!({"type": "stdout", "text": t, "timestamp": ts}), false),
        exec_event::Kind::Stderr(t) => (json!({"type": "stderr", "text": t, "timestamp": ts}), false),
        exec_event::Kind::Exit(x) if x.code == 0 && x.error.is_empty() => {
            (json!({"type": "execution_complete", "execution_time": x.elapsed_ms, "timestamp": ts}), true)
        }
        exec_event::Kind::Exit(x) => {
            let tb = if x.error.is_empty() { format!("exit status {}", x.code) } else { x.error.clone() };
            (
                json!({"type": "error", "error": {"ename": "CommandExecError", "evalue": x.code.to_string(), "traceback": [tb]}, "timestamp": ts}),
                true,
            )
        }
    })
}

/// Turns an agent event stream into SSE frames. A background command ends
/// right after its init event with `execution_complete`.
pub fn exec_stream(
    s: tonic::Streaming<ExecEvent>,
    background: bool,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    frames(None, s, background)
}

/// [`exec_stream`] of a foreground stream whose first message the caller
/// already read (to answer an early refusal with an HTTP error).
pub fn exec_stream_after(
    first: Option<ExecEvent>,
    s: tonic::Streaming<ExecEvent>,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    frames(Some(first), s, false)
}

fn frames(
    first: Option<Option<ExecEvent>>,
    mut s: tonic::Streaming<ExecEvent>,
    background: bool,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    async_stream::stream! {
        let mut first = first;
        loop {
            let next = match first.take() {
                Some(m) => Ok(m),
                None => s.message().await,
            };
            match next {
                Ok(Some(ev)) => {
                    let Some((v, done)) = convert(&ev) else { continue };
                    let is_init = matches!(ev.kind, Some(exec_event::Kind::Init(_)));
                    yield Ok(frame(&v));
                    if background && is_init {
                        yield Ok(frame(&complete(0)));
                        break;
                    }
                    if done {
                        break;
                    }
                }
                Ok(None) => {
                    if !background {
                        yield Ok(frame(&error_event("RuntimeError", "-1", "the command stream ended without an exit status")));
                    }
                    break;
                }
                Err(st) => {
                    let e = ApiError::from(st);
                    yield Ok(frame(&error_event("RuntimeError", "-1", &e.message)));
                    break;
                }
            }
        }
    }
}

//! A code run's agent events as execd SSE events (framing: [`super::sse`]).
//!
//! The order is the reference's mapping from Jupyter: `init` (the context
//! id), `stdout`/`stderr` chunks, per result an `execution_count` event and a
//! `result` event whose bundle has `text/plain` renamed to `text` (other MIME
//! keys pass through; `application/json` as JSON), then exactly one of
//! `execution_complete` or `error`, after which the stream closes (the SDK
//! reads to EOF). A `ping` goes out every [`PING_EVERY`] while the cell runs.
use super::sse;
use axum::body::Bytes;
use futures::{Stream, StreamExt};
use pvisor_proto::agent::{code_event, CodeEvent, CodeResult};
use pvisor_proto::now_ms;
use serde_json::{json, Map, Value};
use std::time::Duration;
use tokio::time::{interval_at, Instant};

/// How often a running cell's stream carries a `ping`.
pub const PING_EVERY: Duration = Duration::from_secs(3);

/// A result's MIME bundle as the SDKs read it.
pub fn bundle(r: &CodeResult) -> Value {
    let mut out = Map::new();
    for (mime, value) in &r.data {
        let v = match mime.as_str() {
            "application/json" => serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.clone())),
            _ => Value::String(value.clone()),
        };
        let key = if mime == "text/plain" { "text" } else { mime.as_str() };
        out.insert(key.to_string(), v);
    }
    Value::Object(out)
}

/// The SSE events of one agent event, and whether it ends the run.
pub fn convert(ev: &CodeEvent) -> (Vec<Value>, bool) {
    let ts = ev.timestamp_ms;
    let Some(kind) = ev.kind.as_ref() else { return (Vec::new(), false) };
    match kind {
        code_event::Kind::Init(id) => (vec![json!({"type": "init", "text": id, "timestamp": ts})], false),
        code_event::Kind::Stdout(t) if !t.is_empty() => {
            (vec![json!({"type": "stdout", "text": t, "timestamp": ts})], false)
        }
        code_event::Kind::Stderr(t) if !t.is_empty() => {
            (vec![json!({"type": "stderr", "text": t, "timestamp": ts})], false)
        }
        code_event::Kind::Stdout(_) | code_event::Kind::Stderr(_) => (Vec::new(), false),
        code_event::Kind::Result(r) => (
            vec![
                json!({"type": "execution_count", "execution_count": r.execution_count, "timestamp": ts}),
                json!({"type": "result", "results": bundle(r), "timestamp": ts}),
            ],
            false,
        ),
        code_event::Kind::Complete(c) => {
            (vec![json!({"type": "execution_complete", "execution_time": c.execution_time_ms, "timestamp": ts})], true)
        }
        code_event::Kind::Error(e) => (
            vec![json!({
                "type": "error",
                "error": {"ename": e.ename, "evalue": e.evalue, "traceback": e.traceback},
                "timestamp": ts,
            })],
            true,
        ),
    }
}

fn ping() -> Value {
    json!({"type": "ping", "text": "pong", "timestamp": now_ms()})
}

/// The frames of a run whose first event (`first`, already read so that
/// errors before the stream could become HTTP errors) and the rest come from
/// the agent. A stream that ends without a terminal event, or breaks, ends
/// with an `error` event.
pub fn frames(
    first: Option<CodeEvent>,
    mut rest: tonic::Streaming<CodeEvent>,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    async_stream::stream! {
        let mut next = first.map(Ok);
        let mut pings = interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        loop {
            let item = match next.take() {
                Some(item) => Some(item),
                None => tokio::select! {
                    m = rest.next() => m,
                    _ = pings.tick() => {
                        yield Ok(sse::frame(&ping()));
                        continue;
                    }
                },
            };
            match item {
                Some(Ok(ev)) => {
                    let (events, done) = convert(&ev);
                    for v in &events {
                        yield Ok(sse::frame(v));
                    }
                    if done {
                        break;
                    }
                }
                None => {
                    yield Ok(sse::frame(&sse::error_event("RuntimeError", "", "the code stream ended without a result")));
                    break;
                }
                Some(Err(st)) => {
                    let e = crate::api::error::ApiError::from(st);
                    yield Ok(sse::frame(&sse::error_event("RuntimeError", "", &e.message)));
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::agent::{CodeComplete, CodeError};
    use std::collections::HashMap;

    fn ev(kind: code_event::Kind) -> CodeEvent {
        CodeEvent { kind: Some(kind), timestamp_ms: 42 }
    }

    #[test]
    fn a_result_is_a_count_then_a_bundle_with_text_plain_renamed() {
        let data = HashMap::from([
            ("text/plain".to_string(), "4".to_string()),
            ("image/png".to_string(), "iVBORw0KGgo=".to_string()),
            ("application/json".to_string(), r#"{"a": 1}"#.to_string()),
        ]);
        let (out, done) =
            convert(&ev(code_event::Kind::Result(CodeResult { execution_count: 3, data, is_main_result: true })));
        assert!(!done);
        assert_eq!(out[0], json!({"type": "execution_count", "execution_count": 3, "timestamp": 42}));
        assert_eq!(out[1]["type"], "result");
        assert_eq!(out[1]["results"], json!({"text": "4", "image/png": "iVBORw0KGgo=", "application/json": {"a": 1}}));
        assert_eq!(out[1]["timestamp"], 42);
    }

    #[test]
    fn init_output_and_terminal_events() {
        let (out, done) = convert(&ev(code_event::Kind::Init("ctx1".into())));
        assert_eq!((out, done), (vec![json!({"type": "init", "text": "ctx1", "timestamp": 42})], false));
        let (out, _) = convert(&ev(code_event::Kind::Stdout("a\n".into())));
        assert_eq!(out, vec![json!({"type": "stdout", "text": "a\n", "timestamp": 42})]);
        assert!(convert(&ev(code_event::Kind::Stderr(String::new()))).0.is_empty(), "never an empty chunk");
        let (out, done) =
            convert(&ev(code_event::Kind::Complete(CodeComplete { execution_count: 1, execution_time_ms: 7 })));
        assert_eq!(
            (out, done),
            (vec![json!({"type": "execution_complete", "execution_time": 7, "timestamp": 42})], true)
        );
        let (out, done) = convert(&ev(code_event::Kind::Error(CodeError {
            ename: "NameError".into(),
            evalue: "name 'x' is not defined".into(),
            traceback: vec!["line 1".into()],
            execution_count: 2,
        })));
        assert!(done);
        assert_eq!(
            out[0]["error"],
            json!({"ename": "NameError", "evalue": "name 'x' is not defined", "traceback": ["line 1"]})
        );
    }

    #[test]
    fn an_event_without_kind_is_skipped() {
        assert_eq!(convert(&CodeEvent { kind: None, timestamp_ms: 1 }), (Vec::new(), false));
    }
}

//! The request guard: the outermost middleware of the API router. Before a
//! handler runs it
//! * answers 431 `HEADERS_TOO_LARGE` to a head over `--max-header-bytes` or
//!   `--max-headers`;
//! * reads a buffered route's body itself, within its route's bound (413
//!   `PAYLOAD_TOO_LARGE`), a longest pause between pieces and a slowest
//!   average rate (408 `BODY_TIMEOUT`), so a handler never waits on a slow
//!   client and an axum extractor never answers in plain text;
//! * bounds a streamed upload the same way, inside the stream (the upload
//!   handler sees an error and the agent call is cancelled);
//! * holds one `--max-streams` slot for every data-plane request until its
//!   response body ends (429 `TOO_MANY_STREAMS` when none is free).
//!
//! Tunnels to other sandbox ports stream both ways and are left to the
//! stream and connection caps.
use super::limits::HttpLimits;
use crate::api::error::ApiError;
use crate::api::lifecycle::EXECD_PORT;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The guard's settings and the open-stream slots.
pub struct Guard {
    limits: HttpLimits,
    streams: Arc<Semaphore>,
}

impl Guard {
    pub fn new(limits: &HttpLimits) -> Arc<Self> {
        Arc::new(Guard { limits: limits.clone(), streams: Arc::new(Semaphore::new(limits.max_streams)) })
    }
}

/// How a route's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The lifecycle and admin API: buffered, `--max-body-bytes`.
    Control,
    /// The execd data plane and the egress sidecar: buffered, `--max-exec-body-bytes`.
    Exec,
    /// `/files/upload`: streamed, `--max-upload-bytes`.
    Upload,
    /// A tunnel to another port of the sandbox: untouched.
    Tunnel,
}

/// The class of a path: the data plane is `[/v1]/sandboxes/{id}/proxy/{port}[/rest]`
/// and `/sandboxes/{id}/signed/{port}/{expires}/{signature}[/rest]`.
fn classify(path: &str) -> Class {
    let p = path.strip_prefix("/v1").unwrap_or(path);
    let mut seg = p.trim_start_matches('/').splitn(5, '/');
    let (Some("sandboxes"), Some(_), Some(kind @ ("proxy" | "signed")), Some(port)) =
        (seg.next(), seg.next(), seg.next(), seg.next())
    else {
        return Class::Control;
    };
    let rest = seg.next().unwrap_or("");
    // A signed route's expiry and signature come before its rest.
    let rest = if kind == "signed" { rest.splitn(3, '/').nth(2).unwrap_or("") } else { rest };
    match port.parse::<u16>() {
        Ok(EXECD_PORT) if rest.trim_end_matches('/').ends_with("files/upload") => Class::Upload,
        Ok(EXECD_PORT) | Ok(crate::api::egress::EGRESS_PORT) => Class::Exec,
        Ok(_) => Class::Tunnel,
        // The dispatcher answers the bad port; there is no body to keep.
        Err(_) => Class::Exec,
    }
}

/// Bytes of the request head as the client sent it, near enough: the
/// request line and every header line.
fn head_bytes(req: &Request) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 11;
    line + req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>()
}

fn error(status: StatusCode, code: &'static str, message: String) -> Response {
    let mut r = ApiError::new(status, code, message).into_response();
    if status == StatusCode::REQUEST_TIMEOUT {
        // A body left hanging: the connection cannot carry another request.
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// What a refused body may still send while its answer goes out.
const LINGER_BYTES: u64 = 8 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// Reads and discards the rest of a refused body for a little while, as
/// nginx's lingering close does: a connection closed with unread data in it
/// is reset, and the reset can destroy the 413 before the client reads it.
fn linger(mut body: Body) {
    tokio::spawn(async move {
        let mut n = 0u64;
        let drain = async {
            while let Some(Ok(f)) = body.frame().await {
                n += f.data_ref().map_or(0, |d| d.len() as u64);
                if n > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

fn too_large(limit: u64) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE", format!("request body is larger than {limit} bytes"))
}

/// The body's pace: a longest pause, and a slowest average rate after the
/// first pause's worth of time.
#[derive(Clone, Copy)]
struct Pace {
    start: Instant,
    pause: Duration,
    min_rate: u64,
}

impl Pace {
    fn new(l: &HttpLimits) -> Self {
        Pace { start: Instant::now(), pause: l.body_timeout(), min_rate: l.min_body_rate }
    }

    /// How long to wait for the next piece after `received` bytes; `None`
    /// once the body is behind its rate.
    fn wait(&self, received: u64) -> Option<Duration> {
        if self.min_rate == 0 {
            return Some(self.pause);
        }
        let allowed = self.pause + Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        let left = allowed.checked_sub(self.start.elapsed())?;
        Some(left.min(self.pause))
    }
}

/// Why reading a body stopped.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("request body is larger than {0} bytes")]
    TooLarge(u64),
    #[error("request body too slow: no data for {0:?} or under {1} bytes/s on average")]
    Slow(Duration, u64),
    #[error("reading the request body: {0}")]
    Broken(String),
}

impl BodyError {
    fn response(&self) -> Response {
        match self {
            BodyError::TooLarge(n) => too_large(*n),
            BodyError::Slow(..) => error(StatusCode::REQUEST_TIMEOUT, "BODY_TIMEOUT", self.to_string()),
            BodyError::Broken(_) => error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", self.to_string()),
        }
    }
}

/// The next data of `body` within `pace`; `None` at its end.
async fn next_data(body: &mut Body, pace: &Pace, received: u64) -> Result<Option<Bytes>, BodyError> {
    loop {
        let wait = pace.wait(received).ok_or(BodyError::Slow(pace.pause, pace.min_rate))?;
        match tokio::time::timeout(wait, body.frame()).await {
            Err(_) => return Err(BodyError::Slow(pace.pause, pace.min_rate)),
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => return Err(BodyError::Broken(e.to_string())),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// Reads a whole body of at most `limit` bytes (the rest of a longer one lingers).
async fn read_all(mut body: Body, limit: usize, pace: Pace) -> Result<Bytes, BodyError> {
    let mut buf = BytesMut::new();
    while let Some(data) = next_data(&mut body, &pace, buf.len() as u64).await? {
        if buf.len() + data.len() > limit {
            linger(body);
            return Err(BodyError::TooLarge(limit as u64));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// A streamed body under the same pace and a byte bound: past either it
/// ends in an error.
fn paced_stream(mut body: Body, limit: u64, pace: Pace) -> Body {
    Body::from_stream(async_stream::stream! {
        let mut received = 0u64;
        loop {
            match next_data(&mut body, &pace, received).await {
                Ok(None) => break,
                Ok(Some(data)) => {
                    received += data.len() as u64;
                    if received > limit {
                        yield Err(std::io::Error::other(BodyError::TooLarge(limit).to_string()));
                        break;
                    }
                    yield Ok(data);
                }
                Err(e) => {
                    yield Err(std::io::Error::other(e.to_string()));
                    break;
                }
            }
        }
    })
}

/// A response body that holds an open-stream slot until it ends or is dropped.
struct Held {
    inner: Body,
    _slot: OwnedSemaphorePermit,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn layer(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let l = &g.limits;
    if req.headers().len() > l.max_headers {
        return error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "HEADERS_TOO_LARGE",
            format!("{} header fields; at most {} are accepted", req.headers().len(), l.max_headers),
        );
    }
    if head_bytes(&req) > l.max_header_bytes {
        return error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "HEADERS_TOO_LARGE",
            format!("request head is larger than {} bytes", l.max_header_bytes),
        );
    }
    let class = classify(req.uri().path());
    let slot = match class {
        Class::Control => None,
        _ => match g.streams.clone().try_acquire_owned() {
            Ok(s) => Some(s),
            Err(_) => {
                let mut r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TOO_MANY_STREAMS",
                    format!("{} data-plane requests and streams are open; try again later", l.max_streams),
                );
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        },
    };
    let limit = match class {
        Class::Control => Some(l.max_body_bytes as u64),
        Class::Exec => Some(l.max_exec_body_bytes as u64),
        Class::Upload => Some(l.max_upload_bytes),
        Class::Tunnel => None,
    };
    let (parts, body) = req.into_parts();
    if let Some(limit) = limit {
        if body.size_hint().lower() > limit {
            linger(body);
            return too_large(limit);
        }
    }
    let body = match class {
        Class::Tunnel => body,
        _ if body.is_end_stream() => body,
        Class::Upload => paced_stream(body, l.max_upload_bytes, Pace::new(l)),
        Class::Control | Class::Exec => {
            let limit = if class == Class::Control { l.max_body_bytes } else { l.max_exec_body_bytes };
            match read_all(body, limit, Pace::new(l)).await {
                Ok(b) => Body::from(b),
                Err(e) => return e.response(),
            }
        }
    };
    let resp = next.run(Request::from_parts(parts, body)).await;
    match slot {
        None => resp,
        Some(slot) => resp.map(|inner| Body::new(Held { inner, _slot: slot })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_classified() {
        assert_eq!(classify("/v1/sandboxes"), Class::Control);
        assert_eq!(classify("/v1/sandboxes/abc/renew-expiration"), Class::Control);
        assert_eq!(classify("/health"), Class::Control);
        assert_eq!(classify("/sandboxes/abc/proxy/44772/command"), Class::Exec);
        assert_eq!(classify("/v1/sandboxes/abc/proxy/44772/files/upload"), Class::Upload);
        assert_eq!(classify("/sandboxes/abc/proxy/44772/v1/filesystem/0/0/files/upload"), Class::Upload);
        assert_eq!(classify("/sandboxes/abc/proxy/18080/policy"), Class::Exec);
        assert_eq!(classify("/sandboxes/abc/proxy/8000/files/upload"), Class::Tunnel);
        assert_eq!(classify("/sandboxes/abc/proxy/nope/x"), Class::Exec);
        assert_eq!(classify("/sandboxes/abc/signed/44772/x2qxvk/0123abcda/files/upload"), Class::Upload);
        assert_eq!(classify("/sandboxes/abc/signed/8000/x2qxvk/0123abcda/files/upload"), Class::Tunnel);
        assert_eq!(classify("/sandboxes/abc/signed/44772/x2qxvk/0123abcda"), Class::Exec);
    }

    #[test]
    fn pace_allows_a_pause_then_requires_the_rate() {
        let pace = Pace { start: Instant::now(), pause: Duration::from_secs(30), min_rate: 1000 };
        assert!(pace.wait(0).is_some_and(|w| w <= Duration::from_secs(30) && w > Duration::from_secs(29)));
        let late = Pace { start: Instant::now() - Duration::from_secs(40), ..pace };
        assert!(late.wait(0).is_none(), "40 s and nothing");
        assert!(late.wait(20_000).is_some(), "20 kB in 40 s is 500 B/s over the pause's grace");
        assert!(late.wait(5_000).is_none());
        let no_rate = Pace { min_rate: 0, ..late };
        assert_eq!(no_rate.wait(0), Some(Duration::from_secs(30)), "only the pause bounds a body");
    }

    #[tokio::test]
    async fn bodies_over_their_bound_are_refused() {
        let l = HttpLimits::default();
        let ok = read_all(Body::from("0123456789"), 10, Pace::new(&l)).await.unwrap();
        assert_eq!(&ok[..], b"0123456789");
        let e = read_all(Body::from("0123456789x"), 10, Pace::new(&l)).await.unwrap_err();
        assert!(matches!(e, BodyError::TooLarge(10)));
        assert_eq!(e.response().status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out() {
        let l = HttpLimits::default();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let e = read_all(body, 10, Pace::new(&l)).await.unwrap_err();
        assert!(matches!(e, BodyError::Slow(..)));
        assert_eq!(e.response().status(), StatusCode::REQUEST_TIMEOUT);
    }
}

//! `X-Request-ID`: every response carries one. The client's (trimmed) value
//! is echoed; a request without one gets a fresh uuid4 in hex, which is also
//! put on the request so handlers and a proxied in-sandbox service see the
//! same id. The SDK copies it into its exceptions, so a failing call can be
//! matched to the broker's log: every line logged while the request is
//! handled carries it (a `request` span).
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header, in the lower case HTTP/2 requires.
pub const HEADER: &str = "x-request-id";

/// Longest client value echoed; a longer one is replaced (it would only bloat logs).
const MAX_LEN: usize = 200;

/// A uuid4 as 32 lower-case hex digits (the reference server's form).
pub fn generate() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The client's id if usable: visible ASCII (a valid header value), not empty, not huge.
fn from_client(req: &Request) -> Option<HeaderValue> {
    let v = req.headers().get(HEADER)?.to_str().ok()?.trim();
    if v.is_empty() || v.len() > MAX_LEN {
        return None;
    }
    HeaderValue::from_str(v).ok()
}

/// Middleware over the whole router: sets the id on the request and on the response.
pub async fn layer(mut req: Request, next: Next) -> Response {
    let id = from_client(&req)
        .unwrap_or_else(|| HeaderValue::from_str(&generate()).unwrap_or_else(|_| HeaderValue::from_static("invalid")));
    req.headers_mut().insert(HEADER, id.clone());
    let shown = id.to_str().unwrap_or_default().to_string();
    let span = tracing::info_span!("request", request_id = %shown);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    async move {
        let mut resp = next.run(req).await;
        let status = resp.status();
        if status.is_client_error() || status.is_server_error() {
            tracing::info!(%method, %path, status = status.as_u16(), "request failed");
        } else {
            tracing::debug!(%method, %path, status = status.as_u16(), "request");
        }
        resp.headers_mut().insert(HEADER, id);
        resp
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_uuid4_hex_and_differ() {
        let a = generate();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_eq!(&a[12..13], "4", "version nibble: {a}");
        assert!(matches!(&a[16..17], "8" | "9" | "a" | "b"), "variant nibble: {a}");
        assert_ne!(a, generate());
    }

    fn req(v: Option<&str>) -> Request {
        let mut b = Request::builder().uri("/x");
        if let Some(v) = v {
            b = b.header(HEADER, v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn client_ids_are_trimmed_and_bad_ones_replaced() {
        assert_eq!(from_client(&req(Some("  abc-1 "))).unwrap(), "abc-1");
        assert!(from_client(&req(Some("   "))).is_none());
        assert!(from_client(&req(Some(&"x".repeat(MAX_LEN + 1)))).is_none());
        assert!(from_client(&req(None)).is_none());
    }
}

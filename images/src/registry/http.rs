//! HTTP plumbing shared by the registry API and the token service: the
//! configured agent, bounded body reads, error-message extraction and the
//! mapping of transport errors.

use std::io::Read;
use std::time::Duration;

use ureq::http::Response;
use ureq::{Agent, Body};

use super::error::RegistryError;

/// Largest error body read to extract a message from.
const MAX_ERROR_BODY: u64 = 64 << 10;
/// Per-read timeout of API requests and downloads.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest message kept from a non-JSON error body.
const MAX_MESSAGE_CHARS: usize = 300;

/// The agent used for one pull.
///
/// `http_allowed`: plain-http URLs (the registry, token realms and redirect
/// targets) are permitted; otherwise the agent refuses them, so a redirect
/// cannot downgrade to http. `use_proxy`: honour `HTTPS_PROXY` & co (never
/// wanted for loopback registries). Status codes are returned as responses,
/// redirects are followed without the `Authorization` header. `read_timeout`
/// bounds each read (TLS handshake included).
pub(crate) fn agent(http_allowed: bool, use_proxy: bool, read_timeout: Duration) -> Agent {
    let mut config = Agent::config_builder()
        .http_status_as_error(false)
        .https_only(!http_allowed)
        .max_redirects(10)
        .user_agent(concat!("pvisor/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(read_timeout));
    if !use_proxy {
        config = config.proxy(None);
    }
    config.build().new_agent()
}

/// Maps a failed request (no HTTP status) to an error naming the URL.
pub(crate) fn transport_error(url: &str, err: ureq::Error) -> RegistryError {
    match err {
        ureq::Error::RequireHttpsOnly(target) => RegistryError::InsecureRefused { url: target },
        other => RegistryError::network(url, other),
    }
}

/// The response's `Content-Type` without parameters (`; charset=...`).
pub(crate) fn content_type(resp: &Response<Body>) -> String {
    header(resp, "content-type").map(|v| v.split(';').next().unwrap_or("").trim().to_owned()).unwrap_or_default()
}

/// One response header as text, if present and valid.
pub(crate) fn header(resp: &Response<Body>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Reads a whole body into memory, refusing more than `limit` bytes.
pub(crate) fn read_limited(body: &mut Body, url: &str, what: &str, limit: u64) -> Result<Vec<u8>, RegistryError> {
    if let Some(len) = body.content_length().filter(|&len| len > limit) {
        return Err(RegistryError::TooLarge { what: what.to_owned(), size: len, limit });
    }
    let mut out = Vec::new();
    body.as_reader().take(limit + 1).read_to_end(&mut out).map_err(|e| RegistryError::network(url, e))?;
    if out.len() as u64 > limit {
        return Err(RegistryError::TooLarge { what: what.to_owned(), size: out.len() as u64, limit });
    }
    Ok(out)
}

/// A readable message from an error response: the registry's error list
/// (`CODE: message`), a token service's `details`/`error`, or the text.
pub(crate) fn error_message(resp: Response<Body>) -> String {
    let status = resp.status();
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    // A broken error body only costs the message.
    let _ = body.as_reader().take(MAX_ERROR_BODY).read_to_end(&mut bytes);
    message_from_body(&bytes).unwrap_or_else(|| {
        format!("HTTP {} {}", status.as_u16(), status.canonical_reason().unwrap_or("")).trim_end().to_owned()
    })
}

fn message_from_body(bytes: &[u8]) -> Option<String> {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(bytes) {
        if let Some(errors) = json.get("errors").and_then(|e| e.as_array()) {
            let parts: Vec<String> = errors
                .iter()
                .map(|e| {
                    let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
                    let msg = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
                    match (code.is_empty(), msg.is_empty()) {
                        (false, false) => format!("{code}: {msg}"),
                        (true, _) => msg.to_owned(),
                        (false, true) => code.to_owned(),
                    }
                })
                .filter(|s| !s.is_empty())
                .collect();
            if !parts.is_empty() {
                return Some(parts.join("; "));
            }
        }
        for key in ["details", "detail", "message", "error_description", "error"] {
            if let Some(s) = json.get(key).and_then(|v| v.as_str()).filter(|s| !s.is_empty()) {
                return Some(s.to_owned());
            }
        }
    }
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    (!text.is_empty()).then(|| text.chars().take(MAX_MESSAGE_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads() {
        let mut body = Body::builder().data(vec![1u8; 100]);
        assert_eq!(read_limited(&mut body, "http://x/m", "manifest", 100).unwrap().len(), 100);
        // No Content-Length here: the limit is enforced while reading.
        let mut body = Body::builder().reader(std::io::Cursor::new(vec![1u8; 101]));
        match read_limited(&mut body, "http://x/m", "manifest", 100) {
            Err(RegistryError::TooLarge { what, size: 101, limit: 100 }) => assert_eq!(what, "manifest"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn messages_from_error_bodies() {
        let m = |s: &str| message_from_body(s.as_bytes());
        assert_eq!(
            m(r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"x"}}]}"#)
                .as_deref(),
            Some("MANIFEST_UNKNOWN: manifest unknown")
        );
        assert_eq!(m(r#"{"errors":[{"code":"A","message":"a"},{"code":"B"}]}"#).as_deref(), Some("A: a; B"));
        assert_eq!(
            m(r#"{"details":"incorrect username or password"}"#).as_deref(),
            Some("incorrect username or password")
        );
        assert_eq!(m("  plain text\n").as_deref(), Some("plain text"));
        assert_eq!(m(""), None);
        assert_eq!(m(&"x".repeat(1000)).map(|s| s.len()), Some(MAX_MESSAGE_CHARS));
    }
}

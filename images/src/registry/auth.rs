//! Registry authentication: `WWW-Authenticate` challenge parsing, Basic
//! credentials, and the Bearer token flow (`GET realm?service=..&scope=..`,
//! optionally with Basic credentials, answering `{"token": ..}` or
//! `{"access_token": ..}`).

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::Deserialize;
use ureq::Agent;

use super::error::RegistryError;
use super::http;

/// Largest token response read.
const MAX_TOKEN_RESPONSE: u64 = 1 << 20;

/// One challenge of a `WWW-Authenticate` header (RFC 7235).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Challenge {
    /// Lowercased scheme: `bearer`, `basic`, ...
    pub scheme: String,
    /// Parameters with lowercased names (`realm`, `service`, `scope`).
    pub params: BTreeMap<String, String>,
}

/// A username and password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).finish_non_exhaustive()
    }
}

impl Credentials {
    /// The `Authorization` header value for Basic auth.
    pub fn basic_header(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(raw))
    }
}

/// Parses every challenge of one `WWW-Authenticate` header value.
///
/// Lenient: unquoted values run to the next `,` or space, quoted values may
/// contain commas and `\"` escapes, and a token68 (`Basic abc==`) is kept
/// under the empty parameter name. Garbage is skipped, never an error.
pub fn parse_challenges(header: &str) -> Vec<Challenge> {
    let mut p = Cursor { s: header.as_bytes(), i: 0 };
    let mut out = Vec::new();
    loop {
        p.skip(|c| c == b' ' || c == b'\t' || c == b',');
        if p.eof() {
            return out;
        }
        let scheme = p.token();
        if scheme.is_empty() {
            p.i += 1; // not a token character: skip it
            continue;
        }
        let mut challenge = Challenge { scheme: scheme.to_ascii_lowercase(), params: BTreeMap::new() };
        loop {
            p.skip(|c| c == b' ' || c == b'\t');
            let start = p.i;
            let name = p.token();
            if name.is_empty() {
                break;
            }
            p.skip(|c| c == b' ' || c == b'\t');
            if p.peek() != Some(b'=') {
                // A new challenge's scheme follows: leave it to the outer loop.
                p.i = start;
                break;
            }
            p.i += 1;
            let after_eq = p.i;
            p.skip(|c| c == b' ' || c == b'\t');
            match p.peek() {
                Some(b'"') => {
                    let value = p.quoted();
                    challenge.params.insert(name.to_ascii_lowercase(), value);
                }
                None | Some(b',' | b'=') if challenge.params.is_empty() => {
                    // A token68 ending in '=' padding (all ASCII, so slicing is safe).
                    p.i = after_eq;
                    p.skip(|c| c == b'=');
                    challenge.params.insert(String::new(), header[start..p.i].to_owned());
                }
                _ => {
                    let value = p.unquoted();
                    challenge.params.insert(name.to_ascii_lowercase(), value);
                }
            }
            p.skip(|c| c == b' ' || c == b'\t');
            if p.peek() == Some(b',') {
                p.i += 1;
            } else {
                break;
            }
        }
        out.push(challenge);
    }
}

/// Byte cursor over a header value.
struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn eof(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip(&mut self, pred: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.i += 1;
        }
    }

    fn take_while(&mut self, pred: impl Fn(u8) -> bool) -> String {
        let start = self.i;
        self.skip(pred);
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// An RFC 7230 token.
    fn token(&mut self) -> String {
        self.take_while(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
    }

    /// A value up to the next separator.
    fn unquoted(&mut self) -> String {
        self.take_while(|c| !matches!(c, b',' | b' ' | b'\t'))
    }

    /// A quoted string (cursor on the opening quote), unescaped; an
    /// unterminated one runs to the end.
    fn quoted(&mut self) -> String {
        self.i += 1;
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.i += 1;
                    }
                }
                _ => out.push(c),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn query_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The token request URL for a Bearer challenge.
pub(crate) fn token_url(challenge: &Challenge, scopes: &[String]) -> Option<String> {
    let realm = challenge.params.get("realm").filter(|r| !r.is_empty())?;
    let mut url = realm.clone();
    let mut sep = if realm.contains('?') { '&' } else { '?' };
    if let Some(service) = challenge.params.get("service") {
        url.push_str(&format!("{sep}service={}", query_encode(service)));
        sep = '&';
    }
    for scope in scopes {
        url.push_str(&format!("{sep}scope={}", query_encode(scope)));
        sep = '&';
    }
    Some(url)
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// Runs the Bearer token flow and returns the token.
///
/// `registry` only names the registry in errors; `http_allowed` says whether a
/// plain-http realm may be used (credentials are never sent over plain http
/// to a registry that is not allowed it).
pub(crate) fn fetch_token(
    agent: &Agent,
    challenge: &Challenge,
    scopes: &[String],
    credentials: Option<&Credentials>,
    registry: &str,
    http_allowed: bool,
) -> Result<String, RegistryError> {
    let url = token_url(challenge, scopes).ok_or_else(|| {
        RegistryError::bad_response(registry, "authentication challenge", "Bearer challenge without a realm")
    })?;
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("http://") && !http_allowed {
        return Err(RegistryError::InsecureRefused { url });
    }
    if !lower.starts_with("http://") && !lower.starts_with("https://") {
        return Err(RegistryError::bad_response(registry, "authentication challenge", format!("token realm {url:?}")));
    }
    let mut req = agent.get(&url);
    if let Some(c) = credentials {
        req = req.header("Authorization", c.basic_header());
    }
    let resp = req.call().map_err(|e| http::transport_error(&url, e))?;
    let status = resp.status().as_u16();
    if status == 401 || status == 403 {
        let message = http::error_message(resp);
        let hint =
            if credentials.is_some() { "credentials rejected by the token service" } else { "no credentials given" };
        return Err(RegistryError::Unauthorized {
            registry: registry.to_owned(),
            message: format!("{message} ({hint})"),
        });
    }
    if !(200..300).contains(&status) {
        return Err(RegistryError::Http { url, status, message: http::error_message(resp) });
    }
    let mut body = resp.into_body();
    let bytes = http::read_limited(&mut body, &url, "token response", MAX_TOKEN_RESPONSE)?;
    let parsed: TokenResponse =
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::bad_response(&url, "token response", e))?;
    parsed
        .token
        .filter(|t| !t.is_empty())
        .or(parsed.access_token.filter(|t| !t.is_empty()))
        .ok_or_else(|| RegistryError::bad_response(&url, "token response", "neither token nor access_token is set"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(scheme: &str, params: &[(&str, &str)]) -> Challenge {
        Challenge {
            scheme: scheme.to_owned(),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn docker_hub_bearer() {
        let h = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#;
        assert_eq!(
            parse_challenges(h),
            vec![ch(
                "bearer",
                &[
                    ("realm", "https://auth.docker.io/token"),
                    ("service", "registry.docker.io"),
                    ("scope", "repository:library/busybox:pull")
                ]
            )]
        );
    }

    #[test]
    fn basic_and_case_and_spacing() {
        assert_eq!(
            parse_challenges(r#"Basic realm="Registry Realm""#),
            vec![ch("basic", &[("realm", "Registry Realm")])]
        );
        assert_eq!(
            parse_challenges(r#"  bEaReR   REALM = "http://x/t" ,  Service=svc"#),
            vec![ch("bearer", &[("realm", "http://x/t"), ("service", "svc")])]
        );
        assert_eq!(parse_challenges("Bearer"), vec![ch("bearer", &[])]);
        assert_eq!(parse_challenges("Negotiate abc123=="), vec![ch("negotiate", &[("", "abc123==")])]);
    }

    #[test]
    fn several_challenges_and_quoting() {
        let h = r#"Basic realm="a, \"b\"", Bearer realm="https://t/x?a=1",service="s",scope="repository:a:pull,push", Other"#;
        assert_eq!(
            parse_challenges(h),
            vec![
                ch("basic", &[("realm", r#"a, "b""#)]),
                ch("bearer", &[("realm", "https://t/x?a=1"), ("service", "s"), ("scope", "repository:a:pull,push")]),
                ch("other", &[]),
            ]
        );
        // Unquoted values, an unterminated quote, and garbage do not panic.
        assert_eq!(
            parse_challenges("Bearer realm=http://x/t,service=s"),
            vec![ch("bearer", &[("realm", "http://x/t"), ("service", "s")])]
        );
        assert_eq!(parse_challenges(r#"Bearer realm="unterminated"#), vec![ch("bearer", &[("realm", "unterminated")])]);
        assert!(parse_challenges("").is_empty());
        assert!(parse_challenges(" ,, ").is_empty());
        let _ = parse_challenges("\"=,=\u{1F600}@@ Bearer =\"");
    }

    #[test]
    fn token_urls() {
        let c = ch("bearer", &[("realm", "https://auth.example/token"), ("service", "reg.example")]);
        assert_eq!(
            token_url(&c, &["repository:library/busybox:pull".to_owned()]).unwrap(),
            "https://auth.example/token?service=reg.example&scope=repository%3Alibrary%2Fbusybox%3Apull"
        );
        let c = ch("bearer", &[("realm", "http://127.0.0.1:1/t?x=y")]);
        assert_eq!(
            token_url(&c, &["a b".to_owned(), "c".to_owned()]).unwrap(),
            "http://127.0.0.1:1/t?x=y&scope=a%20b&scope=c"
        );
        assert_eq!(token_url(&ch("bearer", &[]), &[]), None);
    }

    #[test]
    fn basic_header_and_redacted_debug() {
        let c = Credentials { username: "alice".into(), password: "s3cret".into() };
        assert_eq!(c.basic_header(), "Basic YWxpY2U6czNjcmV0");
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}

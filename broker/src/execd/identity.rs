//! `/v1/filesystem/{uid}/{gid}/files/...` and `/directories/...`: the file
//! API run as that identity inside the sandbox. The routes are the plain file
//! routes; a middleware reads the identity from the path, and each call to
//! the agent carries it in gRPC metadata ([`request`]). The agent then does
//! the operation with that uid and gid (see `pvisor_agent::identity`), so a
//! file the identity may not read answers 403 `PERMISSION_DENIED`.
use crate::api::error::ApiError;
use axum::extract::{Path, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use std::collections::HashMap;
use tonic::metadata::MetadataValue;

/// The metadata key the agent reads (`pvisor_agent::identity::METADATA_KEY`).
const METADATA_KEY: &str = "x-pvisor-identity";
/// The metadata key naming an isolated session (`pvisor_agent::identity::SESSION_KEY`).
const SESSION_KEY: &str = "x-pvisor-isolated-session";

/// The identity of a `/v1/filesystem/{uid}/{gid}` request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// Where a file route runs, when not as the agent in the sandbox's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileScope {
    /// `/v1/filesystem/{uid}/{gid}/...`: as that identity.
    As(Identity),
    /// `/v1/isolated/session/{id}/...`: inside that isolated session's root,
    /// as its identity (the agent knows both).
    Isolated(String),
}

/// A file handler's scope: none on the plain routes.
pub type Who = Option<Extension<FileScope>>;

/// A request to the agent, carrying the scope when there is one.
pub fn request<T>(msg: T, who: &Who) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    match who {
        None => {}
        Some(Extension(FileScope::As(id))) => {
            // Digits and a colon: always a valid metadata value.
            if let Ok(v) = MetadataValue::try_from(format!("{}:{}", id.uid, id.gid)) {
                r.metadata_mut().insert(METADATA_KEY, v);
            }
        }
        Some(Extension(FileScope::Isolated(sid))) => {
            // Not a valid metadata value (not visible ASCII): no session has that id.
            let v = MetadataValue::try_from(sid.as_str()).unwrap_or_else(|_| MetadataValue::from_static("-"));
            r.metadata_mut().insert(SESSION_KEY, v);
        }
    }
    r
}

/// A uid or gid as the SDK sends it: 0 ..= 4294967294.
fn id_of(p: &HashMap<String, String>, key: &str) -> Result<u32, ApiError> {
    p.get(key)
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| *n != u32::MAX)
        .ok_or_else(|| ApiError::bad_request(format!("{key} must be an integer between 0 and 4294967294")))
}

async fn with_identity(Path(p): Path<HashMap<String, String>>, mut req: Request, next: Next) -> Response {
    let id = match (id_of(&p, "uid"), id_of(&p, "gid")) {
        (Ok(uid), Ok(gid)) => Identity { uid, gid },
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
    };
    req.extensions_mut().insert(FileScope::As(id));
    next.run(req).await
}

/// The file routes under `/v1/filesystem/{uid}/{gid}`.
pub fn routes(files: Router) -> Router {
    Router::new().nest("/v1/filesystem/{uid}/{gid}", files.layer(axum::middleware::from_fn(with_identity)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        let p = |u: &str| HashMap::from([("uid".to_string(), u.to_string())]);
        assert_eq!(id_of(&p("1000"), "uid").unwrap(), 1000);
        for bad in ["-1", "x", "4294967295", ""] {
            assert!(id_of(&p(bad), "uid").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn requests_carry_the_scope_only_when_given() {
        let r = request((), &Some(Extension(FileScope::As(Identity { uid: 1000, gid: 100 }))));
        assert_eq!(r.metadata().get(METADATA_KEY).unwrap(), "1000:100");
        assert!(r.metadata().get(SESSION_KEY).is_none());
        assert!(request((), &None).metadata().get(METADATA_KEY).is_none());
        let r = request((), &Some(Extension(FileScope::Isolated("0b6e4a70-3c9c".into()))));
        assert_eq!(r.metadata().get(SESSION_KEY).unwrap(), "0b6e4a70-3c9c");
        assert!(r.metadata().get(METADATA_KEY).is_none());
        let r = request((), &Some(Extension(FileScope::Isolated("bad\nid".into()))));
        assert_eq!(r.metadata().get(SESSION_KEY).unwrap(), "-");
    }
}

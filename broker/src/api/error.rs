//! API errors: every error leaves as JSON `{code, message}` with its status.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "SANDBOX_NOT_FOUND", format!("sandbox {id} not found"))
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

/// True for the status tonic makes of a broken connection (`Unknown`, with a
/// transport, hyper or I/O error as its source): the worker or the agent
/// went away mid-request (killed, or its sandbox ended).
fn connection_lost(s: &tonic::Status) -> bool {
    use std::error::Error;
    if s.code() != tonic::Code::Unknown {
        return false;
    }
    let mut src: Option<&(dyn Error + 'static)> = s.source();
    while let Some(e) = src {
        if e.is::<tonic::transport::Error>() || e.is::<hyper::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        src = e.source();
    }
    false
}

/// The execd error of an isolated-session call the agent named in the
/// status details (`pvisor.agent.v1.ErrorDetail`).
fn isolated_error(s: &tonic::Status) -> Option<ApiError> {
    use prost::Message;
    use pvisor_proto::agent::{ErrorDetail, ErrorReason};
    if s.details().is_empty() {
        return None;
    }
    let reason = ErrorDetail::decode(s.details()).ok()?.reason();
    let msg = s.message().to_string();
    Some(match reason {
        ErrorReason::Unspecified => return None,
        ErrorReason::SessionNotFound => ApiError::new(StatusCode::NOT_FOUND, "SESSION_NOT_FOUND", msg),
        ErrorReason::RunNotFound => ApiError::new(StatusCode::NOT_FOUND, "RUN_NOT_FOUND", msg),
        ErrorReason::IsolationUnavailable => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ISOLATION_UNAVAILABLE", msg)
        }
        ErrorReason::SessionNotActive => ApiError::new(StatusCode::CONFLICT, "SESSION_NOT_ACTIVE", msg),
    })
}

/// Maps an agent or worker gRPC status onto the execd error vocabulary.
impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let msg = s.message().to_string();
        if connection_lost(&s) {
            return Self::new(
                StatusCode::BAD_GATEWAY,
                "SANDBOX_UNAVAILABLE",
                format!("connection to the sandbox lost: {msg}"),
            );
        }
        if let Some(e) = isolated_error(&s) {
            return e;
        }
        match s.code() {
            Code::NotFound => Self::new(StatusCode::NOT_FOUND, "FILE_NOT_FOUND", msg),
            Code::InvalidArgument | Code::OutOfRange => Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", msg),
            Code::PermissionDenied => Self::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", msg),
            Code::AlreadyExists => Self::new(StatusCode::CONFLICT, "ALREADY_EXISTS", msg),
            Code::FailedPrecondition => Self::new(StatusCode::CONFLICT, "FAILED_PRECONDITION", msg),
            Code::ResourceExhausted => Self::new(StatusCode::INSUFFICIENT_STORAGE, "RESOURCE_EXHAUSTED", msg),
            Code::Unavailable | Code::Cancelled => Self::new(StatusCode::BAD_GATEWAY, "SANDBOX_UNAVAILABLE", msg),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR", msg),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body with a clear 400 on failure.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    if body.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", "request body is empty"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", format!("invalid JSON body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_a_502_not_an_internal_error() {
        // What tonic makes of a worker or agent killed mid-request.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let e = ApiError::from(tonic::Status::from_error(Box::new(io)));
        assert_eq!(e.status, StatusCode::BAD_GATEWAY, "{e}");
        assert_eq!(e.code, "SANDBOX_UNAVAILABLE");
        assert!(e.message.starts_with("connection to the sandbox lost"), "{e}");
        // An agent's own Unknown status (no transport source) stays a runtime error.
        let e = ApiError::from(tonic::Status::unknown("boom"));
        assert_eq!((e.status, e.code), (StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"));
    }

    #[test]
    fn isolated_session_errors_keep_their_own_codes() {
        use prost::Message;
        use pvisor_proto::agent::{ErrorDetail, ErrorReason};
        let with = |code: tonic::Code, r: ErrorReason| {
            let d = ErrorDetail { reason: r as i32 }.encode_to_vec();
            ApiError::from(tonic::Status::with_details(code, "m", d.into()))
        };
        for (code, reason, status, api) in [
            (tonic::Code::NotFound, ErrorReason::SessionNotFound, StatusCode::NOT_FOUND, "SESSION_NOT_FOUND"),
            (tonic::Code::NotFound, ErrorReason::RunNotFound, StatusCode::NOT_FOUND, "RUN_NOT_FOUND"),
            (
                tonic::Code::Unavailable,
                ErrorReason::IsolationUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
                "ISOLATION_UNAVAILABLE",
            ),
            (
                tonic::Code::FailedPrecondition,
                ErrorReason::SessionNotActive,
                StatusCode::CONFLICT,
                "SESSION_NOT_ACTIVE",
            ),
            // No reason: the status code decides, as for every other call.
            (tonic::Code::NotFound, ErrorReason::Unspecified, StatusCode::NOT_FOUND, "FILE_NOT_FOUND"),
        ] {
            let e = with(code, reason);
            assert_eq!((e.status, e.code, e.message.as_str()), (status, api, "m"), "{reason:?}");
        }
        // Details that are not an ErrorDetail are ignored.
        let e = ApiError::from(tonic::Status::with_details(tonic::Code::NotFound, "m", vec![0xff, 0xff].into()));
        assert_eq!(e.code, "FILE_NOT_FOUND");
    }
}

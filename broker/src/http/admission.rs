//! Admission of creates: at most `--max-concurrent-creates` run at once
//! (429 `TOO_MANY_CREATES` with Retry-After past it: a create holds a worker,
//! an image server and disk work, and a client must not queue unbounded
//! amounts of them) and at most `--max-sandboxes` sandboxes exist, creating
//! ones included (429 `SANDBOX_LIMIT_REACHED`). Both are decided under one
//! lock, so parallel creates cannot overshoot either bound.
use crate::api::error::ApiError;
use axum::http::StatusCode;
use std::sync::{Arc, Mutex};

/// Seconds a client refused for concurrency should wait.
pub const RETRY_AFTER_SECS: u64 = 1;

pub struct Admission {
    max_creating: usize,
    max_sandboxes: usize,
    creating: Arc<Mutex<usize>>,
}

/// A create in progress; dropping it ends the create's claim (by then the
/// sandbox is in the registry, or the create failed).
#[derive(Debug)]
pub struct Creating {
    creating: Arc<Mutex<usize>>,
}

impl Drop for Creating {
    fn drop(&mut self) {
        *self.creating.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}

/// A refusal: the API error and, for transient ones, a retry delay.
#[derive(Debug)]
pub struct Refused {
    pub error: ApiError,
    pub retry_after: Option<u64>,
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> axum::response::Response {
        let mut r = self.error.into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

impl Admission {
    pub fn new(max_creating: usize, max_sandboxes: usize) -> Self {
        Admission { max_creating, max_sandboxes, creating: Arc::default() }
    }

    /// Admits one create while the server holds `existing` sandboxes.
    pub fn admit(&self, existing: usize) -> Result<Creating, Refused> {
        let mut n = self.creating.lock().unwrap_or_else(|e| e.into_inner());
        if existing + *n >= self.max_sandboxes {
            return Err(Refused {
                error: ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "SANDBOX_LIMIT_REACHED",
                    format!(
                        "this server holds at most {} sandboxes (pvisor serve --max-sandboxes); delete one first",
                        self.max_sandboxes
                    ),
                ),
                retry_after: None,
            });
        }
        if *n >= self.max_creating {
            return Err(Refused {
                error: ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TOO_MANY_CREATES",
                    format!("{} creates are in progress (pvisor serve --max-concurrent-creates)", self.max_creating),
                ),
                retry_after: Some(RETRY_AFTER_SECS),
            });
        }
        *n += 1;
        Ok(Creating { creating: self.creating.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_and_total_are_both_bounded() {
        let a = Admission::new(2, 3);
        let c1 = a.admit(0).unwrap();
        let c2 = a.admit(0).unwrap();
        let e = a.admit(0).unwrap_err();
        assert_eq!((e.error.code, e.retry_after), ("TOO_MANY_CREATES", Some(1)));
        drop(c1);
        let e = a.admit(2).unwrap_err();
        assert_eq!((e.error.code, e.retry_after), ("SANDBOX_LIMIT_REACHED", None), "2 existing + 1 creating");
        drop(c2);
        assert!(a.admit(2).is_ok());
    }
}

//! Admission of creates. At most `--max-concurrent-creates` run at once (a create holds a
//! worker, an image server and disk work); the ones past that wait in a FIFO queue and are
//! served in order. A create is refused with 429 `TOO_MANY_CREATES` and `Retry-After` only
//! when `--create-queue` creates already wait, or when it waited `--create-queue-wait-secs`
//! (well inside the official SDK's 30 s request timeout) without its turn. At most
//! `--max-sandboxes` sandboxes exist, creating and queued ones included (429
//! `SANDBOX_LIMIT_REACHED`): both bounds are decided under one lock, so parallel creates cannot
//! overshoot either.
use crate::api::error::ApiError;
use axum::http::StatusCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a client refused for concurrency should wait.
pub const RETRY_AFTER_SECS: u64 = 1;

pub struct Admission {
    max_sandboxes: usize,
    max_queued: usize,
    queue_wait: Duration,
    /// One permit per create allowed to run; tokio's semaphore grants waiters in FIFO order.
    slots: Arc<Semaphore>,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Creates admitted and not yet finished, running or queued (the sandbox bound counts them).
    claimed: usize,
    /// Of those, the ones waiting for a slot.
    queued: usize,
}

/// A create in progress; dropping it ends the create's claim and frees its slot (by then the
/// sandbox is in the registry, or the create failed).
#[derive(Debug)]
pub struct Creating {
    slot: Option<OwnedSemaphorePermit>,
    _claim: Claim,
}

impl Creating {
    /// Gives the create's slot to the next create while this one goes on
    /// (still counted among the sandboxes): for a create that only waits for
    /// its sandbox's pre-start hook.
    pub fn release_slot(&mut self) {
        self.slot = None;
    }
}

/// One create's share of [`Counts::claimed`] (or of `queued`), given back on drop: a client
/// that goes away while queued leaves no count behind.
#[derive(Debug)]
struct Claim {
    counts: Arc<Mutex<Counts>>,
    queued: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        if self.queued {
            c.queued -= 1;
        } else {
            c.claimed -= 1;
        }
    }
}

fn lock(m: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

fn too_many(message: String) -> Refused {
    Refused {
        error: ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_CREATES", message),
        retry_after: Some(RETRY_AFTER_SECS),
    }
}

impl Admission {
    pub fn new(max_creating: usize, max_queued: usize, queue_wait: Duration, max_sandboxes: usize) -> Self {
        Admission {
            max_sandboxes,
            max_queued,
            queue_wait,
            slots: Arc::new(Semaphore::new(max_creating)),
            counts: Arc::default(),
        }
    }

    /// Admits one create while the server holds `existing` sandboxes: at once where a slot is
    /// free, else after the creates queued before it.
    pub async fn admit(&self, existing: usize) -> Result<Creating, Refused> {
        let claim = {
            let mut c = lock(&self.counts);
            if existing + c.claimed >= self.max_sandboxes {
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
            // Under the lock: no other create can take the last slot between the check and
            // the count.
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                c.claimed += 1;
                return Ok(Creating { slot: Some(slot), _claim: Claim { counts: self.counts.clone(), queued: false } });
            }
            if c.queued >= self.max_queued {
                return Err(too_many(format!(
                    "{} creates are waiting for their turn (pvisor serve --create-queue)",
                    self.max_queued
                )));
            }
            c.claimed += 1;
            c.queued += 1;
            Claim { counts: self.counts.clone(), queued: false }
        };
        let waiting = Claim { counts: self.counts.clone(), queued: true };
        let slot = tokio::time::timeout(self.queue_wait, self.slots.clone().acquire_owned()).await;
        drop(waiting);
        match slot {
            Ok(Ok(slot)) => Ok(Creating { slot: Some(slot), _claim: claim }),
            Ok(Err(_closed)) => unreachable!("the semaphore is never closed"),
            Err(_elapsed) => Err(too_many(format!(
                "no create slot came free within {} s (pvisor serve --max-concurrent-creates, --create-queue-wait-secs)",
                self.queue_wait.as_secs()
            ))),
        }
    }

    /// Creates waiting for a slot now.
    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.counts).queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<Creating, Refused>) -> (&'static str, Option<u64>) {
        let e = r.unwrap_err();
        (e.error.code, e.retry_after)
    }

    #[tokio::test]
    async fn the_sandbox_bound_counts_creating_ones() {
        let a = Admission::new(2, 8, Duration::from_secs(5), 3);
        let c1 = a.admit(0).await.unwrap();
        let _c2 = a.admit(0).await.unwrap();
        assert_eq!(code(a.admit(1).await), ("SANDBOX_LIMIT_REACHED", None), "1 existing + 2 creating");
        drop(c1);
        assert!(a.admit(1).await.is_ok());
    }

    #[tokio::test]
    async fn creates_past_the_bound_wait_and_are_served_in_order() {
        let a = Arc::new(Admission::new(1, 8, Duration::from_secs(30), 100));
        let first = a.admit(0).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (mine, order) = (a.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let c = mine.admit(0).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
                drop(c);
            }));
            // Each waiter is queued before the next one starts.
            while a.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(a.queued(), 0);
        assert_eq!(lock(&a.counts).claimed, 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let a = Arc::new(Admission::new(1, 1, Duration::from_secs(30), 100));
        let _running = a.admit(0).await.unwrap();
        let queued = tokio::spawn({
            let a = a.clone();
            async move { a.admit(0).await.map(drop) }
        });
        while a.queued() < 1 {
            tokio::task::yield_now().await;
        }
        let e = a.admit(0).await.unwrap_err();
        assert_eq!((e.error.code, e.retry_after), ("TOO_MANY_CREATES", Some(1)));
        assert!(e.error.message.contains("--create-queue"), "{}", e.error.message);
        queued.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_that_waited_past_the_deadline_is_refused_and_leaves_no_count() {
        let a = Admission::new(1, 8, Duration::from_secs(20), 100);
        let running = a.admit(0).await.unwrap();
        let e = a.admit(0).await.unwrap_err();
        assert_eq!((e.error.code, e.retry_after), ("TOO_MANY_CREATES", Some(1)));
        assert!(e.error.message.contains("--create-queue-wait-secs"), "{}", e.error.message);
        let claimed = lock(&a.counts).claimed;
        assert_eq!((claimed, a.queued()), (1, 0));
        drop(running);
        assert!(a.admit(0).await.is_ok());
    }

    #[tokio::test]
    async fn a_client_gone_while_queued_gives_its_place_back() {
        let a = Arc::new(Admission::new(1, 8, Duration::from_secs(30), 100));
        let running = a.admit(0).await.unwrap();
        let gone = tokio::spawn({
            let a = a.clone();
            async move { a.admit(0).await.map(drop) }
        });
        while a.queued() < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        let claimed = lock(&a.counts).claimed;
        assert_eq!((claimed, a.queued()), (1, 0));
        drop(running);
        assert!(a.admit(0).await.is_ok());
    }

    #[tokio::test]
    async fn a_released_slot_serves_the_next_create_and_the_sandbox_stays_counted() {
        let a = Admission::new(1, 8, Duration::from_secs(30), 2);
        let mut hooked = a.admit(0).await.unwrap();
        hooked.release_slot();
        let next = a.admit(0).await.expect("the slot was given back");
        assert_eq!(code(a.admit(0).await), ("SANDBOX_LIMIT_REACHED", None), "both still count");
        drop((hooked, next));
        assert_eq!(lock(&a.counts).claimed, 0);
    }
}

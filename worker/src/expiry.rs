//! The sandbox's expiry, enforced by the worker itself, so a sandbox expires
//! on time whether or not a broker is running (a broker that is down or
//! restarting cannot sweep it). The broker sends the deadline in the
//! configuration (`WorkerConfig.deadline_unix_ms`) and on every renew
//! (`Worker.SetDeadline`). At the deadline the worker kills the sandbox and
//! exits with [`EXPIRED_EXIT_CODE`]; the broker, if there, treats that exit
//! as the expiry it is, not a failure.
use crate::backend::Sandbox;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The worker's exit status when its sandbox expired.
pub const EXPIRED_EXIT_CODE: i32 = 11;

/// Set once the sandbox expired: its end is then the expiry.
pub static EXPIRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Longest single sleep: the wall clock may be set meanwhile, so the
/// remaining time is measured again at least this often.
const RECHECK: Duration = Duration::from_secs(5);

/// The deadline in milliseconds since the Unix epoch (0: none), shared by
/// the service (which moves it) and the enforcing task.
pub type Deadline = watch::Sender<i64>;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Starts enforcing `deadline` on the current tokio runtime.
pub fn enforce(deadline: &Deadline, sandbox: Option<Arc<dyn Sandbox>>) {
    let mut rx = deadline.subscribe();
    tokio::spawn(async move {
        loop {
            let at = *rx.borrow_and_update();
            let wait = if at > 0 {
                let left = at - now_ms();
                if left <= 0 {
                    break;
                }
                Duration::from_millis(left as u64).min(RECHECK)
            } else {
                Duration::MAX
            };
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(wait) => {}
            }
        }
        eprintln!("pvisor-worker: the sandbox expired; ending it");
        EXPIRED.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(sb) = sandbox {
            sb.kill();
        }
        std::process::exit(EXPIRED_EXIT_CODE);
    });
}

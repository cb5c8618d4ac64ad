//! The periodic hooks' schedulers: one task per hook, firing at its
//! schedule's times (wall clock, UTC). A firing while the hook's previous
//! run is still going is skipped; a run that fails or times out is logged
//! and the next one happens as scheduled. Logs are rationed per hook: the
//! 1st, 2nd, 4th, 8th... failure in a row and the recovery after them, so a
//! hook failing every second does not fill the sandbox's log.
use super::run::run;
use crate::commands::Commands;
use pvisor_proto::agent::PeriodicHook;
use pvisor_schedule::Schedule;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest single sleep: the wall clock is looked at again at least this
/// often (it may be stepped: a vm guest's Refresh, a restored snapshot).
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// Starts a scheduler for each hook. A schedule that does not parse (the
/// broker checked it: only a newer broker's grammar) is logged and skipped.
pub fn start(commands: &Arc<Commands>, hooks: &[PeriodicHook]) {
    for hook in hooks {
        match Schedule::parse(&hook.schedule) {
            Ok(schedule) => {
                tokio::spawn(schedule_hook(commands.clone(), Arc::new(hook.clone()), schedule));
            }
            Err(e) => tracing::error!("periodic hook {:?} not scheduled: {e}", hook.name),
        }
    }
}

fn now_ms() -> i64 {
    pvisor_proto::now_ms()
}

/// Sleeps until the wall clock reads `at` (seconds since the epoch).
async fn sleep_until(at: i64) {
    loop {
        let left = at.saturating_mul(1000).saturating_sub(now_ms());
        if left <= 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(left as u64).min(MAX_SLEEP)).await;
    }
}

/// A hook's state across its runs.
#[derive(Default)]
struct Runs {
    /// A run is going.
    active: AtomicBool,
    /// Failures in a row.
    failures: AtomicU64,
}

async fn schedule_hook(commands: Arc<Commands>, hook: Arc<PeriodicHook>, schedule: Schedule) {
    let runs = Arc::new(Runs::default());
    let mut next = schedule.next_after(now_ms() / 1000);
    while let Some(at) = next {
        sleep_until(at).await;
        if runs.active.swap(true, Ordering::AcqRel) {
            tracing::info!("periodic hook {:?} skipped: its previous run is still going", hook.name);
        } else {
            tokio::spawn(run_once(commands.clone(), hook.clone(), runs.clone()));
        }
        // From the firing just made, or from now if it came late (a frozen
        // sandbox thawed): missed firings are not made up.
        next = schedule.next_after(at.max(now_ms() / 1000));
    }
    tracing::warn!("periodic hook {:?} ({}) has no further firing", hook.name, hook.schedule);
}

async fn run_once(commands: Arc<Commands>, hook: Arc<PeriodicHook>, runs: Arc<Runs>) {
    let spec = hook.hook.clone().unwrap_or_default();
    let outcome = run(&commands, &spec).await;
    runs.active.store(false, Ordering::Release);
    if outcome.succeeded() {
        let failed = runs.failures.swap(0, Ordering::AcqRel);
        if failed > 0 {
            tracing::warn!("periodic hook {:?} succeeded again after {failed} failed run(s)", hook.name);
        }
        return;
    }
    let n = runs.failures.fetch_add(1, Ordering::AcqRel) + 1;
    if n.is_power_of_two() {
        let last = outcome.output.lines().last().unwrap_or("");
        tracing::warn!(
            "periodic hook {:?} {} ({n} failed run(s) in a row); its output ended with: {last:?}",
            hook.name,
            outcome.describe(spec.timeout_secs)
        );
    }
}

//! Deletes sandboxes whose timeout has passed.
use crate::server::Ctx;
use std::sync::Arc;
use std::time::Duration;

/// How often expiries are checked.
const TICK: Duration = Duration::from_millis(250);

pub fn spawn(ctx: Arc<Ctx>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            for e in ctx.registry.take_expired(chrono::Utc::now()) {
                tracing::info!(sandbox = %e.id, "expired");
                super::teardown::teardown(&e).await;
            }
        }
    });
}

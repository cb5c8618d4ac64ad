//! Deletes sandboxes whose timeout has passed, and stops image servers no
//! sandbox has used for a while.
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
            let in_use = ctx.registry.list().into_iter().map(|e| e.image_id.clone()).collect();
            let c = ctx.clone();
            // Stopping a server waits for it (briefly): off the async threads.
            let _ = tokio::task::spawn_blocking(move || c.mounts.reap(&in_use, c.image_idle)).await;
        }
    });
}

//! Deletes sandboxes whose timeout has passed, fails the sandboxes whose
//! image server died (their root is gone), stops image servers no sandbox
//! has used for a while, and replaces warm workers that died.
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
                e.save();
                super::teardown::teardown(&e).await;
                e.forget();
                crate::metrics::events().deleted(&e.id, "expired");
            }
            let dead = ctx.mounts.take_dead();
            // Warm sandboxes that died, or whose root went with their image server.
            let (broken, templates) = ctx.catalog.warm.take_broken(&dead);
            if !broken.is_empty() {
                tracing::warn!(count = broken.len(), "warm sandboxes ended; replaced");
                crate::catalog::warm::discard(broken).await;
                for t in templates {
                    crate::catalog::warm::top_up(ctx.clone(), t, std::time::Duration::ZERO);
                }
            }
            fail_rootless(&ctx, dead).await;
            let mut in_use: std::collections::HashSet<String> =
                ctx.registry.list().into_iter().map(|e| e.image_id.clone()).collect();
            in_use.extend(ctx.catalog.warm.image_ids());
            let c = ctx.clone();
            // Stopping a server waits for it (briefly), and removing a dead warm
            // worker's cgroup is synchronous: off the async threads.
            let pruned = tokio::task::spawn_blocking(move || {
                c.mounts.reap(&in_use, c.image_idle);
                c.pool.prune()
            })
            .await
            .unwrap_or(0);
            if pruned > 0 {
                super::pool::Pool::refill(ctx.clone());
            }
        }
    });
}

/// Fails the live ns sandboxes of images whose server died: their root file
/// system answers ENOTCONN from now on, so they are reported Failed
/// (`IMAGE_SERVER_EXITED`) and released, never left running broken.
/// Only sandboxes made before the death was noticed: a create that found the
/// server dead started a new one, and what it and later creates made uses that.
async fn fail_rootless(ctx: &Ctx, dead: Vec<super::images::Death>) {
    if dead.is_empty() {
        return;
    }
    for e in ctx.registry.list() {
        let ns = e.origin.backend != Some(pvisor_worker::config::BackendKind::Vm);
        let rootless = dead.iter().any(|d| d.image_id == e.image_id && e.created_at <= d.noticed);
        if !ns || !rootless || e.is_deleting() || e.worker_log().is_none() {
            continue;
        }
        tracing::warn!(sandbox = %e.id, "the image server of its image exited");
        e.set_state(
            super::State::Failed,
            Some(crate::durable::recover::IMAGE_SERVER_EXITED.into()),
            Some("the image server of the sandbox's image exited; its root file system is gone".into()),
        );
        super::teardown::teardown(&e).await;
    }
}

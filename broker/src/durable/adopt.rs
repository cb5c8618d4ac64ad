//! Once the server is built and before it answers requests: each record of
//! a [`super::Recovery`] becomes a registry entry again. A live worker is
//! re-adopted (its socket connected, `Worker.Ready` asked, its sandbox
//! thawed in case a snapshot's capture froze it when the broker died, its
//! deadline sent again, its exit watched through the pidfd); a record whose
//! sandbox no longer runs is shown as it ended; a dropped one is removed.
use super::proc;
use super::recover::{Fate, Found, WORKER_EXITED, WORKER_EXITED_MESSAGE};
use super::store::SandboxRecord;
use crate::sandbox::record::Runtime;
use crate::sandbox::{launch, SandboxEntry, State};
use crate::server::Ctx;
use pvisor_proto::worker as pb;
use pvisor_proto::worker::worker_client::WorkerClient;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

/// How long a re-adopted worker may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a worker that does not answer is given to finish exiting.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Re-adopts every record, all at once; returns how many sandboxes run.
pub async fn adopt_all(ctx: &Arc<Ctx>, found: Vec<Found>) -> usize {
    let jobs = found.into_iter().map(|f| adopt_one(ctx.clone(), f));
    futures::future::join_all(jobs).await.into_iter().filter(|live| *live).count()
}

async fn adopt_one(ctx: Arc<Ctx>, Found { rec, fate }: Found) -> bool {
    match fate {
        Fate::Drop => {
            tracing::info!(sandbox = %rec.id, "record of a sandbox that ended with the previous broker removed");
            if let Err(e) = ctx.state.remove(&rec.id) {
                tracing::error!(sandbox = %rec.id, "{e}");
            }
            // Volumes made for it alone go with it.
            let c = ctx.clone();
            let del = rec.volumes_to_delete.clone();
            let _ = tokio::task::spawn_blocking(move || {
                drop(crate::volumes::Held::reacquire(&c.volumes.store, &[], &del));
            })
            .await;
            false
        }
        Fate::Ended => {
            insert(&ctx, SandboxEntry::restored(&rec, None), true);
            false
        }
        Fate::Adopt(pidfd) => match reconnect(&rec).await {
            Ok(channel) => {
                let entry = insert(&ctx, SandboxEntry::restored(&rec, runtime(&ctx, &rec, channel, pidfd)), false);
                resync(&entry, &rec).await;
                launch::monitor_adopted(ctx.clone(), entry.clone());
                tracing::info!(sandbox = %rec.id, "re-adopted");
                true
            }
            Err(msg) => {
                // A worker killed just before this start may still be exiting: its
                // threads end after /proc already shows it a zombie, and the pidfd
                // reports the exit only then. One that ends within the grace exited;
                // it was not unreachable.
                let exited = tokio::time::timeout(EXIT_GRACE, proc::wait_exit(&pidfd)).await.is_ok();
                let (reason, msg) = if exited {
                    tracing::info!(sandbox = %rec.id, "the worker exited while the broker was down");
                    (WORKER_EXITED, WORKER_EXITED_MESSAGE.to_string())
                } else {
                    tracing::warn!(sandbox = %rec.id, "{msg}");
                    proc::pidfd_signal(&pidfd, libc::SIGKILL);
                    ("WORKER_UNREACHABLE", msg)
                };
                let entry =
                    insert(&ctx, SandboxEntry::restored(&rec, runtime_without_channel(&ctx, &rec, pidfd)), false);
                entry.set_state(State::Failed, Some(reason.into()), Some(msg));
                crate::sandbox::teardown::teardown(&entry).await;
                false
            }
        },
    }
}

/// Registers a restored entry; `changed`: its record differs from the one
/// on disk (an adopted sandbox's does not).
fn insert(ctx: &Ctx, e: SandboxEntry, changed: bool) -> Arc<SandboxEntry> {
    let e = Arc::new(e);
    e.attach_store(ctx.state.clone());
    if changed {
        e.save();
    }
    ctx.registry.insert(e.clone());
    e
}

async fn reconnect(rec: &SandboxRecord) -> Result<tonic::transport::Channel, String> {
    let Some(w) = &rec.worker else { return Err("no worker recorded".into()) };
    let connect = pvisor_worker::launch::connect_unix(&w.socket);
    let channel = match tokio::time::timeout(ANSWER_TIMEOUT, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(format!("re-adopting the worker: connect: {e}")),
        Err(_) => return Err("re-adopting the worker: no connection".into()),
    };
    let mut client = WorkerClient::new(channel.clone());
    match tokio::time::timeout(ANSWER_TIMEOUT, client.ready(pb::Empty {})).await {
        Ok(Ok(_)) => Ok(channel),
        Ok(Err(s)) => Err(format!("re-adopting the worker: {}", s.message())),
        Err(_) => Err("re-adopting the worker: no answer".into()),
    }
}

fn runtime(ctx: &Ctx, rec: &SandboxRecord, channel: tonic::transport::Channel, pidfd: OwnedFd) -> Option<Runtime> {
    let mut rt = runtime_without_channel(ctx, rec, pidfd)?;
    rt.channel = channel;
    Some(rt)
}

/// The runtime of a recorded worker (the channel connects lazily: only a
/// worker that answered gets a usable one, see [`reconnect`]).
fn runtime_without_channel(ctx: &Ctx, rec: &SandboxRecord, pidfd: OwnedFd) -> Option<Runtime> {
    let w = rec.worker.clone()?;
    let volumes = crate::volumes::Held::reacquire(&ctx.volumes.store, &rec.volumes_in_use, &rec.volumes_to_delete);
    Some(Runtime {
        channel: tonic::transport::Endpoint::from_static("http://unix").connect_lazy(),
        worker_pid: w.proc.pid,
        worker_pidfd: Some(pidfd),
        worker_proc: Some(w.proc),
        cgroup: w.cgroup,
        state_dir: w.state_dir,
        socket: w.socket,
        log: w.log,
        lifeline: None,
        volumes: Some(volumes),
    })
}

/// Brings the worker in line with the record: a sandbox recorded Running
/// is thawed (a capture the old broker started froze it), and the worker
/// gets the recorded deadline (a renew may have been saved but not sent).
async fn resync(entry: &SandboxEntry, rec: &SandboxRecord) {
    let Ok(channel) = entry.channel() else { return };
    let mut client = WorkerClient::new(channel);
    if entry.status().state == State::Running && rec.origin.backend != Some(pvisor_worker::config::BackendKind::Vm) {
        if let Err(s) = client.resume(pb::Empty {}).await {
            tracing::debug!(sandbox = %rec.id, "thaw after re-adoption: {}", s.message());
        }
    }
    let unix_ms = rec.expires_at.map(|t| t.timestamp_millis()).unwrap_or(0);
    if let Err(s) = client.set_deadline(pb::Deadline { unix_ms }).await {
        tracing::warn!(sandbox = %rec.id, "sending the deadline: {}", s.message());
    }
}

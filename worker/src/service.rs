//! The `pvisor.worker.v1.Worker` gRPC service.
use crate::backend::Sandbox;
use crate::cgroup::GroupPaths;
use crate::config::Limits;
use crate::netd::{Netd, NetdError};
use pvisor_proto::worker::worker_server::Worker;
use pvisor_proto::worker::{Deadline, Empty, MetricsReply, ReadyReply, SnapshotReply, SnapshotRequest};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Where the sandbox is on its way up.
#[derive(Clone, Debug)]
pub enum Readiness {
    Starting,
    Ready(ReadyReply),
    Failed(String),
    /// The agent's own refusal, relayed as it is: its pre-start hook failed
    /// (ABORTED, a `HookFailure` in the details).
    HookFailed(Status),
}

pub struct WorkerService {
    pub sandbox: Option<Arc<dyn Sandbox>>,
    /// The sandbox's network process, when the sandbox has a network.
    pub netd: Option<Arc<Netd>>,
    pub ready: watch::Receiver<Readiness>,
    pub cgroup: Option<GroupPaths>,
    pub limits: Limits,
    /// The sandbox's expiry, enforced by [`crate::expiry`].
    pub deadline: Arc<crate::expiry::Deadline>,
    cpu_sample: Mutex<(Instant, u64)>,
}

impl WorkerService {
    pub fn new(
        sandbox: Option<Arc<dyn Sandbox>>,
        netd: Option<Arc<Netd>>,
        ready: watch::Receiver<Readiness>,
        cgroup: Option<GroupPaths>,
        limits: Limits,
        deadline: Arc<crate::expiry::Deadline>,
    ) -> Self {
        let used = cgroup.as_ref().and_then(|g| g.cpu_usage_us()).unwrap_or(0);
        WorkerService { sandbox, netd, ready, cgroup, limits, deadline, cpu_sample: Mutex::new((Instant::now(), used)) }
    }

    fn sandbox(&self) -> Result<Arc<dyn Sandbox>, Status> {
        self.sandbox.clone().ok_or_else(|| Status::failed_precondition("the sandbox did not start"))
    }

    fn netd(&self) -> Result<Arc<Netd>, Status> {
        self.sandbox()?;
        self.netd.clone().ok_or_else(|| Status::failed_precondition("the sandbox has no network"))
    }
}

/// A netd request's outcome as a gRPC status: a netd that is gone or hung
/// is UNAVAILABLE (the sandbox's network is lost, not the request's fault).
fn netd_status<T>(r: Result<crate::netd::Result<T>, tokio::task::JoinError>) -> Result<T, Status> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e @ (NetdError::Gone(_) | NetdError::Timeout))) => Err(Status::unavailable(e.to_string())),
        Ok(Err(e @ NetdError::Refused(_))) => Err(Status::invalid_argument(e.to_string())),
        Ok(Err(e)) => Err(Status::internal(e.to_string())),
        Err(e) => Err(Status::internal(e.to_string())),
    }
}

fn blocking_status(r: Result<crate::error::Result<()>, tokio::task::JoinError>) -> Result<Response<Empty>, Status> {
    match r {
        Ok(Ok(())) => Ok(Response::new(Empty {})),
        Ok(Err(e)) => Err(Status::internal(e.to_string())),
        Err(e) => Err(Status::internal(e.to_string())),
    }
}

#[tonic::async_trait]
impl Worker for WorkerService {
    async fn ready(&self, _: Request<Empty>) -> Result<Response<ReadyReply>, Status> {
        let mut rx = self.ready.clone();
        let state = rx
            .wait_for(|s| !matches!(s, Readiness::Starting))
            .await
            .map_err(|_| Status::unavailable("worker is shutting down"))?
            .clone();
        match state {
            Readiness::Ready(r) => Ok(Response::new(r)),
            Readiness::Failed(m) => Err(Status::failed_precondition(m)),
            Readiness::HookFailed(s) => Err(s),
            Readiness::Starting => unreachable!("waited for a final state"),
        }
    }

    async fn metrics(&self, _: Request<Empty>) -> Result<Response<MetricsReply>, Status> {
        let g = self.cgroup.as_ref();
        let used = g.and_then(|g| g.cpu_usage_us()).unwrap_or(0);
        let cpu_count = self.limits.cpu_millis as f64 / 1000.0;
        let pct = {
            let mut s = self.cpu_sample.lock().unwrap_or_else(|e| e.into_inner());
            let wall = s.0.elapsed().as_micros().max(1) as f64;
            let pct = (used.saturating_sub(s.1) as f64 / wall) * 100.0 / cpu_count.max(0.001);
            *s = (Instant::now(), used);
            pct.clamp(0.0, 100.0)
        };
        let ksm = crate::ksm::counts(&g.map(|g| g.pids()).unwrap_or_default());
        Ok(Response::new(MetricsReply {
            cpu_count,
            cpu_used_pct: pct,
            mem_total_bytes: self.limits.memory_bytes,
            mem_used_bytes: g.and_then(|g| g.memory_usage()).unwrap_or(0),
            ksm_merging_pages: ksm.merging_pages,
            ksm_profit_bytes: ksm.profit_bytes,
        }))
    }

    async fn pause(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        let sb = self.sandbox()?;
        blocking_status(tokio::task::spawn_blocking(move || sb.pause()).await)
    }

    async fn resume(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        let sb = self.sandbox()?;
        blocking_status(tokio::task::spawn_blocking(move || sb.resume()).await)
    }

    async fn shutdown(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        crate::SHUTTING_DOWN.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(sb) = &self.sandbox {
            sb.kill();
        }
        tokio::spawn(async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            std::process::exit(0);
        });
        Ok(Response::new(Empty {}))
    }

    async fn set_egress_policy(
        &self,
        req: Request<pvisor_proto::net::EgressPolicy>,
    ) -> Result<Response<Empty>, Status> {
        let netd = self.netd()?;
        let policy = req.into_inner();
        netd_status(tokio::task::spawn_blocking(move || netd.set_policy(&policy)).await)?;
        Ok(Response::new(Empty {}))
    }

    async fn set_deadline(&self, req: Request<Deadline>) -> Result<Response<Empty>, Status> {
        let at = req.into_inner().unix_ms;
        if at < 0 {
            return Err(Status::invalid_argument("a deadline is a time after the epoch, or 0 for none"));
        }
        self.deadline.send_replace(at);
        Ok(Response::new(Empty {}))
    }

    async fn snapshot(&self, req: Request<SnapshotRequest>) -> Result<Response<SnapshotReply>, Status> {
        let sb = self.sandbox()?;
        let req = req.into_inner();
        let files = crate::backend::SnapshotFiles {
            state: req.state_path.into(),
            memory: req.memory_path.into(),
            scratch: req.scratch_path.into(),
        };
        if [&files.state, &files.memory, &files.scratch].iter().any(|p| !p.is_absolute() || p.exists()) {
            return Err(Status::invalid_argument(
                "state_path, memory_path and scratch_path must be absolute paths of files that do not exist",
            ));
        }
        match tokio::task::spawn_blocking(move || sb.snapshot(&files)).await {
            Ok(Ok(t)) => Ok(Response::new(SnapshotReply {
                cmdline: t.cmdline,
                state_bytes: t.state_bytes,
                stopped_us: t.stopped.as_micros() as u64,
            })),
            Ok(Err(crate::error::WorkerError::Unsupported(m))) => Err(Status::unimplemented(m)),
            Ok(Err(e)) => Err(Status::internal(e.to_string())),
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }

    async fn net_stats(&self, _: Request<Empty>) -> Result<Response<pvisor_proto::net::NetStats>, Status> {
        let netd = self.netd()?;
        Ok(Response::new(netd_status(tokio::task::spawn_blocking(move || netd.stats()).await)?))
    }
}

//! One sandbox's record: immutable facts, mutable status, and the live
//! runtime handles (gone once torn down).
use super::events::{EventKind, EventLog};
use crate::api::error::ApiError;
use chrono::{DateTime, SecondsFormat, Utc};
use pvisor_net::policy::Policy;
use pvisor_worker::cgroup::GroupPaths;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use tonic::transport::Channel;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Paused,
    Failed,
    /// Ended by something outside the sandbox (the host restarted).
    Terminated,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "Running",
            State::Paused => "Paused",
            State::Failed => "Failed",
            State::Terminated => "Terminated",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        [State::Running, State::Paused, State::Failed, State::Terminated].into_iter().find(|x| x.as_str() == s)
    }
}

pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub since: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub metadata: BTreeMap<String, String>,
}

/// Handles of a live sandbox.
pub struct Runtime {
    pub channel: Channel,
    pub worker_pid: u32,
    /// A pidfd of the worker: signals through it can never hit a recycled pid.
    pub worker_pidfd: Option<OwnedFd>,
    /// The worker's identity, so a restarted broker can find it again.
    pub worker_proc: Option<crate::durable::proc::ProcId>,
    pub cgroup: Option<GroupPaths>,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The broker's end of the worker's lifeline pipe (closing it tells the
    /// worker the broker is gone); none for a worker re-adopted after a restart.
    pub lifeline: Option<OwnedFd>,
    /// The sandbox's named volumes in use (and those to delete with it).
    pub volumes: Option<crate::volumes::Held>,
}

pub struct SandboxEntry {
    pub id: String,
    /// Data-plane token handed out in endpoint headers.
    pub token: String,
    pub image_uri: String,
    /// The pool id the uri resolved to (whose image server the sandbox uses).
    pub image_id: String,
    pub entrypoint: Vec<String>,
    pub created_at: DateTime<Utc>,
    status: Mutex<Status>,
    runtime: Mutex<Option<Runtime>>,
    /// Set when the broker itself ends the sandbox (delete, expiry).
    deleting: AtomicBool,
    /// The egress policy (`None`: no network, loopback only). The broker owns
    /// it; the lock is held across a push to the worker, so edits, pause and
    /// resume apply in one order (see [`super::egress`]).
    pub egress: tokio::sync::Mutex<Option<Policy>>,
    /// Lifecycle events for the diagnostics API.
    pub events: EventLog,
    /// Held by a snapshot from the sandbox's stop (freeze, or vCPUs) to its resume, so two
    /// snapshots of one sandbox take turns instead of one resuming it under the other.
    pub snapshot_lock: tokio::sync::Mutex<()>,
    /// What snapshots need to know of it (backend, env, its own snapshot).
    pub origin: crate::snapshot::Origin,
    /// What the create asked for that the API shows back.
    pub requested: super::requested::Requested,
    /// Where the record is kept on disk (unset in unit tests).
    store: std::sync::OnceLock<std::sync::Arc<crate::durable::SandboxStore>>,
    /// Serializes writes of the record, so the last change is the one on
    /// disk; true once the record is removed (a late save must not bring it back).
    save_lock: Mutex<bool>,
    /// The egress policy as last saved (the live one is behind an async lock).
    egress_saved: Mutex<Option<serde_json::Value>>,
}

impl SandboxEntry {
    /// Records the pool id of the sandbox's image.
    /// When the create began (the default is when the entry was made, after the launch).
    pub fn with_created_at(mut self, at: DateTime<Utc>) -> Self {
        self.created_at = at;
        self
    }

    pub fn with_image_id(mut self, image_id: String) -> Self {
        self.image_id = image_id;
        self
    }

    /// Records what a snapshot of the sandbox needs (see [`crate::snapshot`]).
    pub fn with_origin(mut self, origin: crate::snapshot::Origin) -> Self {
        self.origin = origin;
        self
    }

    /// Records what the create asked for that the API shows back.
    pub fn with_requested(mut self, requested: super::requested::Requested) -> Self {
        self.requested = requested;
        self
    }

    /// The live sandbox's state dir and cgroup (for a snapshot's capture).
    pub fn runtime_dirs(&self) -> Option<(PathBuf, Option<GroupPaths>)> {
        let rt = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        rt.as_ref().map(|r| (r.state_dir.clone(), r.cgroup.clone()))
    }

    /// Records the sandbox's egress policy (`None`: no network).
    pub fn with_egress(mut self, policy: Option<Policy>) -> Self {
        *self.egress_saved.get_mut().unwrap_or_else(|e| e.into_inner()) = policy.as_ref().map(Policy::to_json);
        self.egress = tokio::sync::Mutex::new(policy);
        self
    }

    /// A sandbox as a previous broker recorded it, with its re-adopted
    /// runtime (None: nothing of it runs any more).
    pub fn restored(rec: &crate::durable::SandboxRecord, runtime: Option<Runtime>) -> Self {
        let policy = rec.egress.as_ref().and_then(|v| match Policy::from_json(v) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(sandbox = %rec.id, "recorded egress policy: {e}; the sandbox keeps its netd's");
                None
            }
        });
        let events = EventLog::default();
        events.push(
            EventKind::Created,
            Some(format!("re-adopted after a broker restart (created {})", rfc3339(&rec.created_at))),
        );
        let mut e = SandboxEntry::new(
            rec.id.clone(),
            rec.token.clone(),
            rec.image_uri.clone(),
            rec.entrypoint.clone(),
            rec.expires_at,
            rec.metadata.clone(),
            runtime,
        )
        .with_image_id(rec.image_id.clone())
        .with_origin(rec.origin.clone())
        .with_requested(rec.requested.clone())
        .with_egress(policy);
        e.created_at = rec.created_at;
        e.events = events;
        {
            let s = e.status.get_mut().unwrap_or_else(|p| p.into_inner());
            s.state = State::parse(&rec.state).unwrap_or(State::Failed);
            s.reason = rec.reason.clone();
            s.message = rec.message.clone();
            s.since = rec.since;
        }
        e
    }

    /// Where the record is written from now on (once, at registry insert).
    pub fn attach_store(&self, store: std::sync::Arc<crate::durable::SandboxStore>) {
        let _ = self.store.set(store);
    }

    /// The record as it is now.
    pub fn to_record(&self) -> crate::durable::SandboxRecord {
        let s = self.status().clone();
        let rt = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let worker = rt.as_ref().and_then(|r| {
            r.worker_proc.clone().map(|proc| crate::durable::store::WorkerRecord {
                proc,
                socket: r.socket.clone(),
                log: r.log.clone(),
                state_dir: r.state_dir.clone(),
                cgroup: r.cgroup.clone(),
            })
        });
        let (volumes_in_use, volumes_to_delete) =
            rt.as_ref().and_then(|r| r.volumes.as_ref()).map(|v| v.names()).unwrap_or_default();
        drop(rt);
        crate::durable::SandboxRecord {
            id: self.id.clone(),
            token: self.token.clone(),
            image_uri: self.image_uri.clone(),
            image_id: self.image_id.clone(),
            entrypoint: self.entrypoint.clone(),
            created_at: self.created_at,
            state: s.state.as_str().into(),
            reason: s.reason,
            message: s.message,
            since: s.since,
            expires_at: s.expires_at,
            metadata: s.metadata,
            egress: self.egress_saved.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            origin: self.origin.clone(),
            requested: self.requested.clone(),
            worker,
            volumes_in_use,
            volumes_to_delete,
            deleting: self.is_deleting(),
        }
    }

    /// Writes the record to disk (a failure is logged: the sandbox itself
    /// is fine, only a restart would not find this change).
    pub fn save(&self) {
        let Some(store) = self.store.get() else { return };
        let forgotten = self.save_lock.lock().unwrap_or_else(|e| e.into_inner());
        if *forgotten {
            return;
        }
        if let Err(e) = store.write(&self.to_record()) {
            tracing::error!(sandbox = %self.id, "saving the sandbox's record: {e}");
        }
    }

    /// Saves a changed egress policy.
    pub fn save_egress(&self, policy: Option<&Policy>) {
        *self.egress_saved.lock().unwrap_or_else(|e| e.into_inner()) = policy.map(Policy::to_json);
        self.save();
    }

    /// Removes the record from disk (the sandbox is gone for good).
    pub fn forget(&self) {
        let Some(store) = self.store.get() else { return };
        let mut forgotten = self.save_lock.lock().unwrap_or_else(|e| e.into_inner());
        *forgotten = true;
        if let Err(e) = store.remove(&self.id) {
            tracing::error!(sandbox = %self.id, "removing the sandbox's record: {e}");
        }
    }

    pub fn new(
        id: String,
        token: String,
        image_uri: String,
        entrypoint: Vec<String>,
        expires_at: Option<DateTime<Utc>>,
        metadata: BTreeMap<String, String>,
        runtime: impl Into<Option<Runtime>>,
    ) -> Self {
        let now = Utc::now();
        let events = EventLog::default();
        events.push(EventKind::Created, None);
        SandboxEntry {
            id,
            token,
            image_uri,
            image_id: String::new(),
            entrypoint,
            created_at: now,
            status: Mutex::new(Status {
                state: State::Running,
                reason: None,
                message: None,
                since: now,
                expires_at,
                metadata,
            }),
            runtime: Mutex::new(runtime.into()),
            deleting: AtomicBool::new(false),
            egress: tokio::sync::Mutex::new(None),
            events,
            snapshot_lock: tokio::sync::Mutex::new(()),
            origin: Default::default(),
            requested: Default::default(),
            store: Default::default(),
            save_lock: Mutex::new(false),
            egress_saved: Mutex::new(None),
        }
    }

    pub fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_state(&self, state: State, reason: Option<String>, message: Option<String>) {
        if state == State::Failed {
            crate::metrics::events().sandbox_failed(reason.as_deref());
            let detail = [reason.as_deref(), message.as_deref()].into_iter().flatten().collect::<Vec<_>>().join(": ");
            self.events.push(EventKind::Failed, Some(detail).filter(|d| !d.is_empty()));
        }
        {
            let mut s = self.status();
            s.state = state;
            s.reason = reason;
            s.message = message;
            s.since = Utc::now();
        }
        self.save();
    }

    /// Moves between live states (pause/resume) unless the sandbox failed or
    /// is being deleted meanwhile; returns whether it did.
    pub fn transition_live(&self, to: State) -> bool {
        {
            let mut s = self.status();
            if matches!(s.state, State::Failed | State::Terminated) || self.is_deleting() {
                return false;
            }
            if s.state != to {
                self.events.push(if to == State::Paused { EventKind::Paused } else { EventKind::Resumed }, None);
            }
            s.state = to;
            s.reason = None;
            s.message = None;
            s.since = Utc::now();
        }
        self.save();
        true
    }

    pub fn mark_deleting(&self) {
        if !self.deleting.swap(true, Ordering::SeqCst) {
            self.events.push(EventKind::Terminating, None);
        }
    }

    pub fn is_deleting(&self) -> bool {
        self.deleting.load(Ordering::SeqCst)
    }

    pub fn take_runtime(&self) -> Option<Runtime> {
        self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// A pidfd of the worker and its log, to watch its exit.
    pub fn worker_watch(&self) -> Option<(OwnedFd, PathBuf)> {
        let rt = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let r = rt.as_ref()?;
        Some((r.worker_pidfd.as_ref()?.try_clone().ok()?, r.log.clone()))
    }

    /// The worker's pid and the sandbox's cgroup, while the sandbox is live
    /// (for `pvisor ps` and the metrics).
    pub fn process(&self) -> Option<(u32, Option<GroupPaths>)> {
        let rt = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        rt.as_ref().map(|r| (r.worker_pid, r.cgroup.clone()))
    }

    /// The backend's name (`ns`, `vm`; empty for records older than backends).
    pub fn backend_name(&self) -> &'static str {
        self.origin.backend.map(|b| b.name()).unwrap_or("")
    }

    /// The worker's log file, while the sandbox is live.
    pub fn worker_log(&self) -> Option<PathBuf> {
        self.runtime.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|r| r.log.clone())
    }

    /// The gRPC channel to the worker, if the sandbox is live.
    pub fn channel(&self) -> Result<Channel, ApiError> {
        let rt = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        match rt.as_ref() {
            Some(r) => Ok(r.channel.clone()),
            None => {
                let s = self.status();
                Err(ApiError::conflict(
                    "SANDBOX_NOT_RUNNING",
                    format!(
                        "sandbox {} is {}{}",
                        self.id,
                        s.state.as_str(),
                        s.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
                    ),
                ))
            }
        }
    }

    /// Like [`channel`](Self::channel), but refuses a paused sandbox.
    pub fn running_channel(&self) -> Result<Channel, ApiError> {
        if self.status().state == State::Paused {
            return Err(ApiError::conflict("SANDBOX_PAUSED", format!("sandbox {} is paused", self.id)));
        }
        self.channel()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_after_forget_does_not_bring_the_record_back() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = std::sync::Arc::new(crate::durable::SandboxStore::open(d.path()).expect("open"));
        let id = "0123abcd-0000-4000-8000-000000000000";
        let e = SandboxEntry::new(id.into(), "t".into(), "img".into(), vec![], None, BTreeMap::new(), None);
        e.attach_store(store.clone());
        e.save();
        assert_eq!(store.load().expect("load").len(), 1);
        e.forget();
        // A teardown or state change that finishes after the delete.
        e.set_state(State::Failed, Some("WORKER_EXITED".into()), None);
        e.save();
        assert!(store.load().expect("load").is_empty());
    }
}

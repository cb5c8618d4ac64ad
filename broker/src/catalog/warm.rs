//! Warm sandboxes: for each template, sandboxes started ahead of demand
//! with the template's settings (`pvisor serve --template-warm N`, 1 by
//! default), so a create from the template takes one that already runs
//! (worker, root file system, agent configured, entrypoint started; on the
//! vm backend a booted guest) and only gives it its expiry, metadata and a
//! place in the registry.
//!
//! A warm sandbox is an ordinary sandbox that nobody has yet: launched like
//! a create of the template's settings (the server's default backend and
//! egress; `--vm-templates` makes a vm one a clone of the booted template),
//! not in the registry, and recorded on disk as *deleting*, so a broker that
//! dies leaves nothing of it behind: the next one ends it at start-up like
//! any delete it finds decided (`durable::recover`). Handing it out writes
//! its record again, as the create's, before the 202.
//!
//! A create takes one only where that changes nothing it asked for: on the
//! default backend, of the image the template's name resolves to now, and
//! without a `networkPolicy` of its own (the warm sandbox's processes ran
//! under the default policy, and open connections outlive a policy
//! change). Any other create from the template starts its sandbox then.
//!
//! A template's `readiness` gates hand-outs: a warm sandbox is offered once
//! its probe passes (`tcp://127.0.0.1:PORT` accepts, `cmd://COMMAND` exits
//! 0), or when `warmupSeconds` (60) passed without that; with no probe it is
//! offered after `warmupSeconds`. A create that starts its own sandbox does
//! not wait for the gate.
use crate::api::lifecycle::{self, Launched};
use crate::sandbox::requested::Requested;
use crate::sandbox::teardown::teardown;
use crate::sandbox::SandboxEntry;
use crate::server::Ctx;
use chrono::{DateTime, Utc};
use pvisor_net::policy::Policy;
use pvisor_worker::config::BackendKind;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::record::{Probe, Readiness, TemplateRecord};

/// Delay between a hand-out and the start of its replacement: the sandbox
/// just handed out runs its first command meanwhile.
pub const REFILL_DELAY: Duration = Duration::from_millis(200);
/// How often a readiness probe is tried.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// How long one `cmd://` probe may run.
const PROBE_CMD_TIMEOUT: Duration = Duration::from_secs(10);

/// One warm sandbox.
pub struct WarmSandbox {
    entry: Arc<SandboxEntry>,
    child: tokio::process::Child,
    policy: Option<Policy>,
}

impl WarmSandbox {
    /// Holds a launched sandbox, its record saved as deleting.
    fn hold(ctx: &Ctx, launched: Launched) -> WarmSandbox {
        let policy = launched.policy.clone();
        let (entry, child) = launched.into_entry(None);
        entry.mark_deleting();
        let entry = Arc::new(entry);
        if ctx.persist {
            entry.attach_store(ctx.state.clone());
            entry.save();
        }
        WarmSandbox { entry, child, policy }
    }

    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// When it was started.
    pub fn made_at(&self) -> DateTime<Utc> {
        self.entry.created_at
    }

    fn backend(&self) -> Option<BackendKind> {
        self.entry.origin.backend
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None)) && self.entry.process().is_some()
    }

    /// Tells its worker when the sandbox expires (the worker enforces it too).
    pub async fn set_deadline(&self, at: DateTime<Utc>) -> Result<(), String> {
        let channel = self.entry.channel().map_err(|e| e.message)?;
        let d = pvisor_proto::worker::Deadline { unix_ms: at.timestamp_millis() };
        pvisor_proto::worker::worker_client::WorkerClient::new(channel)
            .set_deadline(d)
            .await
            .map(drop)
            .map_err(|s| s.message().to_string())
    }

    /// The sandbox as a create's from now on (None: it ended meanwhile, and
    /// what is left of it goes).
    pub fn into_launched(
        self,
        created_at: DateTime<Utc>,
        expires_at: Option<DateTime<Utc>>,
        metadata: BTreeMap<String, String>,
        requested: Requested,
    ) -> Option<Launched> {
        let Some(runtime) = self.entry.take_runtime() else {
            discard_later(vec![self]);
            return None;
        };
        let e = &self.entry;
        Some(Launched {
            id: e.id.clone(),
            image_uri: e.image_uri.clone(),
            image_id: e.image_id.clone(),
            entrypoint: e.entrypoint.clone(),
            created_at,
            expires_at,
            metadata,
            requested,
            origin: e.origin.clone(),
            policy: self.policy,
            runtime,
            child: self.child,
        })
    }
}

#[derive(Default)]
struct Slot {
    ready: Vec<WarmSandbox>,
    /// A fill task runs for the template.
    filling: bool,
}

/// The warm sandboxes of every template.
pub struct Warm {
    want: usize,
    slots: Mutex<HashMap<String, Slot>>,
    /// Told when a fill ends.
    filled: tokio::sync::Notify,
    /// The broker stops: no more are started or offered.
    closing: std::sync::atomic::AtomicBool,
    /// One start at a time across templates: a broker with many templates
    /// starting (or many templates handed out at once) does not start them
    /// all together on a host that also serves creates.
    starting: tokio::sync::Semaphore,
}

impl Warm {
    pub fn new(want: usize) -> Warm {
        Warm {
            want,
            slots: Mutex::new(HashMap::new()),
            filled: tokio::sync::Notify::new(),
            closing: std::sync::atomic::AtomicBool::new(false),
            starting: tokio::sync::Semaphore::new(1),
        }
    }

    fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The broker stops: waits for the fills running (each ends what it was
    /// starting), then takes out every warm sandbox, for [`discard`].
    pub async fn close(&self) -> Vec<WarmSandbox> {
        self.closing.store(true, std::sync::atomic::Ordering::SeqCst);
        let templates: Vec<String> = self.slots().keys().cloned().collect();
        for t in templates {
            self.fill_done(&t).await;
        }
        self.slots().values_mut().flat_map(|s| std::mem::take(&mut s.ready)).collect()
    }

    /// How many each template keeps (`--template-warm`).
    pub fn want(&self) -> usize {
        self.want
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live warm sandbox of `template` on `backend` and of image
    /// `image_id`, if there is one; and those found dead or stale on the
    /// way, for the caller to [`discard`].
    pub fn take(
        &self,
        template: &str,
        backend: BackendKind,
        image_id: &str,
    ) -> (Option<WarmSandbox>, Vec<WarmSandbox>) {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(template) else { return (None, Vec::new()) };
        let mut stale = Vec::new();
        let mut found = None;
        while let Some(mut w) = slot.ready.pop() {
            if !w.alive() || w.entry.image_id != image_id {
                stale.push(w);
                continue;
            }
            if w.backend() != Some(backend) {
                // Kept: a create on the default backend takes it.
                slot.ready.insert(0, w);
                break;
            }
            found = Some(w);
            break;
        }
        (found, stale)
    }

    /// How many are ready for `template`.
    pub fn count(&self, template: &str) -> usize {
        self.slots().get(template).map_or(0, |s| s.ready.len())
    }

    /// The ready ones of `template`: id, worker pid, when started.
    pub fn ready_of(&self, template: &str) -> Vec<(String, Option<u32>, DateTime<Utc>)> {
        let slots = self.slots();
        let Some(s) = slots.get(template) else { return Vec::new() };
        s.ready.iter().map(|w| (w.entry.id.clone(), w.entry.process().map(|(p, _)| p), w.made_at())).collect()
    }

    /// The pool ids of the images warm sandboxes use (their image servers must stay).
    pub fn image_ids(&self) -> Vec<String> {
        self.slots().values().flat_map(|s| s.ready.iter().map(|w| w.entry.image_id.clone())).collect()
    }

    /// Takes out every warm sandbox of `template` (it is deleted).
    pub fn remove_template(&self, template: &str) -> Vec<WarmSandbox> {
        self.slots().get_mut(template).map(|s| std::mem::take(&mut s.ready)).unwrap_or_default()
    }

    /// Takes out the dead ones, and the ns ones made before the death of
    /// their image's server was noticed (their root is gone); says which
    /// templates lost some.
    pub fn take_broken(&self, deaths: &[crate::sandbox::images::Death]) -> (Vec<WarmSandbox>, Vec<String>) {
        let mut out = Vec::new();
        let mut templates = Vec::new();
        for (id, slot) in self.slots().iter_mut() {
            let before = out.len();
            let mut keep = Vec::new();
            for mut w in slot.ready.drain(..) {
                let ns = w.backend() != Some(BackendKind::Vm);
                let rootless =
                    ns && deaths.iter().any(|d| d.image_id == w.entry.image_id && w.entry.created_at <= d.noticed);
                if rootless || !w.alive() {
                    out.push(w);
                } else {
                    keep.push(w);
                }
            }
            slot.ready = keep;
            if out.len() > before {
                templates.push(id.clone());
            }
        }
        (out, templates)
    }

    /// Marks a fill of `template` running; false if one runs already.
    fn begin_fill(&self, template: &str) -> bool {
        let mut slots = self.slots();
        let slot = slots.entry(template.to_string()).or_default();
        !std::mem::replace(&mut slot.filling, true)
    }

    fn end_fill(&self, template: &str) {
        if let Some(s) = self.slots().get_mut(template) {
            s.filling = false;
        }
        self.filled.notify_waiters();
    }

    fn filling(&self, template: &str) -> bool {
        self.slots().get(template).is_some_and(|s| s.filling)
    }

    /// Returns once no fill of `template` runs (a fill of a deleted
    /// template ends the sandbox it was starting, and stops).
    pub async fn fill_done(&self, template: &str) {
        loop {
            let told = self.filled.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if !self.filling(template) {
                return;
            }
            told.await;
        }
    }

    /// Adds a ready one unless the template is gone or the broker stops
    /// (then it is given back).
    fn offer(&self, ctx: &Ctx, template: &str, w: WarmSandbox) -> Option<WarmSandbox> {
        if self.closing() || ctx.catalog.store.get(template).is_none() {
            return Some(w);
        }
        self.slots().entry(template.to_string()).or_default().ready.push(w);
        None
    }
}

/// Ends unclaimed warm sandboxes: processes, files, cgroup and record.
pub async fn discard(ws: Vec<WarmSandbox>) {
    for mut w in ws {
        teardown(&w.entry).await;
        w.entry.forget();
        let _ = w.child.wait().await;
    }
}

/// [`discard`] off the caller's path.
pub fn discard_later(ws: Vec<WarmSandbox>) {
    if !ws.is_empty() {
        tokio::spawn(discard(ws));
    }
}

/// Starts warm sandboxes for `template` until it has its count, after
/// `delay`, in the background (one fill per template at a time).
pub fn top_up(ctx: Arc<Ctx>, template: String, delay: Duration) {
    let warm = &ctx.catalog.warm;
    if warm.want == 0 || warm.closing() || warm.count(&template) >= warm.want {
        return;
    }
    if !ctx.catalog.warm.begin_fill(&template) {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        fill(&ctx, &template).await;
        ctx.catalog.warm.end_fill(&template);
    });
}

/// Every template's warm sandboxes (the broker starts).
pub fn top_up_all(ctx: &Arc<Ctx>) {
    for t in ctx.catalog.store.list() {
        top_up(ctx.clone(), t.id, Duration::ZERO);
    }
}

async fn fill(ctx: &Arc<Ctx>, template: &str) {
    while ctx.catalog.warm.count(template) < ctx.catalog.warm.want && !ctx.catalog.warm.closing() {
        let Some(tpl) = ctx.catalog.store.get(template) else { return };
        let req = super::sandboxes::warm_request(&tpl);
        let Ok(turn) = ctx.catalog.warm.starting.acquire().await else { return };
        let t0 = std::time::Instant::now();
        let launched = match lifecycle::launch_request(ctx, &req, lifecycle::new_id(), t0, None).await {
            Ok(l) => l,
            Err(e) => {
                drop(turn);
                // Not retried in a loop: the next create from the template tries again.
                tracing::warn!(template, "starting a warm sandbox: {e}");
                return;
            }
        };
        let w = WarmSandbox::hold(ctx, launched);
        // Started: the next template's start may begin while this one waits for its gate.
        drop(turn);
        tracing::info!(template, sandbox = %w.id(), took = ?t0.elapsed(), "warm sandbox started");
        gate(ctx, &w, &tpl).await;
        if let Some(back) = ctx.catalog.warm.offer(ctx, template, w) {
            discard(vec![back]).await;
            return;
        }
    }
}

/// Waits for the template's readiness gate (see the module's comment);
/// stops early when the template is deleted meanwhile.
async fn gate(ctx: &Ctx, w: &WarmSandbox, tpl: &TemplateRecord) {
    let Some(r) = &tpl.readiness else { return };
    // Checked at the template's create.
    let window = r.warmup().unwrap_or(Duration::from_secs(Readiness::DEFAULT_WARMUP_SECS));
    let probe = r.probe().ok().flatten();
    let deadline = tokio::time::Instant::now() + window;
    loop {
        if ctx.catalog.warm.closing() || ctx.catalog.store.get(&tpl.id).is_none() {
            return;
        }
        let tried = match &probe {
            Some(p) => probe_once(w, p).await,
            None => Err("no probe".to_string()),
        };
        match tried {
            Ok(()) => return,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                if probe.is_some() {
                    tracing::warn!(template = %tpl.id, sandbox = %w.id(),
                        "readiness probe did not pass within {window:?} ({why}); offered anyway");
                }
                return;
            }
            Err(_) => tokio::time::sleep(PROBE_INTERVAL).await,
        }
    }
}

/// One try of a probe inside the sandbox.
async fn probe_once(w: &WarmSandbox, probe: &Probe) -> Result<(), String> {
    let mut agent = crate::execd::agent(&w.entry).map_err(|e| e.message)?;
    match probe {
        Probe::Tcp { port } => {
            // The agent connects before it answers: an answer means the port accepted.
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(pvisor_proto::agent::TunnelData { port: u32::from(*port), data: Vec::new() })
                .await
                .map_err(|e| e.to_string())?;
            agent
                .tunnel(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(drop)
                .map_err(|s| s.message().into())
        }
        Probe::Cmd(command) => {
            let req = pvisor_proto::agent::ExecRequest {
                command: command.clone(),
                timeout_ms: PROBE_CMD_TIMEOUT.as_millis() as u64,
                ..Default::default()
            };
            let mut events = agent.exec(req).await.map_err(|s| s.message().to_string())?.into_inner();
            while let Some(ev) = events.message().await.map_err(|s| s.message().to_string())? {
                if let Some(pvisor_proto::agent::exec_event::Kind::Exit(x)) = ev.kind {
                    return match x.code {
                        0 => Ok(()),
                        c => Err(format!("exit {c}")),
                    };
                }
            }
            Err("no exit status".into())
        }
    }
}

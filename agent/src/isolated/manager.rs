//! The agent's isolated sessions: the link to the isolator, the sessions'
//! table, creation (the isolator clones the init, the init builds the root
//! and says Ready, the agent starts the shell), deletion and idle collection.
use super::link::InitLink;
use super::session::IsolatedSession;
use super::wire::{self, AsyncLink, Received};
use super::Reason;
use crate::config::AgentConfig;
use crate::error::{AgentError, Result};
use crate::files::check_path;
use crate::spawn::SpawnSpec;
use pvisor_proto::agent::IsolationProfile;
use pvisor_proto::agent::{IsolatedBind, IsolatedSession as SessionInfo, IsolatedSessionSpec, IsolationCaps};
use pvisor_proto::isolator::{isolator_reply, isolator_request, Create, Destroy, IsolatorReply, IsolatorRequest};
use pvisor_proto::isolator::{Layout, Probe};
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Most overlays (legacy workspace included) per session.
pub const MAX_OVERLAYS: usize = 16;
/// How often idle sessions are looked for.
const GC_EVERY: Duration = Duration::from_secs(1);

/// The agent's end of the isolator's socket: one request at a time.
struct IsolatorClient {
    link: AsyncLink,
    turn: tokio::sync::Mutex<()>,
    gone: AtomicBool,
}

impl IsolatorClient {
    async fn call(&self, kind: isolator_request::Kind, fds: &[OwnedFd]) -> Result<isolator_reply::Kind> {
        let gone = || Reason::Unavailable.error("the isolator is gone".into());
        if self.gone.load(Ordering::SeqCst) {
            return Err(gone());
        }
        let _turn = self.turn.lock().await;
        let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let sent = self.link.send(&IsolatorRequest { kind: Some(kind) }, &raw).await;
        let answer = match sent {
            Ok(()) => self.link.recv::<IsolatorReply>().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Received::Message(IsolatorReply { kind: Some(k) }, _)) => Ok(k),
            Ok(Received::Message(..)) => Err(AgentError::io("isolator", std::io::Error::other("empty answer"))),
            Ok(Received::Closed) | Err(_) => {
                self.gone.store(true, Ordering::SeqCst);
                Err(gone())
            }
        }
    }
}

pub struct Isolation {
    cfg: Arc<AgentConfig>,
    isolator: Option<IsolatorClient>,
    sessions: Mutex<HashMap<String, Arc<IsolatedSession>>>,
    /// Whether sessions can be built here (the isolator's probe, once).
    probe: tokio::sync::OnceCell<std::result::Result<(), String>>,
}

/// What an isolator's failure means for the caller.
fn failure(what: &str, message: String, invalid: bool) -> AgentError {
    if invalid {
        AgentError::InvalidArgument(message)
    } else {
        AgentError::io(what, std::io::Error::other(message))
    }
}

/// Checks what the broker validated (the contract is the broker's to keep;
/// this keeps a bad request from reaching the isolator).
fn check_spec(spec: &IsolatedSessionSpec) -> Result<()> {
    let bad = |m: String| Err(AgentError::InvalidArgument(m));
    if spec.overlays.is_empty() || spec.overlays.len() > MAX_OVERLAYS {
        return bad(format!("a session needs 1 to {MAX_OVERLAYS} overlays"));
    }
    let clean = |p: &str| check_path(p).map(|c| c.as_os_str() == p).unwrap_or(false);
    let mut seen = HashSet::new();
    for m in &spec.overlays {
        if !clean(&m.path) || !seen.insert(m.path.as_str()) {
            return bad(format!("overlay path {:?} must be absolute, clean and unique", m.path));
        }
    }
    for p in spec.binds.iter().flat_map(|b| [&b.source, &b.dest]).chain(&spec.extra_writable) {
        if !clean(p) {
            return bad(format!("path {p:?} must be absolute and clean"));
        }
    }
    Ok(())
}

fn layout(spec: &IsolatedSessionSpec, (uid, gid): (u32, u32)) -> Layout {
    let writable =
        spec.extra_writable.iter().map(|p| IsolatedBind { source: p.clone(), dest: p.clone(), readonly: false });
    Layout {
        overlays: spec.overlays.clone(),
        binds: spec.binds.iter().cloned().chain(writable).collect(),
        private_tmp: spec.profile() == IsolationProfile::Strict,
        share_net: spec.share_net,
        uid,
        gid,
    }
}

impl Isolation {
    /// `isolator`: the agent's end of the isolator's socket, if it has one.
    pub fn new(cfg: Arc<AgentConfig>, isolator: Option<OwnedFd>) -> Arc<Self> {
        let isolator = isolator.and_then(|fd| match AsyncLink::new(fd) {
            Ok(link) => Some(IsolatorClient { link, turn: tokio::sync::Mutex::new(()), gone: AtomicBool::new(false) }),
            Err(e) => {
                tracing::warn!("isolator socket: {e}");
                None
            }
        });
        let me = Arc::new(Isolation {
            cfg,
            isolator,
            sessions: Mutex::new(HashMap::new()),
            probe: tokio::sync::OnceCell::new(),
        });
        tokio::spawn(collect_idle(Arc::downgrade(&me)));
        me
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<IsolatedSession>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether sessions can be made, and why not.
    async fn availability(&self) -> std::result::Result<&IsolatorClient, String> {
        let Some(iso) = &self.isolator else {
            return Err("this sandbox's agent runs without an isolator".into());
        };
        let probed = self
            .probe
            .get_or_init(|| async {
                match iso.call(isolator_request::Kind::Probe(Probe {}), &[]).await {
                    Ok(isolator_reply::Kind::Done(_)) => Ok(()),
                    Ok(isolator_reply::Kind::Failed(f)) => {
                        Err(format!("namespaces cannot be built here: {}", f.message))
                    }
                    Ok(other) => Err(format!("the isolator's probe answered {other:?}")),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;
        if iso.gone.load(Ordering::SeqCst) {
            return Err("the isolator is gone".into());
        }
        probed.clone().map(|()| iso)
    }

    pub async fn capabilities(&self) -> IsolationCaps {
        let (available, message) = match self.availability().await {
            Ok(_) => (true, String::new()),
            Err(m) => (false, m),
        };
        IsolationCaps {
            available,
            message,
            version: env!("CARGO_PKG_VERSION").into(),
            setpriv: available,
            userns: false,
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<IsolatedSession>> {
        self.table()
            .get(id)
            .cloned()
            .ok_or_else(|| Reason::SessionNotFound.error(format!("isolated session {id} not found")))
    }

    pub fn describe(&self, s: &IsolatedSession) -> SessionInfo {
        SessionInfo {
            id: s.id.clone(),
            spec: Some(s.spec.clone()),
            created_at_ms: s.created_at_ms,
            last_run_at_ms: s.last_activity_ms(),
            idle_remaining_seconds: s.idle_remaining(),
            active: s.active(),
            uid: s.uid,
            gid: s.gid,
        }
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let mut all: Vec<Arc<IsolatedSession>> = self.table().values().cloned().collect();
        all.sort_by_key(|s| s.created_at_ms);
        all.iter().map(|s| self.describe(s)).collect()
    }

    /// Builds a session; answers once its shell runs.
    pub async fn create(&self, spec: IsolatedSessionSpec) -> Result<SessionInfo> {
        check_spec(&spec)?;
        let iso = self.availability().await.map_err(|m| Reason::Unavailable.error(m))?;
        // The identity and environment sandbox commands get, the session's policy applied.
        let ask = SpawnSpec { uid: spec.uid, gid: spec.gid, ..Default::default() };
        let ids = crate::spawn::identity(&ask, &self.cfg)?;
        let mut env = crate::spawn::environment(&SpawnSpec::default(), &self.cfg, ids);
        super::env::apply(spec.profile(), spec.env.as_ref(), &mut env);
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let cwd = spec.overlays[0].path.clone();
        let id = super::new_uuid();
        let (ours, theirs) = wire::pair().map_err(|e| AgentError::io("socketpair", e))?;
        let create = Create { id: id.clone(), layout: Some(layout(&spec, ids.unwrap_or((0, 0)))) };
        match iso.call(isolator_request::Kind::Create(create), &[theirs]).await? {
            isolator_reply::Kind::Created(_) => {}
            isolator_reply::Kind::Failed(f) => return Err(failure("isolator", f.message, f.invalid)),
            other => return Err(failure("isolator", format!("unexpected answer {other:?}"), false)),
        }
        let session = async {
            let (link, ready) = InitLink::start(ours).await?;
            let root = ready.map_err(|(m, invalid)| failure("isolated session", m, invalid))?;
            let s = IsolatedSession::new(id.clone(), spec, ids.unwrap_or((0, 0)), env, cwd, link, root);
            // The shell now: a wrong uid is the create's error, and the first run is quick.
            let shell = s.start_shell().await?;
            Ok::<_, AgentError>((s, shell))
        }
        .await;
        match session {
            Ok((s, shell)) => {
                s.adopt_shell(shell).await;
                let s = Arc::new(s);
                self.table().insert(id, s.clone());
                Ok(self.describe(&s))
            }
            Err(e) => {
                let _ = iso.call(isolator_request::Kind::Destroy(Destroy { id }), &[]).await;
                Err(e)
            }
        }
    }

    /// Ends a session: every process, its namespaces, mounts and uppers.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let s = self
            .table()
            .remove(id)
            .ok_or_else(|| Reason::SessionNotFound.error(format!("isolated session {id} not found")))?;
        if let Some(iso) = &self.isolator {
            // Waits until the init (and with it the pid namespace) is gone.
            let _ = iso.call(isolator_request::Kind::Destroy(Destroy { id: id.to_string() }), &[]).await;
        }
        drop(s);
        Ok(())
    }

    /// The sessions past their idle timeout.
    fn idle(&self) -> Vec<String> {
        self.table().values().filter(|s| s.idle_expired()).map(|s| s.id.clone()).collect()
    }
}

/// Deletes idle sessions until the agent drops its isolation.
async fn collect_idle(me: Weak<Isolation>) {
    loop {
        tokio::time::sleep(GC_EVERY).await;
        let Some(iso) = me.upgrade() else { return };
        for id in iso.idle() {
            tracing::info!("isolated session {id}: idle timeout, deleting");
            let _ = iso.delete(&id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::agent::{IsolatedMount, MountMode};

    fn spec(paths: &[&str]) -> IsolatedSessionSpec {
        IsolatedSessionSpec {
            overlays: paths.iter().map(|p| IsolatedMount { path: p.to_string(), ..Default::default() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn specs_are_checked() {
        assert!(check_spec(&spec(&["/workspace", "/", "/data/x"])).is_ok());
        for bad in [&[][..], &["relative"], &["/a/../b"], &["/a/"], &["/a", "/a"]] {
            assert!(check_spec(&spec(bad)).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_OVERLAYS).map(|i| format!("/w{i}")).collect();
        assert!(check_spec(&spec(&many.iter().map(String::as_str).collect::<Vec<_>>())).is_err());
        let mut s = spec(&["/w"]);
        s.binds.push(IsolatedBind { source: "/x/..".into(), dest: "/y".into(), readonly: true });
        assert!(check_spec(&s).is_err());
    }

    #[test]
    fn extra_writable_becomes_writable_binds_and_strict_gets_a_private_tmp() {
        let mut s = spec(&["/w"]);
        s.extra_writable = vec!["/cache".into()];
        s.profile = IsolationProfile::Balanced as i32;
        let l = layout(&s, (0, 0));
        assert_eq!(l.binds, vec![IsolatedBind { source: "/cache".into(), dest: "/cache".into(), readonly: false }]);
        assert!(!l.private_tmp);
        s.profile = IsolationProfile::Strict as i32;
        assert!(layout(&s, (1, 2)).private_tmp);
        assert_eq!((layout(&s, (1, 2)).uid, layout(&s, (1, 2)).gid), (1, 2));
        assert_eq!(layout(&s, (0, 0)).overlays[0].mode(), MountMode::Overlay);
    }
}

//! One isolated session as the agent keeps it: its init's link, its root
//! (for the file API), its shell (foreground runs, state kept between them)
//! and its background runs (each a process of its own, output kept).
use super::link::InitLink;
use super::runlog::RunLog;
use super::Reason;
use crate::commands::EventTx;
use crate::error::{AgentError, Result};
use crate::session::{drive, Shell};
use pvisor_proto::agent::{IsolatedRun, IsolatedSessionSpec};
use pvisor_proto::isolator::Spawn;
use pvisor_proto::now_ms;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::unix::pipe;

/// Finished background runs remembered per session.
const KEEP_RUNS: usize = 256;
/// How long a finished run's output is still read (a daemon it left behind
/// may hold the pipe open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(100);

/// The shell of sessions: bash where the image has it, else /bin/sh.
const SHELL: [&str; 3] = ["bash", "--noprofile", "--norc"];
const FALLBACK_SHELL: &str = crate::shell::FALLBACK;

/// When the session last did something, and how many runs are under way
/// (idle collection waits for them).
#[derive(Default)]
pub struct Activity {
    last_ms: AtomicI64,
    busy: AtomicUsize,
}

/// A run under way; the session counts as active until it drops.
pub struct Busy(Arc<Activity>);

impl Activity {
    fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.last_ms.store(now_ms(), Ordering::SeqCst);
        Busy(self.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.last_ms.store(now_ms(), Ordering::SeqCst);
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A background run.
pub struct BgRun {
    id: String,
    started_at_ms: i64,
    state: Mutex<RunState>,
}

#[derive(Default)]
struct RunState {
    running: bool,
    exit_code: Option<i32>,
    error: String,
    finished_at_ms: Option<i64>,
    log: RunLog,
}

impl BgRun {
    fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn logs(&self, cursor: u64) -> (Vec<u8>, u64) {
        self.state().log.since(cursor)
    }
}

pub struct IsolatedSession {
    pub id: String,
    pub spec: IsolatedSessionSpec,
    pub created_at_ms: i64,
    pub uid: u32,
    pub gid: u32,
    /// The session's environment (`KEY=VALUE`), its policy applied.
    env: Vec<String>,
    /// Where its processes start: its first overlay.
    cwd: String,
    link: Arc<InitLink>,
    /// The session's root (O_PATH), for the file API.
    pub root: Arc<OwnedFd>,
    shell: tokio::sync::Mutex<Option<Shell>>,
    activity: Arc<Activity>,
    runs: Mutex<RunTable>,
}

/// Background runs by id, plus ids in start order (for bounding the table).
type RunTable = (HashMap<String, Arc<BgRun>>, VecDeque<String>);

/// A run's request as the agent takes it: code, and variable names `export` takes.
pub fn check_run(r: &pvisor_proto::agent::IsolatedRunRequest) -> Result<()> {
    if r.code.trim().is_empty() {
        return Err(AgentError::InvalidArgument("code is required".into()));
    }
    r.envs.keys().try_for_each(|k| check_env_name(k))
}

/// `export K='V'` lines for a foreground run's envs.
fn exports(envs: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::new();
    for (k, v) in envs {
        check_env_name(k)?;
        out.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    Ok(out)
}

/// A shell variable name, as `export` takes it.
fn check_env_name(k: &str) -> Result<()> {
    let ok = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(AgentError::InvalidArgument(format!("{k:?} is not a valid environment variable name")));
    }
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| AgentError::io("pipe", e.into()))
}

impl IsolatedSession {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        spec: IsolatedSessionSpec,
        (uid, gid): (u32, u32),
        env: Vec<String>,
        cwd: String,
        link: Arc<InitLink>,
        root: OwnedFd,
    ) -> Self {
        let now = now_ms();
        let activity = Arc::new(Activity::default());
        activity.last_ms.store(now, Ordering::SeqCst);
        IsolatedSession {
            id,
            spec,
            created_at_ms: now,
            uid,
            gid,
            env,
            cwd,
            link,
            root: Arc::new(root),
            shell: tokio::sync::Mutex::new(None),
            activity,
            runs: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// False once the session's namespaces are gone (its init died).
    pub fn active(&self) -> bool {
        self.link.alive()
    }

    pub fn check_active(&self) -> Result<()> {
        if self.active() {
            return Ok(());
        }
        Err(Reason::SessionNotActive
            .error(format!("isolated session {} is dead (its processes were killed); delete it", self.id)))
    }

    pub fn last_activity_ms(&self) -> i64 {
        self.activity.last_ms.load(Ordering::SeqCst)
    }

    /// Seconds until idle collection (the full timeout while a run is under way).
    pub fn idle_remaining(&self) -> Option<i64> {
        let t = i64::from(self.spec.idle_timeout_seconds);
        if t == 0 {
            return None;
        }
        if self.activity.busy.load(Ordering::SeqCst) > 0 {
            return Some(t);
        }
        Some((t - (now_ms() - self.last_activity_ms()) / 1000).max(0))
    }

    pub fn idle_expired(&self) -> bool {
        let t = i64::from(self.spec.idle_timeout_seconds);
        t > 0 && self.activity.busy.load(Ordering::SeqCst) == 0 && now_ms() - self.last_activity_ms() >= t * 1000
    }

    fn spawn_request(&self, argv: Vec<String>, fallback: Vec<String>, env: Vec<String>) -> Spawn {
        Spawn { argv, env, cwd: self.cwd.clone(), uid: self.uid, gid: self.gid, fallback_argv: fallback }
    }

    /// Makes `shell` the session's (the one started at creation).
    pub(crate) async fn adopt_shell(&self, shell: Shell) {
        *self.shell.lock().await = Some(shell);
    }

    /// Starts the session's shell (the first run's, or after one was killed).
    pub(crate) async fn start_shell(&self) -> Result<Shell> {
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let argv = SHELL.iter().map(|s| s.to_string()).collect();
        let s = self.spawn_request(argv, vec![FALLBACK_SHELL.into()], self.env.clone());
        let (pid, _exit) = self.link.spawn(s, [in_r, out_w, err_w]).await?;
        let rx = |fd| pipe::Receiver::from_owned_fd(fd).map_err(|e| AgentError::io("pipe", e));
        Ok(Shell {
            pid,
            stdin: pipe::Sender::from_owned_fd(in_w).map_err(|e| AgentError::io("pipe", e))?,
            stdout: BufReader::new(rx(out_r)?),
            stderr: BufReader::new(rx(err_r)?),
        })
    }

    /// A foreground run in the session's shell (runs take turns).
    pub async fn run(&self, code: &str, envs: &BTreeMap<String, String>, timeout_ms: u64, tx: EventTx) -> Result<()> {
        self.check_active()?;
        let prelude = exports(envs)?;
        let _busy = self.activity.busy();
        let mut guard = self.shell.lock().await;
        if guard.is_none() {
            *guard = Some(self.start_shell().await?);
        }
        let link = self.link.clone();
        let kill = move |pid: i32| {
            let link = link.clone();
            tokio::spawn(async move {
                let _ = link.kill_group(pid).await;
            });
        };
        drive(&mut guard, &prelude, code, timeout_ms, tx, &kill).await
    }

    /// Starts a background run: the session's shell program with `-c code`,
    /// in a process group of its own, stdout and stderr into one log.
    pub async fn start_run(&self, code: &str, envs: &BTreeMap<String, String>) -> Result<IsolatedRun> {
        self.check_active()?;
        let mut env: BTreeMap<String, String> =
            self.env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
        for (k, v) in envs {
            check_env_name(k)?;
            env.insert(k.clone(), v.clone());
        }
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let (in_r, in_w) = pipe()?;
        drop(in_w);
        let (out_r, out_w) = pipe()?;
        let err_w = out_w.try_clone().map_err(|e| AgentError::io("pipe", e))?;
        let argv = vec![SHELL[0].to_string(), "-c".into(), code.to_string()];
        let fallback = vec![FALLBACK_SHELL.to_string(), "-c".into(), code.to_string()];
        let busy = self.activity.busy();
        let (_pid, exit) = self.link.spawn(self.spawn_request(argv, fallback, env), [in_r, out_w, err_w]).await?;
        let out = pipe::Receiver::from_owned_fd(out_r).map_err(|e| AgentError::io("pipe", e))?;
        let run = Arc::new(BgRun {
            id: super::new_uuid(),
            started_at_ms: now_ms(),
            state: Mutex::new(RunState { running: true, ..Default::default() }),
        });
        self.remember(run.clone());
        tokio::spawn(collect(run.clone(), out, exit, busy));
        Ok(self.describe_run(&run))
    }

    fn remember(&self, run: Arc<BgRun>) {
        let mut t = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        t.1.push_back(run.id.clone());
        t.0.insert(run.id.clone(), run);
        while t.1.len() > KEEP_RUNS {
            let Some(old) = t.1.pop_front() else { break };
            if t.0.get(&old).is_some_and(|r| r.state().running) {
                t.1.push_back(old);
                break;
            }
            t.0.remove(&old);
        }
    }

    pub fn run_by_id(&self, run_id: &str) -> Result<Arc<BgRun>> {
        let t = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        t.0.get(run_id)
            .cloned()
            .ok_or_else(|| Reason::RunNotFound.error(format!("run {run_id} not found in isolated session {}", self.id)))
    }

    pub fn describe_run(&self, r: &BgRun) -> IsolatedRun {
        let st = r.state();
        IsolatedRun {
            session_id: self.id.clone(),
            run_id: r.id.clone(),
            running: st.running,
            exit_code: st.exit_code,
            error: st.error.clone(),
            started_at_ms: r.started_at_ms,
            finished_at_ms: st.finished_at_ms,
        }
    }
}

/// Reads a background run's output until it ends and records its exit.
async fn collect(run: Arc<BgRun>, mut out: pipe::Receiver, mut exit: tokio::sync::oneshot::Receiver<i32>, busy: Busy) {
    let mut buf = vec![0u8; 64 << 10];
    let mut code: Option<std::result::Result<i32, ()>> = None;
    let mut grace = Box::pin(tokio::time::sleep(Duration::MAX));
    loop {
        tokio::select! {
            n = out.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => run.state().log.push(&buf[..n]),
            },
            r = &mut exit, if code.is_none() => {
                code = Some(r.map_err(drop));
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            }
            _ = &mut grace => break,
        }
    }
    let code = match code {
        Some(c) => c,
        None => exit.await.map_err(drop),
    };
    drop(busy);
    let mut st = run.state();
    st.running = false;
    st.finished_at_ms = Some(now_ms());
    match code {
        Ok(c) => st.exit_code = Some(c),
        Err(()) => st.error = "session terminated".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_quote_values_and_check_names() {
        let envs = BTreeMap::from([("A".to_string(), "it's $HOME".to_string()), ("_B2".to_string(), String::new())]);
        assert_eq!(exports(&envs).unwrap(), "export A='it'\\''s $HOME'\nexport _B2=''\n");
        for bad in ["", "1A", "A-B", "A B", "A=B"] {
            let envs = BTreeMap::from([(bad.to_string(), "x".to_string())]);
            assert!(exports(&envs).is_err(), "{bad:?}");
        }
    }
}

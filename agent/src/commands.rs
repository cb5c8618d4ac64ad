//! Running commands: foreground streams, background commands with kept logs,
//! status, interrupt and timeouts.
use crate::config::AgentConfig;
use crate::error::{AgentError, Result};
use crate::lines::for_each_line;
use crate::spawn::{kill_group_bg, spawn, SpawnSpec, Spawned};
use pvisor_proto::agent::{exec_event, CommandStatusReply, ExecEvent, ExecRequest, ExitStatus, LogsReply};
use pvisor_proto::now_ms;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Output kept per background command; older lines are dropped past this.
const LOG_CAP_BYTES: usize = 8 << 20;
/// Finished commands remembered for status queries.
const KEEP_FINISHED: usize = 1024;
/// How long output is still read after the command exited (a daemon it left
/// behind may hold the pipes open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(100);

pub type EventTx = mpsc::Sender<std::result::Result<ExecEvent, tonic::Status>>;

pub fn event(kind: exec_event::Kind) -> ExecEvent {
    ExecEvent { kind: Some(kind), timestamp_ms: now_ms() }
}

#[derive(Default)]
struct LogBuf {
    lines: VecDeque<String>,
    first: u64,
    bytes: usize,
}

/// Output kept across all background commands; past it, a command that adds
/// output drops its own oldest lines (the agent must not be the one that
/// exhausts the sandbox's memory).
const LOG_CAP_TOTAL: usize = 64 << 20;
static RETAINED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl LogBuf {
    fn push(&mut self, line: String) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = line.len() + 1;
        self.bytes += n;
        RETAINED.fetch_add(n, Relaxed);
        self.lines.push_back(line);
        while self.bytes > LOG_CAP_BYTES || (RETAINED.load(Relaxed) > LOG_CAP_TOTAL && self.lines.len() > 1) {
            let Some(old) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= old.len() + 1;
            RETAINED.fetch_sub(old.len() + 1, Relaxed);
            self.first += 1;
        }
    }

    fn since(&self, cursor: u64) -> (String, u64) {
        let end = self.first + self.lines.len() as u64;
        let skip = cursor.saturating_sub(self.first) as usize;
        let mut text = String::new();
        for l in self.lines.iter().skip(skip) {
            text.push_str(l);
            text.push('\n');
        }
        (text, end)
    }
}

impl Drop for LogBuf {
    fn drop(&mut self) {
        RETAINED.fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

struct State {
    running: bool,
    exit_code: Option<i32>,
    error: String,
    finished_at_ms: Option<i64>,
    log: LogBuf,
}

pub struct Entry {
    id: String,
    content: String,
    started_at_ms: i64,
    pgid: i32,
    background: bool,
    state: Mutex<State>,
}

impl Entry {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Commands by id, plus ids in start order (for bounding the table).
type Table = (HashMap<String, Arc<Entry>>, VecDeque<String>);

/// Every command the agent started, by id.
pub struct Commands {
    cfg: Arc<AgentConfig>,
    table: Mutex<Table>,
}

pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Commands {
    pub fn new(cfg: Arc<AgentConfig>) -> Arc<Self> {
        Arc::new(Commands { cfg, table: Mutex::new((HashMap::new(), VecDeque::new())) })
    }

    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    fn register(&self, entry: Arc<Entry>) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.1.push_back(entry.id.clone());
        t.0.insert(entry.id.clone(), entry);
        while t.1.len() > KEEP_FINISHED {
            let Some(old) = t.1.pop_front() else { break };
            let done = t.0.get(&old).map(|e| !e.state().running).unwrap_or(true);
            if done {
                t.0.remove(&old);
            } else {
                t.1.push_back(old);
                break;
            }
        }
    }

    fn get(&self, id: &str) -> Result<Arc<Entry>> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.0.get(id).cloned().ok_or_else(|| AgentError::NotFound(format!("command {id}")))
    }

    /// Starts a command. Foreground commands stream into `tx` until their exit
    /// event; background commands get their init event and keep running.
    pub fn exec(self: &Arc<Self>, req: ExecRequest, tx: EventTx, id: Option<String>) -> Result<String> {
        self.start(req, tx, id, true)
    }

    /// Runs a command as [`exec`](Self::exec) does, without listing it for
    /// `CommandStatus`/`CommandLogs`: a lifecycle hook's run (periodic runs
    /// would crowd users' commands out of the table).
    pub fn exec_unlisted(self: &Arc<Self>, req: ExecRequest, tx: EventTx) -> Result<String> {
        self.start(req, tx, None, false)
    }

    fn start(self: &Arc<Self>, req: ExecRequest, tx: EventTx, id: Option<String>, listed: bool) -> Result<String> {
        let mut spec = SpawnSpec::new(&self.cfg, &req.command, &req.argv)?;
        spec.cwd = req.cwd.clone();
        spec.envs = req.envs.clone().into_iter().collect();
        spec.uid = req.uid;
        spec.gid = req.gid;
        let spawned = spawn(&spec, &self.cfg)?;
        let content = if req.command.is_empty() { req.argv.join(" ") } else { req.command.clone() };
        let entry = Arc::new(Entry {
            id: id.unwrap_or_else(new_id),
            content,
            started_at_ms: now_ms(),
            pgid: spawned.pid,
            background: req.background,
            state: Mutex::new(State {
                running: true,
                exit_code: None,
                error: String::new(),
                finished_at_ms: None,
                log: LogBuf::default(),
            }),
        });
        if listed {
            self.register(entry.clone());
        }
        let id = entry.id.clone();
        let _ = tx.try_send(Ok(event(exec_event::Kind::Init(id.clone()))));
        let timeout = (req.timeout_ms > 0).then(|| Duration::from_millis(req.timeout_ms));
        let sink = if req.background { None } else { Some(tx) };
        tokio::spawn(drive(entry, spawned, sink, timeout));
        Ok(id)
    }

    pub fn status(&self, id: &str) -> Result<CommandStatusReply> {
        let e = self.get(id)?;
        let s = e.state();
        Ok(CommandStatusReply {
            id: e.id.clone(),
            content: e.content.clone(),
            running: s.running,
            exit_code: s.exit_code,
            error: s.error.clone(),
            started_at_ms: e.started_at_ms,
            finished_at_ms: s.finished_at_ms,
        })
    }

    pub fn logs(&self, id: &str, cursor: u64) -> Result<LogsReply> {
        let e = self.get(id)?;
        let (text, cursor) = e.state().log.since(cursor);
        Ok(LogsReply { text, cursor })
    }

    pub fn interrupt(&self, id: &str) -> Result<()> {
        let e = self.get(id)?;
        let mut s = e.state();
        if s.running {
            s.error = "interrupted".into();
            kill_group_bg(e.pgid);
        }
        Ok(())
    }
}

/// Streams one command's output and exit. `sink` is None for background commands.
async fn drive(entry: Arc<Entry>, sp: Spawned, sink: Option<EventTx>, timeout: Option<Duration>) {
    let started = Instant::now();
    let Spawned { pid, stdout, stderr, exit, .. } = sp;
    let emit = |kind: fn(String) -> exec_event::Kind| {
        let entry = entry.clone();
        let sink = sink.clone();
        move |line: String| {
            let entry = entry.clone();
            let sink = sink.clone();
            async move {
                match &sink {
                    Some(tx) => tx.send(Ok(event(kind(line)))).await.is_ok(),
                    None => {
                        entry.state().log.push(line);
                        true
                    }
                }
            }
        }
    };
    let readers = futures::future::join(
        for_each_line(stdout, emit(exec_event::Kind::Stdout)),
        for_each_line(stderr, emit(exec_event::Kind::Stderr)),
    );
    tokio::pin!(readers);
    tokio::pin!(exit);
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(u32::MAX as u64)));
    tokio::pin!(deadline);
    let watch = sink.clone();
    let closed = async move {
        match &watch {
            Some(tx) => tx.closed().await,
            None => futures::future::pending().await,
        }
    };
    tokio::pin!(closed);
    let mut readers_done = false;
    let mut timed_out = false;
    let mut abandoned = false;
    let code = loop {
        tokio::select! {
            c = &mut exit => break c.unwrap_or(-1),
            _ = &mut readers, if !readers_done => readers_done = true,
            _ = &mut deadline, if !timed_out => {
                timed_out = true;
                kill_group_bg(pid);
            }
            _ = &mut closed, if !abandoned => {
                // The client went away: a foreground command dies with its stream.
                abandoned = true;
                kill_group_bg(pid);
            }
        }
    };
    if !readers_done {
        let _ = tokio::time::timeout(DRAIN_GRACE, &mut readers).await;
    }
    let error = {
        let mut s = entry.state();
        if timed_out {
            s.error = format!("command timed out after {} ms", timeout.unwrap_or_default().as_millis());
        }
        s.running = false;
        s.exit_code = Some(code);
        s.finished_at_ms = Some(now_ms());
        s.error.clone()
    };
    if let Some(tx) = sink {
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let status = ExitStatus { code, error, elapsed_ms, timed_out };
        let _ = tx.send(Ok(event(exec_event::Kind::Exit(status)))).await;
    }
    tracing::debug!(id = %entry.id, code, background = entry.background, "command finished");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn retained_output_is_capped_per_command_and_in_total() {
        let line = "x".repeat(1 << 16);
        let mut one = LogBuf::default();
        for _ in 0..(LOG_CAP_BYTES / line.len()) * 2 {
            one.push(line.clone());
        }
        assert!(one.bytes <= LOG_CAP_BYTES, "per-command cap");
        assert!(one.first > 0, "oldest lines dropped, cursor kept");
        let (_, end) = one.since(0);
        assert_eq!(end, one.first + one.lines.len() as u64);

        let mut many: Vec<LogBuf> = (0..(LOG_CAP_TOTAL / LOG_CAP_BYTES) + 4).map(|_| LogBuf::default()).collect();
        for b in many.iter_mut() {
            for _ in 0..LOG_CAP_BYTES / line.len() {
                b.push(line.clone());
            }
        }
        assert!(RETAINED.load(Relaxed) <= LOG_CAP_TOTAL + LOG_CAP_BYTES, "total cap (one command's slack)");
        drop(many);
        drop(one);
        assert_eq!(RETAINED.load(Relaxed), 0, "dropped buffers release their bytes");
    }
}

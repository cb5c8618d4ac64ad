//! Sessions: a long-lived shell per session, so `cd`, variables and functions
//! persist from one run to the next.
use crate::commands::{event, new_id, EventTx};
use crate::config::{AgentConfig, ImageDefaults};
use crate::error::{AgentError, Result};
use crate::spawn::{kill_group_bg, spawn, SpawnSpec};
use pvisor_proto::agent::{exec_event, ExitStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

/// A persistent shell reading scripts on its stdin. `pid` leads its
/// process group (what a timeout kills).
pub(crate) struct Shell {
    pub(crate) pid: i32,
    pub(crate) stdin: pipe::Sender,
    pub(crate) stdout: BufReader<pipe::Receiver>,
    pub(crate) stderr: BufReader<pipe::Receiver>,
}

pub struct Session {
    cwd: String,
    /// Process group of the current shell, readable without the shell lock
    /// (which a running command holds), so delete can always kill it.
    pgid: std::sync::atomic::AtomicI32,
    shell: tokio::sync::Mutex<Option<Shell>>,
}

pub struct Sessions {
    cfg: Arc<AgentConfig>,
    table: Mutex<HashMap<String, Arc<Session>>>,
}

/// An unknown (or deleted) session: 404 `SESSION_NOT_FOUND` on the wire, as an isolated one's.
fn not_found(id: &str) -> AgentError {
    crate::isolated::Reason::SessionNotFound.error(format!("session {id} not found"))
}

fn start_shell(cfg: &AgentConfig, cwd: &str) -> Result<Shell> {
    let argv = crate::shell::session_argv(cfg);
    let spec = SpawnSpec { argv, cwd: cwd.to_string(), stdin_pipe: true, ..Default::default() };
    let sp = spawn(&spec, cfg)?;
    Ok(Shell {
        pid: sp.pid,
        stdin: sp.stdin.expect("stdin pipe requested"),
        stdout: BufReader::new(sp.stdout),
        stderr: BufReader::new(sp.stderr),
    })
}

/// Reads lines until one containing `marker`; returns what followed the marker.
async fn read_until_marker(
    r: &mut BufReader<pipe::Receiver>,
    marker: &str,
    tx: &EventTx,
    kind: fn(String) -> exec_event::Kind,
) -> Option<String> {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        // Bounded: an endless line is split rather than buffered whole.
        match tokio::io::AsyncReadExt::take(&mut *r, crate::lines::MAX_LINE as u64).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        let line = String::from_utf8_lossy(&buf).into_owned();
        if let Some(pos) = line.find(marker) {
            if pos > 0 {
                let _ = tx.send(Ok(event(kind(line[..pos].to_string())))).await;
            }
            return Some(line[pos + marker.len()..].trim().to_string());
        }
        let _ = tx.send(Ok(event(kind(line)))).await;
    }
}

impl Sessions {
    pub fn new(cfg: Arc<AgentConfig>) -> Self {
        Sessions { cfg, table: Mutex::new(HashMap::new()) }
    }

    pub fn create(&self, cwd: &str) -> Result<String> {
        let cwd = if cwd.is_empty() { self.cfg.workdir().to_string() } else { cwd.to_string() };
        let shell = start_shell(&self.cfg, &cwd)?;
        let id = new_id();
        let pgid = std::sync::atomic::AtomicI32::new(shell.pid);
        let s = Arc::new(Session { cwd, pgid, shell: tokio::sync::Mutex::new(Some(shell)) });
        self.table.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), s);
        Ok(id)
    }

    fn get(&self, id: &str) -> Result<Arc<Session>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned().ok_or_else(|| not_found(id))
    }

    /// Fails when the session does not exist.
    pub fn run_check(&self, id: &str) -> Result<()> {
        self.get(id).map(|_| ())
    }

    /// Sends SIGINT to the session's shell and what it runs (one process group).
    pub fn interrupt(&self, id: &str) -> Result<()> {
        let pgid = self.get(id)?.pgid.load(std::sync::atomic::Ordering::SeqCst);
        if pgid > 0 {
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGINT);
            }
        }
        Ok(())
    }

    /// Kills the session's shell and what it runs; a running command ends as
    /// if its shell exited, and the next run starts a fresh shell.
    pub async fn kill_shell(&self, id: &str) -> Result<()> {
        let pgid = self.get(id)?.pgid.load(std::sync::atomic::Ordering::SeqCst);
        crate::spawn::kill_group(pgid).await;
        Ok(())
    }

    pub async fn delete(&self, id: &str) -> Result<()> {
        let s = self.table.lock().unwrap_or_else(|e| e.into_inner()).remove(id).ok_or_else(|| not_found(id))?;
        // Kill first, without the shell lock: a running command holds it and
        // ends (releasing it) once its shell is gone.
        crate::spawn::kill_group(s.pgid.load(std::sync::atomic::Ordering::SeqCst)).await;
        s.shell.lock().await.take();
        Ok(())
    }

    /// Runs `command` in the session's shell, streaming like a foreground command.
    pub async fn run(&self, id: &str, command: &str, cwd: &str, timeout_ms: u64, tx: EventTx) -> Result<()> {
        let session = self.get(id)?;
        let mut guard = session.shell.lock().await;
        if guard.is_none() {
            let sh = start_shell(&self.cfg, &session.cwd)?;
            session.pgid.store(sh.pid, std::sync::atomic::Ordering::SeqCst);
            *guard = Some(sh);
        }
        let cd = if cwd.is_empty() { String::new() } else { crate::workdir::session_cd(cwd) };
        drive(&mut guard, &cd, command, timeout_ms, tx, &kill_group_bg).await
    }
}

/// Runs `command` (after `prelude`) in the shell of `guard`, streaming like a
/// foreground command: Init, its output lines, Exit. A run that times out or
/// whose client goes away has its shell's process group killed (`kill`,
/// fire and forget) and leaves `guard` empty, as does a shell that died:
/// the next run starts a fresh shell.
pub(crate) async fn drive(
    guard: &mut Option<Shell>,
    prelude: &str,
    command: &str,
    timeout_ms: u64,
    tx: EventTx,
    kill: &(dyn Fn(i32) + Send + Sync),
) -> Result<()> {
    let shell = guard.as_mut().expect("the caller starts the shell");
    let started = Instant::now();
    let marker = format!("__PVISOR_SESSION_{}__", new_id());
    let script = format!(
        "{prelude}{{\n{command}\n}} </dev/null\nprintf '%s%d\\n' '{marker}' \"$?\"\nprintf '%s\\n' '{marker}' >&2\n"
    );
    let _ = tx.send(Ok(event(exec_event::Kind::Init(new_id())))).await;
    if let Err(e) = shell.stdin.write_all(script.as_bytes()).await {
        *guard = None;
        return Err(AgentError::io("session shell", e));
    }
    let Shell { stdout, stderr, pid, .. } = shell;
    let pid = *pid;
    let work = futures::future::join(
        read_until_marker(stdout, &marker, &tx, exec_event::Kind::Stdout),
        read_until_marker(stderr, &marker, &tx, exec_event::Kind::Stderr),
    );
    let limit = if timeout_ms > 0 { Duration::from_millis(timeout_ms) } else { Duration::MAX };
    let run = async {
        tokio::select! {
            r = tokio::time::timeout(limit, work) => Some(r),
            // The client went away: the command dies with its stream.
            _ = tx.closed() => None,
        }
    };
    let outcome = match run.await {
        Some(r) => r,
        None => {
            kill(pid);
            *guard = None;
            return Ok(());
        }
    };
    let timed_out = outcome.is_err();
    let (code, error, dead) = match outcome {
        Ok((Some(code), Some(_))) => (code.parse().unwrap_or(-1), String::new(), false),
        Ok(_) => (-1, "session shell exited".to_string(), true),
        Err(_) => {
            kill(pid);
            (137, format!("command timed out after {timeout_ms} ms"), true)
        }
    };
    if dead {
        *guard = None;
    }
    let status = ExitStatus { code, error, elapsed_ms: started.elapsed().as_millis() as u64, timed_out };
    let _ = tx.send(Ok(event(exec_event::Kind::Exit(status)))).await;
    Ok(())
}

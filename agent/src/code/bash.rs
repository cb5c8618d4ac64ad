//! bash contexts: one of the agent's sessions ([`crate::session`]) per
//! context, so the environment, cwd and functions persist between runs.
//! A non-zero exit status ends the run with `CommandExecError` (evalue: the
//! status). The shell traps SIGINT, so an interrupt (SIGINT to the shell's
//! group, repeated until the cell ends) stops the running command and the
//! shell (and its state) survive; the rest of the cell goes on, as after a
//! command that failed. A cell that keeps running (a loop of builtins) is
//! killed after the grace and its shell restarted (`ContextRestarted`).
use super::events::{ename, Events};
use super::run::{INTERRUPT_GRACE, INTERRUPT_REPEAT};
use crate::session::Sessions;
use pvisor_proto::agent::{code_event::Kind, exec_event};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct BashContext {
    sessions: Arc<Sessions>,
    session: String,
    /// Runs take turns here (FIFO).
    turn: tokio::sync::Mutex<()>,
    current: Mutex<Option<mpsc::UnboundedSender<()>>>,
    count: AtomicU32,
    deleted: AtomicBool,
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Whether `k` can be a shell variable name.
fn is_name(k: &str) -> bool {
    let mut c = k.chars();
    c.next().is_some_and(|f| f == '_' || f.is_ascii_alphabetic()) && c.all(|x| x == '_' || x.is_ascii_alphanumeric())
}

/// The script a cell runs: the interrupt trap, the run's variables (they
/// persist, like anything the cell exports), then the cell.
fn script(code: &str, envs: &HashMap<String, String>) -> String {
    let mut s = String::from("trap : INT\n");
    let mut vars: Vec<_> = envs.iter().filter(|(k, _)| is_name(k)).collect();
    vars.sort();
    for (k, v) in vars {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    s.push_str(code);
    s
}

impl BashContext {
    /// Starts the context's shell in `cwd` (the image's default when empty).
    pub fn create(sessions: Arc<Sessions>, cwd: &str) -> crate::error::Result<Self> {
        let session = sessions.create(cwd)?;
        Ok(BashContext {
            sessions,
            session,
            turn: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
            count: AtomicU32::new(0),
            deleted: AtomicBool::new(false),
        })
    }

    pub async fn run(&self, code: &str, envs: &HashMap<String, String>, ev: &mut Events) {
        let _turn = self.turn.lock().await;
        if self.deleted.load(Ordering::SeqCst) {
            return ev.error(ename::DELETED, "the context was deleted", vec![], 0).await;
        }
        ev.start_clock();
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let (itx, mut irx) = mpsc::unbounded_channel();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(itx);
        let (etx, mut erx) = mpsc::channel(64);
        let script = script(code, envs);
        let run = self.sessions.run(&self.session, &script, "", 0, etx);
        let forward = async {
            let mut kill_at: Option<Instant> = None;
            let mut again_at: Option<Instant> = None;
            let mut killed = false;
            loop {
                tokio::select! {
                    e = erx.recv() => match e.map(|e| e.map(|e| e.kind)) {
                        Some(Ok(Some(exec_event::Kind::Stdout(l)))) => ev.send(Kind::Stdout(l + "\n")).await,
                        Some(Ok(Some(exec_event::Kind::Stderr(l)))) => ev.send(Kind::Stderr(l + "\n")).await,
                        Some(Ok(Some(exec_event::Kind::Exit(x)))) => {
                            if self.deleted.load(Ordering::SeqCst) {
                                ev.error(ename::DELETED, "the context was deleted", vec![], count).await;
                            } else if killed || !x.error.is_empty() {
                                let why = "the shell was killed (it ignored the interrupt) or exited; its \
                                           state is lost";
                                ev.error(ename::RESTARTED, why, vec![], count).await;
                            } else if x.code == 0 {
                                ev.complete(count).await;
                            } else {
                                ev.error(ename::COMMAND, x.code.to_string(), vec![], count).await;
                            }
                            return;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(status)) => return ev.error(ename::RESTARTED, status.message(), vec![], count).await,
                        None => return ev.error(ename::RESTARTED, "the shell is gone", vec![], count).await,
                    },
                    Some(()) = irx.recv() => {
                        let _ = self.sessions.interrupt(&self.session);
                        kill_at.get_or_insert(Instant::now() + INTERRUPT_GRACE);
                        again_at = Some(Instant::now() + INTERRUPT_REPEAT);
                    },
                    // Again and again: a SIGINT that lands between two
                    // commands only runs the trap.
                    _ = sleep_until(again_at), if again_at.is_some() && !killed => {
                        let _ = self.sessions.interrupt(&self.session);
                        again_at = Some(Instant::now() + INTERRUPT_REPEAT);
                    },
                    _ = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                        killed = true;
                        let _ = self.sessions.kill_shell(&self.session).await;
                    },
                }
            }
        };
        let (r, ()) = tokio::join!(run, forward);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(e) = r {
            // The run failed before its exit event (the shell could not be
            // started): `forward` has already ended the run.
            tracing::warn!("bash context: {e}");
        }
    }

    pub fn interrupt(&self) {
        if let Some(tx) = self.current.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(());
        }
    }

    /// Ends the context: its session (shell and commands) is killed and removed.
    pub async fn close(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        let _ = self.sessions.delete(&self.session).await;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_exports_valid_names_quoted() {
        let envs = HashMap::from([("A".to_string(), "it's".to_string()), ("bad name".to_string(), "x".to_string())]);
        assert_eq!(script("echo $A", &envs), "trap : INT\nexport A='it'\\''s'\necho $A");
    }
}

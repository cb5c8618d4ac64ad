//! The agent's link to one session's init ([`super::init`]): requests with a
//! sequence number and their answers, and the exits of what it spawned.
use super::wire::{AsyncLink, Received};
use crate::error::{AgentError, Result};
use pvisor_proto::isolator::{init_event, init_request, InitEvent, InitRequest, KillGroup, Spawn};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

type Answer = (InitEvent, Vec<OwnedFd>);

/// The exit of a spawned process: awaited, or arrived before anyone asked.
enum ExitSlot {
    Waiting(oneshot::Sender<i32>),
    Arrived(i32),
}

pub struct InitLink {
    link: AsyncLink,
    seq: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    exits: Mutex<HashMap<i32, ExitSlot>>,
    alive: AtomicBool,
}

fn lost() -> AgentError {
    AgentError::Conflict("the isolated session's init is gone".into())
}

impl InitLink {
    /// Waits for the init's first word (Ready with the session's root, or
    /// why it failed), then serves the link from a task of its own.
    pub async fn start(fd: OwnedFd) -> Result<(Arc<InitLink>, std::result::Result<OwnedFd, (String, bool)>)> {
        let link = AsyncLink::new(fd).map_err(|e| AgentError::io("isolated session link", e))?;
        let first = link.recv::<InitEvent>().await.map_err(|e| AgentError::io("isolated session link", e))?;
        let outcome = match first {
            Received::Message(InitEvent { kind: Some(init_event::Kind::Ready(_)), .. }, mut fds) if fds.len() == 1 => {
                Ok(fds.remove(0))
            }
            Received::Message(InitEvent { kind: Some(init_event::Kind::Failed(f)), .. }, _) => {
                Err((f.message, f.invalid))
            }
            Received::Message(other, _) => Err((format!("unexpected first message {other:?}"), false)),
            Received::Closed => Err(("the session's init ended before it was ready".into(), false)),
        };
        let me = Arc::new(InitLink {
            link,
            seq: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(outcome.is_ok()),
        });
        if outcome.is_ok() {
            tokio::spawn(me.clone().read_loop());
        }
        Ok((me, outcome))
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    async fn read_loop(self: Arc<Self>) {
        loop {
            match self.link.recv::<InitEvent>().await {
                Ok(Received::Message(ev, fds)) => self.dispatch(ev, fds),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
                Ok(Received::Closed) | Err(_) => break,
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        // Dropping the senders fails every waiter.
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn dispatch(&self, ev: InitEvent, fds: Vec<OwnedFd>) {
        if let Some(init_event::Kind::Exited(x)) = &ev.kind {
            let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
            match exits.remove(&x.pid) {
                Some(ExitSlot::Waiting(tx)) => {
                    let _ = tx.send(x.code);
                }
                _ => {
                    exits.insert(x.pid, ExitSlot::Arrived(x.code));
                }
            }
            return;
        }
        if let Some(tx) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&ev.seq) {
            let _ = tx.send((ev, fds));
        }
    }

    async fn request(&self, kind: init_request::Kind, fds: &[OwnedFd]) -> Result<Answer> {
        if !self.alive() {
            return Err(lost());
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(seq, tx);
        let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
        if let Err(e) = self.link.send(&InitRequest { seq, kind: Some(kind) }, &raw).await {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&seq);
            return Err(AgentError::io("isolated session link", e));
        }
        rx.await.map_err(|_| lost())
    }

    /// Spawns a process in the session with `stdio` (stdin, stdout, stderr);
    /// returns its pid (in the session) and its exit code to come.
    pub async fn spawn(&self, s: Spawn, stdio: [OwnedFd; 3]) -> Result<(i32, oneshot::Receiver<i32>)> {
        let program = s.argv.first().cloned().unwrap_or_default();
        let (ev, _) = self.request(init_request::Kind::Spawn(s), &stdio).await?;
        drop(stdio);
        match ev.kind {
            Some(init_event::Kind::Spawned(sp)) => {
                let (tx, rx) = oneshot::channel();
                let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
                match exits.remove(&sp.pid) {
                    Some(ExitSlot::Arrived(code)) => {
                        let _ = tx.send(code);
                    }
                    _ => {
                        exits.insert(sp.pid, ExitSlot::Waiting(tx));
                    }
                }
                Ok((sp.pid, rx))
            }
            Some(init_event::Kind::Failed(f)) if f.invalid => Err(AgentError::InvalidArgument(f.message)),
            Some(init_event::Kind::Failed(f)) => Err(AgentError::io(program, std::io::Error::other(f.message))),
            other => Err(AgentError::io(program, std::io::Error::other(format!("unexpected answer {other:?}")))),
        }
    }

    /// Kills process group `pid` of the session until it is empty.
    pub async fn kill_group(&self, pid: i32) -> Result<()> {
        self.request(init_request::Kind::KillGroup(KillGroup { pid }), &[]).await.map(drop)
    }
}

//! A context backed by a driver process (python, javascript): the driver
//! starts on the context's first run and is kept; runs take turns (FIFO:
//! tokio's mutex is fair), interrupts reach the running cell only.
use super::driver::{Driver, DriverSpec};
use super::events::{ename, Events};
use super::run::{run_cell, After};
use crate::config::AgentConfig;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

pub struct Interp {
    cfg: Arc<AgentConfig>,
    spec: DriverSpec,
    /// The driver, held by the running cell (so later runs queue here).
    slot: tokio::sync::Mutex<Option<Driver>>,
    /// The running cell's interrupt line.
    current: Mutex<Option<mpsc::UnboundedSender<()>>>,
    /// The driver's process group (0: none), readable without the slot lock
    /// so a delete can kill a busy driver.
    pgid: AtomicI32,
    deleted: AtomicBool,
}

impl Interp {
    pub fn new(cfg: Arc<AgentConfig>, spec: DriverSpec) -> Self {
        Interp {
            cfg,
            spec,
            slot: tokio::sync::Mutex::new(None),
            current: Mutex::new(None),
            pgid: AtomicI32::new(0),
            deleted: AtomicBool::new(false),
        }
    }

    /// Runs one cell once it is this run's turn.
    pub async fn run(&self, code: &str, ev: &mut Events) {
        let mut slot = self.slot.lock().await;
        if self.deleted.load(Ordering::SeqCst) {
            ev.error(ename::DELETED, "the context was deleted", vec![], 0).await;
            return;
        }
        ev.start_clock();
        if slot.is_none() {
            match Driver::start(&self.spec, &self.cfg).await {
                Ok(d) => {
                    self.pgid.store(d.pid, Ordering::SeqCst);
                    *slot = Some(d);
                }
                Err(e) => return ev.error(ename::START, e.to_string(), vec![], 0).await,
            }
        }
        let Some(driver) = slot.as_mut() else { return };
        let (itx, mut irx) = mpsc::unbounded_channel();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(itx);
        let after = run_cell(driver, code, ev, &mut irx, &self.deleted).await;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let After::Gone = after {
            self.pgid.store(0, Ordering::SeqCst);
            if let Some(d) = slot.take() {
                d.kill().await;
            }
        }
    }

    /// Interrupts the running cell; nothing when idle.
    pub fn interrupt(&self) {
        if let Some(tx) = self.current.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(());
        }
    }

    /// Ends the context: kills the driver's group (a busy cell ends with
    /// ContextDeleted, queued runs too) and waits until it is reaped.
    pub async fn close(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        let pgid = self.pgid.load(Ordering::SeqCst);
        if pgid > 0 {
            crate::spawn::kill_group(pgid).await;
        }
        if let Some(d) = self.slot.lock().await.take() {
            d.kill().await;
        }
    }
}

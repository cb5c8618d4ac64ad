//! How a VM pauses: the gate its vCPU threads park at.
//!
//! A pause is a request plus a wait. [`VmHandle::pause`](crate::vm::VmHandle::pause) sets the
//! request, kicks every vCPU out of `KVM_RUN`, and waits here until every started vCPU has
//! parked; a vCPU checks the gate before each `KVM_RUN` and, while a pause is requested, sleeps
//! on the gate's condvar (futex, which the `vcpu` seccomp filter allows) instead of entering
//! the guest. [`resume`](PauseGate::resume) clears the request and wakes them.
//!
//! The VM's end overrides a pause: [`Vm::run`](crate::vm::Vm::run) calls [`end`](PauseGate::end)
//! once its exit latch is set, which releases parked vCPUs (they then leave their loop) and any
//! thread waiting in [`pause`](PauseGate::pause_and_wait), so `stop` works on a paused VM.
//!
//! vCPUs that have not started count only once [`Vm::run`] registers them
//! ([`set_started`](PauseGate::set_started)); a vCPU started while a pause is requested parks
//! before its first `KVM_RUN`, so a VM paused before `run` starts paused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Why a pause or resume did not take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The VM has ended (or is ending): there is nothing to pause or resume.
    #[error("the VM has ended")]
    Ended,
    /// A resume from another thread cleared the pause before every vCPU parked.
    #[error("a resume overtook the pause")]
    Resumed,
}

#[derive(Default)]
struct State {
    /// A pause is requested (mirrors `PauseGate::requested`, read under the lock).
    paused: bool,
    /// vCPU threads started by `Vm::run`.
    started: usize,
    /// vCPU threads sleeping in `park`.
    parked: usize,
    /// The VM has ended: nobody parks any more.
    ended: bool,
}

/// The pause request and the vCPUs parked for it, shared by the VM's handle and its vCPUs.
#[derive(Default)]
pub struct PauseGate {
    /// Checked by every vCPU before each `KVM_RUN` without taking the lock.
    requested: AtomicBool,
    state: Mutex<State>,
    /// Signalled on every change: vCPUs wait on it for a resume or the end, pausers for the
    /// last vCPU to park.
    changed: Condvar,
}

impl PauseGate {
    /// An open gate (not paused).
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Requests a pause. The caller then kicks the vCPUs (so none stays in `KVM_RUN`) and
    /// calls [`wait_parked`](Self::wait_parked).
    pub fn request(&self) {
        let mut state = self.lock();
        state.paused = true;
        self.requested.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// Blocks until every started vCPU is parked (`Ok`), the pause was overtaken by a resume,
    /// or the VM ended.
    pub fn wait_parked(&self) -> Result<(), Error> {
        let mut state = self.lock();
        loop {
            if state.ended {
                return Err(Error::Ended);
            }
            if !state.paused {
                return Err(Error::Resumed);
            }
            if state.parked >= state.started {
                return Ok(());
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`request`](Self::request) then [`wait_parked`](Self::wait_parked), with no kick in
    /// between (for callers whose vCPUs are not in `KVM_RUN`, such as this module's tests).
    pub fn pause_and_wait(&self) -> Result<(), Error> {
        self.request();
        self.wait_parked()
    }

    /// Clears the pause request and wakes the parked vCPUs. A no-op on a running VM; an error
    /// once the VM has ended.
    pub fn resume(&self) -> Result<(), Error> {
        let mut state = self.lock();
        state.paused = false;
        self.requested.store(false, Ordering::SeqCst);
        self.changed.notify_all();
        if state.ended {
            return Err(Error::Ended);
        }
        Ok(())
    }

    /// Whether a pause is requested (a cheap check for the vCPU loop).
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Whether every started vCPU is parked for a pause right now.
    pub fn is_paused(&self) -> bool {
        let state = self.lock();
        state.paused && !state.ended && state.parked >= state.started
    }

    /// Records how many vCPU threads `Vm::run` started (before any of them could park, or
    /// while the caller holds the lock that pausers kick under).
    pub fn set_started(&self, started: usize) {
        let mut state = self.lock();
        state.started = started;
        self.changed.notify_all();
    }

    /// Called by a vCPU thread before `KVM_RUN`: while a pause is requested, sleeps. Returns
    /// at once if no pause is requested or the VM has ended.
    pub fn park(&self) {
        if !self.is_requested() {
            return;
        }
        let mut state = self.lock();
        if !state.paused || state.ended {
            return;
        }
        state.parked += 1;
        self.changed.notify_all();
        while state.paused && !state.ended {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.parked -= 1;
    }

    /// The VM has ended: releases parked vCPUs and waiting pausers for good.
    pub fn end(&self) {
        let mut state = self.lock();
        state.ended = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn spawn_parker(gate: &Arc<PauseGate>) -> std::thread::JoinHandle<()> {
        let g = gate.clone();
        std::thread::spawn(move || g.park())
    }

    #[test]
    fn park_returns_at_once_when_not_paused() {
        let gate = PauseGate::new();
        gate.set_started(1);
        gate.park();
        assert!(!gate.is_paused());
    }

    #[test]
    fn a_pause_waits_for_every_started_vcpu_and_a_resume_releases_them() {
        let gate = Arc::new(PauseGate::new());
        gate.set_started(2);
        gate.request();
        let parkers = [spawn_parker(&gate), spawn_parker(&gate)];
        assert_eq!(gate.wait_parked(), Ok(()), "both vCPUs parked");
        assert!(gate.is_paused());
        assert_eq!(gate.pause_and_wait(), Ok(()), "a second pause is a no-op");
        assert_eq!(gate.resume(), Ok(()));
        assert_eq!(gate.resume(), Ok(()), "a second resume is a no-op");
        for p in parkers {
            p.join().unwrap();
        }
        assert!(!gate.is_paused());
    }

    #[test]
    fn a_pause_with_no_started_vcpus_returns_at_once() {
        let gate = PauseGate::new();
        assert_eq!(gate.pause_and_wait(), Ok(()));
    }

    #[test]
    fn a_resume_overtaking_a_pause_is_reported() {
        let gate = Arc::new(PauseGate::new());
        gate.set_started(1);
        gate.request();
        let g = gate.clone();
        let pauser = std::thread::spawn(move || g.wait_parked());
        assert_eq!(gate.resume(), Ok(()));
        // No vCPU ever parks: only the resume ends the pauser's wait.
        assert_eq!(pauser.join().unwrap(), Err(Error::Resumed));
    }

    #[test]
    fn the_end_releases_parked_vcpus_and_pausers() {
        let gate = Arc::new(PauseGate::new());
        gate.set_started(2);
        gate.request();
        let parker = spawn_parker(&gate);
        let g = gate.clone();
        // One of two vCPUs parks: the pauser waits until the end.
        let pauser = std::thread::spawn(move || g.wait_parked());
        gate.end();
        parker.join().unwrap();
        assert_eq!(pauser.join().unwrap(), Err(Error::Ended), "the end overtook the pause");
        gate.request();
        gate.park(); // after the end, never sleeps
        assert_eq!(gate.resume(), Err(Error::Ended));
    }
}

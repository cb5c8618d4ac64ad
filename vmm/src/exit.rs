//! How a VM ends: the typed exit and the latch that records the first one.
//!
//! Whatever ends a VM (a vCPU's triple fault, a device's reset request, a failure, a stop from
//! another thread) goes through one [`ExitLatch`]: the first request wins and is what
//! [`Vm::run`](crate::vm::Vm::run) returns; the vCPUs see the latch set at their next exit (or
//! their kick) and leave their loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

/// Why a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest shut down: a triple fault (Linux with `reboot=t`), a system-event shutdown, or
    /// `hlt` without an irqchip.
    Shutdown,
    /// The guest asked for a reset (i8042 `0xfe`, a system-event reset). There is no reboot:
    /// the VM ends.
    Reset,
    /// Another thread stopped the VM ([`VmHandle::stop`](crate::vm::VmHandle::stop)).
    Stopped,
    /// A test guest wrote this code to the debug exit port.
    DebugExit(u8),
    /// The VM failed: KVM could not run the guest, or the VMM hit an error.
    Failed {
        /// What went wrong, with the vCPU's registers where a vCPU failed.
        reason: String,
        /// The last lines of the guest's console.
        console_tail: String,
    },
}

/// The first exit requested, and a way to wait for it.
#[derive(Default)]
pub struct ExitLatch {
    set: AtomicBool,
    exit: Mutex<Option<VmExit>>,
    cond: Condvar,
}

impl ExitLatch {
    /// An unset latch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `exit` unless an exit was already recorded. Returns whether this one won.
    pub fn request(&self, exit: VmExit) -> bool {
        let mut slot = self.exit.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(exit);
        self.set.store(true, Ordering::SeqCst);
        self.cond.notify_all();
        true
    }

    /// Whether an exit was requested (cheap: one atomic load, checked on every vCPU exit).
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Blocks until an exit is requested and returns it.
    pub fn wait(&self) -> VmExit {
        let mut slot = self.exit.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(exit) = slot.as_ref() {
                return exit.clone();
            }
            slot = self.cond.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_first_request_wins() {
        let latch = ExitLatch::new();
        assert!(!latch.is_set());
        assert!(latch.request(VmExit::Reset));
        assert!(!latch.request(VmExit::Stopped));
        assert!(latch.is_set());
        assert_eq!(latch.wait(), VmExit::Reset);
    }

    #[test]
    fn wait_returns_a_request_from_another_thread() {
        let latch = Arc::new(ExitLatch::new());
        let l = latch.clone();
        let t = std::thread::spawn(move || l.request(VmExit::Shutdown));
        assert_eq!(latch.wait(), VmExit::Shutdown);
        assert!(t.join().unwrap());
    }
}

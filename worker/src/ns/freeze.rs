//! Pausing an ns sandbox: the cgroup freezer on the group's `sandbox` leaf.
//!
//! The sandbox inherited the worker's `sandbox` leaf at clone. The worker
//! leaves that freeze scope only when a pause first needs it: a cgroup
//! migration waits for an RCU grace period (~15 ms here) and blocks every
//! fork in the meantime, so it stays off the create and first-command path.
use crate::cgroup::{GroupPaths, SANDBOX_LEAF, WORKER_LEAF};
use crate::error::{Result, WorkerError};
use std::sync::Mutex;

pub struct FreezeScope {
    group: Option<GroupPaths>,
    /// Whether the worker still shares the sandbox's leaf.
    shared: Mutex<bool>,
}

impl FreezeScope {
    pub fn new(group: Option<GroupPaths>) -> Self {
        FreezeScope { group, shared: Mutex::new(true) }
    }

    fn group(&self) -> Result<&GroupPaths> {
        self.group.as_ref().ok_or_else(|| WorkerError::NoCgroup("sandbox has no cgroup".into()))
    }

    /// Freezes (or thaws) the sandbox, first moving the worker out of its
    /// leaf if it is still there.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        let group = self.group()?;
        {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if *shared {
                group.join_freeze_scope(WORKER_LEAF, std::process::id() as i32)?;
                *shared = false;
            }
        }
        group.freeze(SANDBOX_LEAF, frozen)
    }

    /// A frozen process cannot die: thaw after a SIGKILL.
    pub fn thaw_for_kill(&self) -> Result<()> {
        match &self.group {
            Some(g) => g.freeze(SANDBOX_LEAF, false),
            None => Ok(()),
        }
    }
}

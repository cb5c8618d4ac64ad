//! Isolated sessions (execd's `/v1/isolated`, OSEP-0013).
//!
//! A session is a persistent shell in pid, mount, ipc and uts namespaces of
//! its own (and a network namespace with only a loopback, unless it shares
//! the sandbox's), whose root is the sandbox's made read-only but for the
//! session's overlays, binds and private `/tmp`, `/dev`, `/run` and `/proc`.
//! Processes outside never see its mounts; its processes see only their own
//! pids. Three processes make it:
//!
//! * [`isolator`]: the sandbox's one process allowed to build namespaces
//!   (forked before the sandbox drops its privileges); serves the agent;
//! * [`init`]: each session's PID 1, cloned by the isolator, which builds the
//!   session's root ([`layout`]), takes the sandbox's privileges and then
//!   spawns, kills and reaps the session's processes for the agent;
//! * the agent ([`manager`], [`session`]): the sessions' table, their shells
//!   (the same driver as ordinary sessions, [`crate::session`]), background
//!   runs with kept output ([`runlog`]), idle collection, and the file API
//!   run inside a session's root ([`crate::identity::Scope`]).
//!
//! The agent talks to both over `SOCK_SEQPACKET` sockets ([`wire`],
//! `pvisor.isolator.v1`). Deleting a session kills its init, with which the
//! kernel kills every process of its pid namespace; its mounts and tmpfs go
//! with the namespace, its persistent uppers are removed by the isolator.
pub mod env;
pub mod init;
pub mod isolator;
pub mod layout;
pub mod link;
pub mod manager;
pub mod runlog;
pub mod session;
pub mod wire;

pub use manager::Isolation;

use crate::error::AgentError;
use pvisor_proto::agent::ErrorReason;

/// The execd error an isolated-session call maps to (`ErrorDetail`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    SessionNotFound,
    RunNotFound,
    Unavailable,
    SessionNotActive,
}

impl Reason {
    pub fn error(self, message: String) -> AgentError {
        AgentError::Isolated { reason: self, message }
    }

    pub fn proto(self) -> ErrorReason {
        match self {
            Reason::SessionNotFound => ErrorReason::SessionNotFound,
            Reason::RunNotFound => ErrorReason::RunNotFound,
            Reason::Unavailable => ErrorReason::IsolationUnavailable,
            Reason::SessionNotActive => ErrorReason::SessionNotActive,
        }
    }
}

/// A random (version 4) UUID, as the SDK expects session and run ids.
pub fn new_uuid() -> String {
    let mut b = rand::random::<u128>().to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_version_4() {
        let u = super::new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.as_bytes()[14], b'4');
        assert!(matches!(u.as_bytes()[19], b'8' | b'9' | b'a' | b'b'), "{u}");
        assert_ne!(u, super::new_uuid());
    }
}

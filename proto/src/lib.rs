//! gRPC contracts of pvisor.
//!
//! * [`agent`]: the in-sandbox agent (commands, sessions, files, tunnels).
//! * [`isolator`]: the agent's contract with its isolator and with isolated
//!   sessions' inits (one message per datagram, no service).
//! * [`net`]: a sandbox's egress policy and the worker's contract with its
//!   network process (pvisor-netd).
//! * [`worker`]: the per-sandbox worker (readiness, metrics, pause, shutdown)
//!   and its start-up configuration (`WorkerConfig`, sent on its config pipe).
//!
//! The worker serves both on its Unix socket; [`FILE_DESCRIPTOR_SET`] feeds
//! server reflection so `grpcurl -plaintext -unix SOCK list` works.

/// The generated code, nested as the proto packages are (the worker's
/// messages refer to the agent's as `super::super::agent::v1`).
pub mod pvisor {
    pub mod agent {
        pub mod v1 {
            tonic::include_proto!("pvisor.agent.v1");
        }
    }
    pub mod isolator {
        pub mod v1 {
            tonic::include_proto!("pvisor.isolator.v1");
        }
    }
    pub mod net {
        pub mod v1 {
            tonic::include_proto!("pvisor.net.v1");
        }
    }
    pub mod worker {
        pub mod v1 {
            tonic::include_proto!("pvisor.worker.v1");
        }
    }
}

pub use pvisor::agent::v1 as agent;
pub use pvisor::isolator::v1 as isolator;
pub use pvisor::net::v1 as net;
pub use pvisor::worker::v1 as worker;

/// Encoded `FileDescriptorSet` of every service above.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("pvisor_descriptor");

/// Full gRPC service name of the agent, as routed by the worker.
pub const AGENT_SERVICE: &str = "pvisor.agent.v1.Agent";

/// The status of a pre-start hook that failed (`Agent.Configure`'s, relayed
/// by `Worker.Ready`): ABORTED, the failure encoded as its details.
pub fn hook_failure_status(failure: &agent::HookFailure, message: impl Into<String>) -> tonic::Status {
    use prost::Message;
    tonic::Status::with_details(tonic::Code::Aborted, message, failure.encode_to_vec().into())
}

/// The hook failure a status carries, if it is one ([`hook_failure_status`]).
pub fn hook_failure_of(status: &tonic::Status) -> Option<agent::HookFailure> {
    use prost::Message;
    if status.code() != tonic::Code::Aborted || status.details().is_empty() {
        return None;
    }
    agent::HookFailure::decode(status.details()).ok()
}

/// Current time as Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_failure_round_trips_through_a_status() {
        let f = agent::HookFailure {
            hook: "preStart".into(),
            exit_code: 3,
            timed_out: false,
            error: "exited with status 3".into(),
            output: "boom".into(),
        };
        let s = hook_failure_status(&f, "the pre-start hook failed");
        assert_eq!(s.code(), tonic::Code::Aborted);
        assert_eq!(hook_failure_of(&s), Some(f));
        assert_eq!(hook_failure_of(&tonic::Status::aborted("no details")), None);
        assert_eq!(hook_failure_of(&tonic::Status::failed_precondition("other")), None);
    }
}

//! gRPC contracts of pvisor.
//!
//! * [`agent`]: the in-sandbox agent (commands, sessions, files, tunnels).
//! * [`worker`]: the per-sandbox worker (readiness, metrics, pause, shutdown).
//!
//! The worker serves both on its Unix socket; [`FILE_DESCRIPTOR_SET`] feeds
//! server reflection so `grpcurl -plaintext -unix SOCK list` works.

pub mod agent {
    tonic::include_proto!("pvisor.agent.v1");
}

pub mod worker {
    tonic::include_proto!("pvisor.worker.v1");
}

/// Encoded `FileDescriptorSet` of every service above.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("pvisor_descriptor");

/// Full gRPC service name of the agent, as routed by the worker.
pub const AGENT_SERVICE: &str = "pvisor.agent.v1.Agent";

/// Current time as Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

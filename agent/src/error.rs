//! Errors of agent operations and their mapping onto gRPC statuses.
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("spawn {program}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("{0}")]
    Conflict(String),
    /// A walk of a tree (list, search, delete, copy) failed.
    #[error(transparent)]
    Tree(#[from] pvisor_fstree::Error),
    /// An isolated-session call with an execd error of its own (carried as
    /// an `ErrorDetail` in the status details).
    #[error("{message}")]
    Isolated { reason: crate::isolated::Reason, message: String },
}

impl AgentError {
    pub fn io(path: impl Into<String>, source: io::Error) -> Self {
        AgentError::Io { path: path.into(), source }
    }
}

impl From<AgentError> for tonic::Status {
    fn from(e: AgentError) -> Self {
        use tonic::Status;
        let msg = e.to_string();
        match &e {
            AgentError::InvalidArgument(_) => Status::invalid_argument(msg),
            AgentError::NotFound(_) => Status::not_found(msg),
            AgentError::Conflict(_) => Status::failed_precondition(msg),
            AgentError::Isolated { reason, .. } => {
                use crate::isolated::Reason;
                use prost::Message;
                let code = match reason {
                    Reason::SessionNotFound | Reason::RunNotFound => tonic::Code::NotFound,
                    Reason::Unavailable => tonic::Code::Unavailable,
                    Reason::SessionNotActive => tonic::Code::FailedPrecondition,
                };
                let detail = pvisor_proto::agent::ErrorDetail { reason: reason.proto() as i32 };
                Status::with_details(code, msg, detail.encode_to_vec().into())
            }
            AgentError::Tree(t) => match t.errno() {
                Some(nix::errno::Errno::ENOENT) => Status::not_found(msg),
                Some(nix::errno::Errno::EACCES) | Some(nix::errno::Errno::EPERM) => Status::permission_denied(msg),
                Some(nix::errno::Errno::ENOTDIR) | Some(nix::errno::Errno::ENAMETOOLONG) => {
                    Status::invalid_argument(msg)
                }
                Some(nix::errno::Errno::ENOSPC) | Some(nix::errno::Errno::EDQUOT) => Status::resource_exhausted(msg),
                Some(nix::errno::Errno::EROFS) => Status::permission_denied(msg),
                Some(_) => Status::internal(msg),
                // Moved meanwhile, a mount point inside, entries keep appearing.
                None => Status::failed_precondition(msg),
            },
            AgentError::Spawn { source, .. } | AgentError::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => Status::not_found(msg),
                io::ErrorKind::PermissionDenied => Status::permission_denied(msg),
                io::ErrorKind::AlreadyExists => Status::already_exists(msg),
                io::ErrorKind::InvalidInput
                | io::ErrorKind::InvalidData
                | io::ErrorKind::IsADirectory
                | io::ErrorKind::NotADirectory
                | io::ErrorKind::DirectoryNotEmpty => Status::invalid_argument(msg),
                _ => match source.raw_os_error() {
                    Some(libc::ENOSPC) | Some(libc::EDQUOT) => Status::resource_exhausted(msg),
                    // A read-only mount (an isolated session's `ro` overlay or root, /sys).
                    Some(libc::EROFS) => Status::permission_denied(msg),
                    _ => Status::internal(msg),
                },
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, AgentError>;

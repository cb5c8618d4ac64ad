//! Serving the agent's gRPC service on one inherited connection (the
//! backend's socketpair or vsock stream) or, for tests, on a listening socket.
use crate::service::AgentService;
use pvisor_proto::agent::agent_server::AgentServer;
use std::os::fd::{FromRawFd, RawFd};
use tokio_stream::StreamExt;
use tonic::transport::Server;

/// Largest gRPC message either side accepts.
pub const MAX_MESSAGE: usize = 64 << 20;

fn router(svc: AgentService) -> tonic::transport::server::Router {
    let agent = AgentServer::new(svc).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
    Server::builder().add_service(agent)
}

/// Serves HTTP/2 on the already-connected stream `fd` until the process ends.
pub async fn serve_fd(fd: RawFd, svc: AgentService) -> anyhow_like::Result<()> {
    // SAFETY: the backend passes `fd` as an open, connected stream socket that
    // nothing else in this process owns; we take ownership exactly once.
    let std = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    // The control connection must never reach a sandbox process.
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    std.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(std)?;
    let incoming = tokio_stream::once(Ok::<_, std::io::Error>(stream)).chain(tokio_stream::pending());
    router(svc).serve_with_incoming(incoming).await?;
    Ok(())
}

/// Serves on a Unix socket path (for tests and debugging outside a sandbox).
pub async fn serve_path(path: &std::path::Path, svc: AgentService) -> anyhow_like::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    router(svc).serve_with_incoming(incoming).await?;
    Ok(())
}

/// A minimal boxed error, so the static agent needs no extra crates.
pub mod anyhow_like {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}

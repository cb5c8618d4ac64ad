//! Serving the agent's gRPC service on every connection the backend brings.
//!
//! The agent accepts connections repeatedly, so a worker can reconnect:
//! * ns: the backend hands the agent one end of a `SOCK_SEQPACKET` socketpair
//!   (the *connection socket*); each message on it carries one connected
//!   stream socket as `SCM_RIGHTS`, and each such stream is served;
//! * vm: the guest agent listens on vsock ([`crate::guest`]);
//! * tests: a listening Unix socket path.
//!
//! All connections share one [`AgentService`], so state survives reconnects.
use crate::service::AgentService;
use futures::Stream;
use pvisor_proto::agent::agent_server::AgentServer;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::server::Connected;
use tonic::transport::Server;

/// Largest gRPC message either side accepts.
pub const MAX_MESSAGE: usize = 64 << 20;

fn router(svc: AgentService) -> tonic::transport::server::Router {
    let agent = AgentServer::new(svc).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
    Server::builder().add_service(agent)
}

/// Serves every connection `incoming` yields until it ends.
pub async fn serve_incoming<S, IO>(incoming: S, svc: AgentService) -> anyhow_like::Result<()>
where
    S: Stream<Item = io::Result<IO>> + Send,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    router(svc).serve_with_incoming(incoming).await?;
    Ok(())
}

/// What one message on the connection socket brought.
enum Received {
    Stream(OwnedFd),
    /// A message without a descriptor: ignored.
    Nothing,
    /// The worker's end is closed.
    Closed,
}

/// Receives one message from the connection socket.
fn recv_stream(sock: RawFd) -> io::Result<Received> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT)
        .map_err(io::Error::from)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: SCM_RIGHTS installed these fds in this process just
            // now; nothing else refers to them.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    // One fd per message; any extra ones are closed as `fds` drops.
    Ok(if fds.is_empty() { Received::Nothing } else { Received::Stream(fds.swap_remove(0)) })
}

/// The connections the worker sends over the connection socket `fd`.
pub fn fd_connections(fd: RawFd) -> io::Result<impl Stream<Item = io::Result<tokio::net::UnixStream>>> {
    // SAFETY: the backend passes `fd` as an open connection socket that
    // nothing else in this process owns; we take ownership exactly once.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // The connection socket must never reach a sandbox process.
    nix::fcntl::fcntl(sock.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    nix::fcntl::fcntl(sock.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
    // SAFETY: `sock` is an open socket owned by the AsyncFd for its whole
    // life; OwnedFd::as_raw_fd always returns that same descriptor.
    let sock =
        unsafe { AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE) }.map_err(io::Error::from)?;
    Ok(async_stream::stream! {
        loop {
            let got = match sock.readable().await {
                Ok(mut guard) => match guard.try_io(|s| recv_stream(s.get_ref().as_raw_fd())) {
                    Ok(r) => r,
                    Err(_would_block) => continue,
                },
                Err(e) => Err(e),
            };
            match got {
                Ok(Received::Nothing) => continue,
                Ok(Received::Stream(fd)) => {
                    let std = std::os::unix::net::UnixStream::from(fd);
                    let conn = std.set_nonblocking(true).and_then(|()| tokio::net::UnixStream::from_std(std));
                    yield conn;
                }
                // The worker is gone: no new connections, but the ones being
                // served (and the sandbox) go on until the worker's end kills it.
                Ok(Received::Closed) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("connection socket: {e}");
                    break;
                }
            }
        }
        futures::future::pending::<()>().await;
    })
}

/// Serves on a Unix socket path (for tests and debugging outside a sandbox).
pub async fn serve_path(path: &std::path::Path, svc: AgentService) -> anyhow_like::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    serve_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener), svc).await
}

/// A minimal boxed error, so the static agent needs no extra crates.
pub mod anyhow_like {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}

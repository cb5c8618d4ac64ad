//! An AF_VSOCK listener for tokio: how the worker reaches the agent in a
//! microVM. The agent listens on `VMADDR_CID_ANY:port` and accepts
//! repeatedly (a worker may reconnect); every connection is a
//! [`VsockStream`] that tonic's `serve_with_incoming` can serve.
//!
//! Small and on nix, rather than the `tokio-vsock` crate: a listening
//! socket, `accept4` when tokio's reactor says readable, `read`/`send` on
//! the streams. Accept errors that concern one connection are skipped;
//! errors of the listener itself (out of fds or memory) are yielded and the
//! next accept waits a moment, so tonic's loop, which logs and continues,
//! does not spin.
use futures::Stream;
use nix::sys::socket::{
    accept4, bind, connect, getpeername, getsockopt, listen, send, shutdown, socket, sockopt, AddressFamily, Backlog,
    MsgFlags, Shutdown, SockFlag, SockType, VsockAddr,
};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The wildcard CID a listener binds to.
pub const CID_ANY: u32 = libc::VMADDR_CID_ANY;
/// This machine itself, through the loopback transport when the kernel has it.
pub const CID_LOCAL: u32 = libc::VMADDR_CID_LOCAL;
/// The host's CID, seen from a guest.
pub const CID_HOST: u32 = libc::VMADDR_CID_HOST;

/// Pending connections the kernel queues before accept.
const BACKLOG: i32 = 16;
/// Pause after an accept error of the listener itself (EMFILE, ENOMEM...).
const ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// `IOCTL_VM_SOCKETS_GET_LOCAL_CID` on /dev/vsock (`_IO(7, 0xb9)`).
const IOCTL_GET_LOCAL_CID: libc::c_ulong = 0x7b9;

/// Registers `fd` with the current tokio runtime's reactor (panics outside one).
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its descriptor open, unchanged, until it is
    // dropped, and `as_raw_fd` always returns that descriptor; the AsyncFd
    // owns it from here, and nothing else can close it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// The other end of an accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VsockPeer {
    pub cid: u32,
    pub port: u32,
}

/// What tonic puts in every request's extensions for a [`VsockStream`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VsockConnectInfo {
    /// `None` when the peer's address is unknown (not a vsock socket in tests).
    pub peer: Option<VsockPeer>,
}

/// A vsock stream socket bound to `VMADDR_CID_ANY:port`, not yet listening.
/// Made before the guest drops its privileges: the sandbox filter refuses
/// `socket(AF_VSOCK)` to everything that runs afterwards.
pub fn bind_socket(port: u32) -> io::Result<OwnedFd> {
    let fd = socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)?;
    bind(fd.as_raw_fd(), &VsockAddr::new(CID_ANY, port))?;
    Ok(fd)
}

/// A listening socket registered with tokio's reactor.
pub struct VsockListener {
    fd: AsyncFd<OwnedFd>,
}

impl VsockListener {
    /// Listens on `VMADDR_CID_ANY:port`. Must run inside a tokio runtime.
    pub fn bind(port: u32) -> io::Result<Self> {
        Self::from_bound(bind_socket(port)?)
    }

    /// Listens on an already bound stream socket (any family; tests use
    /// AF_UNIX to run the same accept path where vsock cannot connect).
    /// Must run inside a tokio runtime.
    pub fn from_bound(fd: OwnedFd) -> io::Result<Self> {
        nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        listen(&fd, Backlog::new(BACKLOG)?)?;
        Ok(VsockListener { fd: register(fd)? })
    }

    /// The port this listener is bound to (useful after binding port `VMADDR_PORT_ANY`).
    pub fn local_port(&self) -> io::Result<u32> {
        let addr: VsockAddr = nix::sys::socket::getsockname(self.fd.as_raw_fd())?;
        Ok(addr.port())
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> io::Result<VsockStream> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<VsockStream>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
            match guard.try_io(|fd| accept4(fd.as_raw_fd(), flags).map_err(io::Error::from)) {
                Ok(Ok(raw)) => {
                    // SAFETY: accept4 just returned `raw`, a new fd nothing else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                    return Poll::Ready(VsockStream::from_connected(fd));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }

    /// The endless stream of accepted connections from any peer, for
    /// `serve_with_incoming` (the self-test's loopback clients).
    pub fn incoming(self) -> Incoming {
        Incoming { listener: self, backoff: None, only_cid: None }
    }

    /// Accepted connections from `cid` only; others are closed unanswered.
    pub fn incoming_from(self, cid: u32) -> Incoming {
        Incoming { listener: self, backoff: None, only_cid: Some(cid) }
    }
}

/// Listens on `VMADDR_CID_ANY:port` and yields every connection from the
/// host (CID 2), forever. A process inside the guest reaching the agent
/// over vsock loopback (CID 1) would get its root shell: such connections
/// are closed at once. Must run inside a tokio runtime.
pub fn incoming(port: u32) -> io::Result<Incoming> {
    Ok(VsockListener::bind(port)?.incoming_from(CID_HOST))
}

/// Accepted connections of a [`VsockListener`]; never ends.
pub struct Incoming {
    listener: VsockListener,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Only connections from this CID are served.
    only_cid: Option<u32>,
}

/// Errors of one connection (it went away before accept): skip, accept the next.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::ECONNRESET | libc::EINTR | libc::EPROTO | libc::EPERM))
}

impl Stream for Incoming {
    type Item = io::Result<VsockStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(sleep) = self.backoff.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            self.backoff = None;
        }
        loop {
            match ready!(self.listener.poll_accept(cx)) {
                Ok(s) if self.only_cid.is_some_and(|cid| s.peer().map(|p| p.cid) != Some(cid)) => {
                    tracing::warn!("vsock: closed a connection from {:?}: only the host may connect", s.peer());
                    continue;
                }
                Ok(s) => return Poll::Ready(Some(Ok(s))),
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    self.backoff = Some(Box::pin(tokio::time::sleep(ERROR_BACKOFF)));
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

/// One connection, registered with tokio's reactor.
pub struct VsockStream {
    fd: AsyncFd<OwnedFd>,
    peer: Option<VsockPeer>,
}

impl VsockStream {
    /// Wraps a connected, non-blocking stream socket. Must run inside a tokio runtime.
    fn from_connected(fd: OwnedFd) -> io::Result<Self> {
        let peer = getpeername::<VsockAddr>(fd.as_raw_fd()).ok().map(|a| VsockPeer { cid: a.cid(), port: a.port() });
        Ok(VsockStream { fd: register(fd)?, peer })
    }

    /// Connects to `cid:port` (the worker's side, and tests). Must run inside a tokio runtime.
    pub async fn connect(cid: u32, port: u32) -> io::Result<Self> {
        let fd =
            socket(AddressFamily::Vsock, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)?;
        match connect(fd.as_raw_fd(), &VsockAddr::new(cid, port)) {
            Ok(()) => return Self::from_connected(fd),
            Err(nix::errno::Errno::EINPROGRESS) => {}
            Err(e) => return Err(e.into()),
        }
        let afd = register(fd)?;
        // A non-blocking connect completes when the socket turns writable;
        // SO_ERROR then says how.
        let _ = afd.writable().await?;
        match getsockopt(&afd, sockopt::SocketError)? {
            0 => {}
            err => return Err(io::Error::from_raw_os_error(err)),
        }
        Self::from_connected(afd.into_inner())
    }

    /// The other end, when it is a vsock address.
    pub fn peer(&self) -> Option<VsockPeer> {
        self.peer
    }
}

impl AsyncRead for VsockStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| nix::unistd::read(fd.as_raw_fd(), unfilled).map_err(io::Error::from)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for VsockStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            // MSG_NOSIGNAL: a peer that went away is an EPIPE, never a SIGPIPE.
            match guard.try_io(|fd| send(fd.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(shutdown(self.fd.as_raw_fd(), Shutdown::Write).map_err(io::Error::from))
    }
}

impl tonic::transport::server::Connected for VsockStream {
    type ConnectInfo = VsockConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        VsockConnectInfo { peer: self.peer }
    }
}

/// This machine's own CID (`IOCTL_VM_SOCKETS_GET_LOCAL_CID` on /dev/vsock).
pub fn local_cid() -> io::Result<u32> {
    let dev = std::fs::File::open("/dev/vsock")?;
    let mut cid: u32 = 0;
    // SAFETY: the ioctl writes one u32 into `cid`, which lives across the call.
    if unsafe { libc::ioctl(dev.as_raw_fd(), IOCTL_GET_LOCAL_CID as _, &mut cid as *mut u32) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener on a Unix socket path: the same accept and stream code as
    /// vsock, runnable on a host whose vsock cannot connect to itself.
    fn unix_listener(dir: &std::path::Path) -> (VsockListener, std::path::PathBuf) {
        let path = dir.join("l.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        (VsockListener::from_bound(OwnedFd::from(l)).unwrap(), path)
    }

    #[tokio::test]
    async fn accepts_repeatedly_and_streams_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let (l, path) = unix_listener(dir.path());
        let mut incoming = l.incoming();
        let server = tokio::spawn(async move {
            for _ in 0..3 {
                let mut s = incoming.next().await.unwrap().unwrap();
                assert_eq!(s.peer(), None, "a Unix peer has no vsock address");
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.unwrap();
                got.reverse();
                s.write_all(&got).await.unwrap();
                s.shutdown().await.unwrap();
            }
        });
        for i in 0..3 {
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            let msg = format!("hello {i}").into_bytes();
            c.write_all(&msg).await.unwrap();
            c.shutdown().await.unwrap();
            let mut back = Vec::new();
            c.read_to_end(&mut back).await.unwrap();
            let mut want = msg.clone();
            want.reverse();
            assert_eq!(back, want, "connection {i}");
        }
        server.await.unwrap();
    }

    #[tokio::test]
    async fn large_transfer_survives_partial_reads_and_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (l, path) = unix_listener(dir.path());
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        let want = data.clone();
        let server = tokio::spawn(async move {
            let mut s = l.accept().await.unwrap();
            s.write_all(&data).await.unwrap();
            s.shutdown().await.unwrap();
        });
        let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert!(got == want, "4 MiB arrive intact ({} bytes)", got.len());
        server.await.unwrap();
    }

    #[tokio::test]
    async fn tonic_serves_the_agent_over_the_listener_to_two_clients_in_turn() {
        use hyper_util::rt::TokioIo;
        use pvisor_proto::agent::agent_client::AgentClient;
        use pvisor_proto::agent::agent_server::AgentServer;
        let dir = tempfile::tempdir().unwrap();
        let (l, path) = unix_listener(dir.path());
        let svc = crate::service::AgentService::new();
        let server = tokio::spawn(
            tonic::transport::Server::builder().add_service(AgentServer::new(svc)).serve_with_incoming(l.incoming()),
        );
        for round in 0..2 {
            let p = path.clone();
            let channel = tonic::transport::Endpoint::from_static("http://agent")
                .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                    let p = p.clone();
                    async move { Ok::<_, io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?)) }
                }))
                .await
                .unwrap();
            let mut client = AgentClient::new(channel);
            let reply = client.ping(pvisor_proto::agent::Empty {}).await.unwrap().into_inner();
            assert_eq!(reply.pid, std::process::id(), "round {round}");
            // The first client goes away entirely before the second connects.
            drop(client);
        }
        assert!(!server.is_finished(), "the server keeps accepting");
        server.abort();
    }

    #[test]
    fn per_connection_errors_are_skipped_listener_errors_are_not() {
        assert!(is_per_connection(&io::Error::from_raw_os_error(libc::ECONNABORTED)));
        assert!(!is_per_connection(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(!is_per_connection(&io::Error::from_raw_os_error(libc::ENOMEM)));
    }
}

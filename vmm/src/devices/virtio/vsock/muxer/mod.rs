//! The connection table and the host side: the Unix listener, connections
//! to `<uds_path>_<port>`, in-process connect requests, and the epoll set
//! over all their sockets (exposed to the transport as one fd).
//!
//! This file keeps the table itself; `guest` handles tx packets, `host` the
//! host sockets' events, `rx` fills the guest's rx buffers.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

mod guest;
mod host;
mod rx;

use super::connection::{Connection, State};
use super::packet::OP_RST;
use super::{Error, MAX_CONTROL_PACKETS};

/// Epoll tokens of the fixed sources; connections get tokens from here up.
const TOKEN_LISTENER: u64 = 0;
const TOKEN_REQUESTS: u64 = 1;
const FIRST_DYNAMIC_TOKEN: u64 = 16;
/// Host-initiated connections get local ports from here up.
const FIRST_HOST_PORT: u32 = 1 << 30;
/// Longest `CONNECT <port>\n` line accepted.
const MAX_CONNECT_LINE: usize = 32;

/// (local port on the host side, the guest's port).
pub(super) type ConnKey = (u32, u32);

/// An in-process connect ([`super::VsockHandle::connect`]).
pub(super) struct ConnectRequest {
    pub port: u32,
    pub stream: UnixStream,
    pub reply: Sender<io::Result<()>>,
}

enum Source {
    Conn(ConnKey),
    /// Accepted on the listener; the bytes of its `CONNECT` line so far.
    Pending(UnixStream, Vec<u8>),
}

/// A control packet waiting for an rx buffer; credit fields are filled in
/// when it is sent.
struct Control {
    key: ConnKey,
    op: u16,
    flags: u32,
}

pub(super) struct Muxer {
    guest_cid: u64,
    uds_path: Option<PathBuf>,
    epoll: Epoll,
    listener: Option<UnixListener>,
    /// The listener is out of the epoll set (accept ran out of fds).
    listener_paused: bool,
    requests: Receiver<ConnectRequest>,
    request_evt: Arc<EventFd>,
    conns: HashMap<ConnKey, Connection>,
    sources: HashMap<u64, Source>,
    next_token: u64,
    next_host_port: u32,
    control: VecDeque<Control>,
    rx_ready: VecDeque<ConnKey>,
    buf: Vec<u8>,
}

fn ctl(epoll: &Epoll, op: ControlOperation, fd: RawFd, events: EventSet, token: u64) -> io::Result<()> {
    epoll.ctl(op, fd, EpollEvent::new(events, token))
}

/// Connects a non-blocking stream to a Unix socket path without blocking:
/// a listener with a full backlog counts as refusing.
fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    let addr = UnixAddr::new(path).map_err(io::Error::from)?;
    let fd =
        socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)
            .map_err(io::Error::from)?;
    socket::connect(fd.as_raw_fd(), &addr).map_err(io::Error::from)?;
    Ok(UnixStream::from(fd))
}

impl Muxer {
    pub fn new(
        guest_cid: u64,
        uds_path: Option<PathBuf>,
        requests: Receiver<ConnectRequest>,
        request_evt: Arc<EventFd>,
    ) -> Result<Self, Error> {
        let epoll = Epoll::new().map_err(Error::Setup)?;
        let listener = match &uds_path {
            Some(path) => {
                let listener = bind_listener(path).map_err(|source| Error::Listen { path: path.clone(), source })?;
                ctl(&epoll, ControlOperation::Add, listener.as_raw_fd(), EventSet::IN, TOKEN_LISTENER)
                    .map_err(Error::Setup)?;
                Some(listener)
            }
            None => None,
        };
        ctl(&epoll, ControlOperation::Add, request_evt.as_raw_fd(), EventSet::IN, TOKEN_REQUESTS)
            .map_err(Error::Setup)?;
        Ok(Self {
            guest_cid,
            uds_path,
            epoll,
            listener,
            listener_paused: false,
            requests,
            request_evt,
            conns: HashMap::new(),
            sources: HashMap::new(),
            next_token: FIRST_DYNAMIC_TOKEN,
            next_host_port: FIRST_HOST_PORT,
            control: VecDeque::new(),
            rx_ready: VecDeque::new(),
            buf: Vec::new(),
        })
    }

    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Number of live connections.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Drops every connection (device reset); the listener stays.
    pub fn reset(&mut self) {
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for key in keys {
            self.remove(key);
        }
        let pending: Vec<u64> = self.sources.keys().copied().collect();
        for token in pending {
            self.drop_source(token);
        }
        self.control.clear();
        self.rx_ready.clear();
    }

    fn alloc_token(&mut self) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        token
    }

    fn queue_control(&mut self, key: ConnKey, op: u16, flags: u32) {
        // Past the bound only RSTs for connections that no longer exist
        // are dropped (the guest keeps no state for those).
        if self.control.len() >= MAX_CONTROL_PACKETS && op == OP_RST && !self.conns.contains_key(&key) {
            return;
        }
        self.control.push_back(Control { key, op, flags });
    }

    fn queue_rx(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.rx_queued {
                conn.rx_queued = true;
                self.rx_ready.push_back(key);
            }
        }
    }

    /// Brings a connection's epoll registration in line with what it needs.
    fn update_interest(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if conn.host_hup {
            if conn.interest.take().is_some() {
                let _ = ctl(&self.epoll, ControlOperation::Delete, conn.stream.as_raw_fd(), EventSet::empty(), 0);
            }
            return;
        }
        let wanted = conn.wanted_interest();
        let op = match conn.interest {
            Some(current) if current == wanted => return,
            Some(_) => ControlOperation::Modify,
            None => ControlOperation::Add,
        };
        if ctl(&self.epoll, op, conn.stream.as_raw_fd(), wanted, conn.token).is_ok() {
            conn.interest = Some(wanted);
        }
    }

    /// Removes a connection, closing its host socket.
    fn remove(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.remove(&key) {
            if conn.interest.is_some() {
                let _ = ctl(&self.epoll, ControlOperation::Delete, conn.stream.as_raw_fd(), EventSet::empty(), 0);
            }
            self.sources.remove(&conn.token);
            if let State::LocalInit { reply: Some(reply), .. } = conn.state {
                let _ = reply.send(Err(io::ErrorKind::ConnectionRefused.into()));
            }
            self.resume_listener();
        }
    }

    /// An fd was freed: poll a paused listener again.
    fn resume_listener(&mut self) {
        if let (true, Some(listener)) = (self.listener_paused, &self.listener) {
            if ctl(&self.epoll, ControlOperation::Add, listener.as_raw_fd(), EventSet::IN, TOKEN_LISTENER).is_ok() {
                self.listener_paused = false;
            }
        }
    }

    /// Sends RST for `key` and forgets the connection.
    fn reset_conn(&mut self, key: ConnKey) {
        self.remove(key);
        self.queue_control(key, OP_RST, 0);
    }

    fn drop_source(&mut self, token: u64) {
        match self.sources.get(&token) {
            Some(Source::Conn(key)) => {
                let key = *key;
                self.remove(key);
            }
            Some(Source::Pending(..)) => {
                if let Some(Source::Pending(stream, _)) = self.sources.remove(&token) {
                    let _ = ctl(&self.epoll, ControlOperation::Delete, stream.as_raw_fd(), EventSet::empty(), 0);
                }
                self.resume_listener();
            }
            None => {}
        }
    }
}

fn send(stream: &UnixStream, data: &[u8]) -> io::Result<usize> {
    // MSG_NOSIGNAL: a peer that closed gives EPIPE, not SIGPIPE.
    socket::send(stream.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
}

fn bind_listener(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

//! The connection table and the host side: the Unix listener, connections
//! to `<uds_path>_<port>`, in-process connect requests, and the epoll set
//! over all their sockets (exposed to the transport as one fd).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use virtio_queue::{Queue, QueueOwnedT, QueueT, Writer};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::connection::{Connection, State};
use super::packet::{self, Header, *};
use super::{Error, BUF_ALLOC, HOST_CID, MAX_CONNECTIONS, MAX_CONTROL_PACKETS, MAX_PENDING_ACCEPTS};
use crate::devices::virtio::GuestMemory;

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
        }
    }

    /// Sends RST for `key` and forgets the connection.
    fn reset_conn(&mut self, key: ConnKey) {
        self.remove(key);
        self.queue_control(key, OP_RST, 0);
    }

    fn drop_source(&mut self, token: u64) {
        if let Some(Source::Pending(stream, _)) = self.sources.remove(&token) {
            let _ = ctl(&self.epoll, ControlOperation::Delete, stream.as_raw_fd(), EventSet::empty(), 0);
        } else if let Some(Source::Conn(key)) = self.sources.get(&token) {
            let key = *key;
            self.remove(key);
        }
    }

    // ----- guest → host -----

    /// Handles one packet the guest sent on tx.
    pub fn handle_tx(&mut self, header: &Header, payload: &[u8]) {
        if header.src_cid != self.guest_cid || header.dst_cid != HOST_CID {
            tracing::debug!("vsock: dropping packet {} -> {}", header.src_cid, header.dst_cid);
            return;
        }
        let key = (header.dst_port, header.src_port);
        if header.kind != TYPE_STREAM {
            if header.op != OP_RST {
                self.queue_control(key, OP_RST, 0);
            }
            return;
        }
        if !self.conns.contains_key(&key) {
            match header.op {
                OP_REQUEST => self.guest_connect(key, header),
                OP_RST => {}
                _ => self.queue_control(key, OP_RST, 0),
            }
            return;
        }
        if let Some(conn) = self.conns.get_mut(&key) {
            conn.update_peer_credit(header.buf_alloc, header.fwd_cnt);
            if conn.host_hup && !conn.host_eof && conn.peer_credit() > 0 {
                // A hung-up socket is not polled: its rest is forwarded as
                // credit allows.
                self.queue_rx(key);
            }
        }
        match header.op {
            OP_RESPONSE => self.guest_accepted(key),
            OP_RW => self.guest_data(key, payload),
            OP_CREDIT_UPDATE => {}
            OP_CREDIT_REQUEST => self.queue_credit_update(key),
            OP_SHUTDOWN => self.guest_shutdown(key, header.flags),
            OP_RST => self.remove(key),
            _ => self.reset_conn(key),
        }
        self.update_interest(key);
    }

    fn queue_credit_update(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.credit_update_queued {
                conn.credit_update_queued = true;
                self.queue_control(key, OP_CREDIT_UPDATE, 0);
            }
        }
    }

    fn guest_connect(&mut self, key: ConnKey, header: &Header) {
        let Some(base) = &self.uds_path else {
            self.queue_control(key, OP_RST, 0);
            return;
        };
        if self.conns.len() >= MAX_CONNECTIONS {
            self.queue_control(key, OP_RST, 0);
            return;
        }
        let mut path = base.clone().into_os_string();
        path.push(format!("_{}", key.0));
        match connect_nonblocking(Path::new(&path)) {
            Ok(stream) => {
                let token = self.alloc_token();
                let mut conn = Connection::new(stream, token, State::Established);
                conn.update_peer_credit(header.buf_alloc, header.fwd_cnt);
                self.conns.insert(key, conn);
                self.sources.insert(token, Source::Conn(key));
                self.queue_control(key, OP_RESPONSE, 0);
                self.update_interest(key);
            }
            Err(e) => {
                tracing::debug!("vsock: guest connect to port {}: {e}", key.0);
                self.queue_control(key, OP_RST, 0);
            }
        }
    }

    fn guest_accepted(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        let State::LocalInit { reply, announce } = std::mem::replace(&mut conn.state, State::Established) else {
            // RESPONSE on an established connection is a protocol error.
            self.reset_conn(key);
            return;
        };
        if announce {
            let line = format!("OK {}\n", key.0);
            // A fresh socket's send buffer always has room for the line.
            if !matches!(send(&conn.stream, line.as_bytes()), Ok(n) if n == line.len()) {
                self.reset_conn(key);
                return;
            }
        }
        if let Some(reply) = reply {
            if reply.send(Ok(())).is_err() {
                // The caller gave up waiting; its end is gone.
                self.reset_conn(key);
            }
        }
    }

    fn guest_data(&mut self, key: ConnKey, payload: &[u8]) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if !conn.is_established() || conn.peer_shutdown & SHUTDOWN_SEND != 0 {
            self.reset_conn(key);
            return;
        }
        let mut written = 0;
        if conn.tx_buf.is_empty() {
            match send(&conn.stream, payload) {
                Ok(n) => written = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.reset_conn(key);
                    return;
                }
            }
        }
        let rest = &payload[written..];
        if conn.tx_buf.len() + rest.len() > BUF_ALLOC as usize {
            // The guest sent beyond the credit we gave it.
            self.reset_conn(key);
            return;
        }
        conn.tx_buf.extend_from_slice(rest);
        conn.fwd_cnt += written as u32;
        if conn.needs_credit_update() {
            self.queue_credit_update(key);
        }
    }

    fn guest_shutdown(&mut self, key: ConnKey, flags: u32) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        conn.peer_shutdown |= flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
        self.finish_shutdown(key);
    }

    /// Applies the guest's shutdown once its data reached the host: both
    /// directions closed ends the connection with RST (what the guest waits
    /// for), send closed half-closes the host socket.
    fn finish_shutdown(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if !conn.tx_buf.is_empty() {
            return;
        }
        if conn.peer_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND {
            self.reset_conn(key);
        } else if conn.peer_shutdown & SHUTDOWN_SEND != 0 {
            let _ = conn.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    fn flush_tx(&mut self, key: ConnKey) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        while !conn.tx_buf.is_empty() {
            match send(&conn.stream, &conn.tx_buf) {
                Ok(n) => {
                    conn.tx_buf.drain(..n);
                    conn.fwd_cnt += n as u32;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.reset_conn(key);
                    return;
                }
            }
        }
        if conn.needs_credit_update() {
            self.queue_credit_update(key);
        }
        self.finish_shutdown(key);
    }

    // ----- host events -----

    /// Handles whatever the host sockets have ready, without blocking.
    pub fn poll(&mut self) {
        let mut events = [EpollEvent::default(); 32];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("vsock: epoll_wait: {e}");
                    return;
                }
            };
            for event in &events[..n] {
                self.handle_host_event(event.data(), event.event_set());
            }
            if n < events.len() {
                return;
            }
        }
    }

    fn handle_host_event(&mut self, token: u64, events: EventSet) {
        match token {
            TOKEN_LISTENER => self.accept_all(),
            TOKEN_REQUESTS => {
                let _ = self.request_evt.read();
                while let Ok(request) = self.requests.try_recv() {
                    self.host_connect(request.port, request.stream, Some(request.reply), false);
                }
            }
            _ => match self.sources.get(&token) {
                Some(Source::Conn(key)) => {
                    let key = *key;
                    self.conn_event(key, events);
                }
                Some(Source::Pending(..)) => self.read_connect_line(token),
                None => {}
            },
        }
    }

    fn accept_all(&mut self) {
        let Some(listener) = &self.listener else { return };
        let listen_fd = listener.as_raw_fd();
        loop {
            let fd = match socket::accept4(listen_fd, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::ECONNABORTED) => continue,
                Err(_) => return,
            };
            // SAFETY: accept4 just returned this fd and nothing else owns it.
            let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
            let pending = self.sources.values().filter(|s| matches!(s, Source::Pending(..))).count();
            if pending >= MAX_PENDING_ACCEPTS {
                continue;
            }
            let token = self.alloc_token();
            if ctl(&self.epoll, ControlOperation::Add, stream.as_raw_fd(), EventSet::IN, token).is_ok() {
                self.sources.insert(token, Source::Pending(stream, Vec::new()));
            }
        }
    }

    /// A host peer of the listener is sending `CONNECT <port>\n`. The line
    /// is read a byte at a time, so data the peer sends after it (too
    /// early) stays in the socket, and a partial line is consumed (a
    /// level-triggered fd left readable would spin the loop).
    fn read_connect_line(&mut self, token: u64) {
        let Some(Source::Pending(stream, line)) = self.sources.get_mut(&token) else { return };
        let outcome = loop {
            let mut byte = [0u8; 1];
            match socket::recv(stream.as_raw_fd(), &mut byte, MsgFlags::empty()) {
                Ok(1) if byte[0] == b'\n' => break Some(std::mem::take(line)),
                Ok(1) if line.len() < MAX_CONNECT_LINE => line.push(byte[0]),
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(nix::errno::Errno::EINTR) => {}
                // End of file, an error, or an overlong line.
                _ => break None,
            }
        };
        let Some(Source::Pending(stream, _)) = self.sources.remove(&token) else { return };
        let _ = ctl(&self.epoll, ControlOperation::Delete, stream.as_raw_fd(), EventSet::empty(), 0);
        let port = outcome.as_deref().and_then(parse_connect_line);
        match port {
            Some(port) => self.host_connect(port, stream, None, true),
            None => tracing::debug!("vsock: bad CONNECT line from a host peer"),
        }
    }

    /// Starts a host-initiated connection to guest `port`.
    fn host_connect(&mut self, port: u32, stream: UnixStream, reply: Option<Sender<io::Result<()>>>, announce: bool) {
        if self.conns.len() >= MAX_CONNECTIONS {
            if let Some(reply) = reply {
                let _ = reply.send(Err(io::Error::other("too many vsock connections")));
            }
            return;
        }
        let local = self.alloc_host_port(port);
        let key = (local, port);
        let token = self.alloc_token();
        let conn = Connection::new(stream, token, State::LocalInit { reply, announce });
        self.conns.insert(key, conn);
        self.sources.insert(token, Source::Conn(key));
        self.queue_control(key, OP_REQUEST, 0);
        self.update_interest(key);
    }

    fn alloc_host_port(&mut self, peer: u32) -> u32 {
        loop {
            let port = self.next_host_port;
            self.next_host_port = self.next_host_port.checked_add(1).unwrap_or(FIRST_HOST_PORT);
            if !self.conns.contains_key(&(port, peer)) {
                return port;
            }
        }
    }

    fn conn_event(&mut self, key: ConnKey, events: EventSet) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        let hup = events.intersects(EventSet::HANG_UP | EventSet::ERROR);
        if !conn.is_established() {
            if hup {
                // The host side went away before the guest answered.
                self.reset_conn(key);
            }
            return;
        }
        if events.contains(EventSet::OUT) {
            self.flush_tx(key);
        }
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if hup {
            conn.host_hup = true;
        }
        if events.contains(EventSet::IN) || hup {
            self.queue_rx(key);
        }
        self.update_interest(key);
    }

    // ----- host → guest -----

    /// Whether anything waits for rx buffers.
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty() || !self.rx_ready.is_empty()
    }

    /// Fills the guest's rx buffers with control packets, then host data.
    /// Returns whether any buffer was used.
    pub fn fill_rx(&mut self, queue: &mut Queue, mem: &GuestMemory) -> bool {
        let mut used = false;
        while self.has_rx() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else { break };
            let head = chain.head_index();
            let mut writer = match Writer::new(mem, chain) {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!("vsock: bad rx chain: {e}");
                    used |= queue.add_used(mem, head, 0).is_ok();
                    continue;
                }
            };
            let len = match self.next_rx_packet(&mut writer) {
                RxOutcome::Written(len) => len,
                RxOutcome::BadBuffer => 0,
                RxOutcome::Nothing => {
                    queue.go_to_previous_position();
                    break;
                }
            };
            if queue.add_used(mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        used
    }

    fn header_for(&mut self, key: ConnKey, op: u16) -> Header {
        let mut header = Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: key.0,
            dst_port: key.1,
            kind: TYPE_STREAM,
            op,
            ..Header::default()
        };
        if let Some(conn) = self.conns.get_mut(&key) {
            header.buf_alloc = BUF_ALLOC;
            header.fwd_cnt = conn.fwd_cnt.0;
            conn.last_fwd_cnt_sent = conn.fwd_cnt;
            if op == OP_CREDIT_UPDATE {
                conn.credit_update_queued = false;
            }
        }
        header
    }

    fn next_rx_packet(&mut self, writer: &mut Writer<'_>) -> RxOutcome {
        let Ok(capacity) = packet::rx_capacity(writer) else { return RxOutcome::BadBuffer };
        if let Some(control) = self.control.pop_front() {
            let mut header = self.header_for(control.key, control.op);
            header.flags = control.flags;
            return match packet::write_rx(writer, &header, &[]) {
                Ok(len) => RxOutcome::Written(len),
                Err(_) => RxOutcome::BadBuffer,
            };
        }
        // Each queued connection gets one try per buffer; one that requeues
        // itself is not retried within the same call.
        for _ in 0..self.rx_ready.len() {
            let Some(key) = self.rx_ready.pop_front() else { break };
            if let Some(outcome) = self.conn_rx(key, writer, capacity) {
                return outcome;
            }
        }
        RxOutcome::Nothing
    }

    /// Forwards what the host socket of `key` has: data up to the guest's
    /// credit, or its EOF. None if it had nothing (back to polling).
    fn conn_rx(&mut self, key: ConnKey, writer: &mut Writer<'_>, capacity: usize) -> Option<RxOutcome> {
        let conn = self.conns.get_mut(&key)?;
        conn.rx_queued = false;
        if !conn.is_established() || conn.host_eof {
            self.update_interest(key);
            return None;
        }
        let credit = conn.peer_credit() as usize;
        if credit == 0 && !conn.host_hup {
            // Polling resumes when the guest reports consumed data.
            self.update_interest(key);
            return None;
        }
        let want = capacity.min(credit).min(packet::MAX_PAYLOAD as usize);
        self.buf.resize(want.max(1), 0);
        let read = if want == 0 {
            Err(nix::errno::Errno::EAGAIN)
        } else {
            socket::recv(conn.stream.as_raw_fd(), &mut self.buf[..want], MsgFlags::empty())
        };
        let (op, len, flags) = match read {
            Ok(0) => {
                // End of file: the host sends no more (and, hung up, takes no more).
                conn.host_eof = true;
                let flags = if conn.host_hup { SHUTDOWN_SEND | SHUTDOWN_RCV } else { SHUTDOWN_SEND };
                (OP_SHUTDOWN, 0, flags)
            }
            Ok(n) => (OP_RW, n, 0),
            Err(nix::errno::Errno::EAGAIN) => {
                self.update_interest(key);
                return None;
            }
            Err(nix::errno::Errno::EINTR) => {
                conn.rx_queued = true;
                self.rx_ready.push_back(key);
                return None;
            }
            Err(_) => {
                self.reset_conn(key);
                return None;
            }
        };
        if op == OP_RW {
            conn.rx_cnt += len as u32;
            // There may be more: stay queued.
            conn.rx_queued = true;
            self.rx_ready.push_back(key);
        }
        let mut header = self.header_for(key, op);
        header.len = len as u32;
        header.flags = flags;
        let outcome = match packet::write_rx(writer, &header, &self.buf[..len]) {
            Ok(n) => RxOutcome::Written(n),
            Err(_) => RxOutcome::BadBuffer,
        };
        self.update_interest(key);
        Some(outcome)
    }
}

enum RxOutcome {
    Written(u32),
    BadBuffer,
    Nothing,
}

/// The port of a `CONNECT <port>` line (without its newline).
fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    line.trim_end_matches('\r').strip_prefix("CONNECT ")?.trim().parse().ok()
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

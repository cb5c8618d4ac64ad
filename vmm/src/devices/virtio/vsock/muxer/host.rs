//! Host-side events: the listener and its `CONNECT` lines, in-process
//! connect requests, and readiness of connections' host sockets.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Sender;

use nix::sys::socket::{self, MsgFlags, SockFlag};
use vmm_sys_util::epoll::{ControlOperation, EpollEvent, EventSet};

use super::{ctl, ConnKey, Muxer, Source, FIRST_HOST_PORT, MAX_CONNECT_LINE, TOKEN_LISTENER, TOKEN_REQUESTS};
use crate::devices::virtio::vsock::connection::{Connection, State};
use crate::devices::virtio::vsock::packet::OP_REQUEST;
use crate::devices::virtio::vsock::{MAX_CONNECTIONS, MAX_PENDING_ACCEPTS};

impl Muxer {
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
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(e) => {
                    // Out of fds (EMFILE, ENFILE, ENOBUFS): the pending
                    // connection stays in the backlog and the listener
                    // stays readable, so stop polling it until a
                    // connection closes rather than spin.
                    tracing::warn!("vsock: accept: {e}; pausing the listener");
                    let _ = ctl(&self.epoll, ControlOperation::Delete, listen_fd, EventSet::empty(), 0);
                    self.listener_paused = true;
                    return;
                }
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
        match outcome.as_deref().and_then(parse_connect_line) {
            Some(port) => self.host_connect(port, stream, None, true),
            None => {
                tracing::debug!("vsock: bad CONNECT line from a host peer");
                drop(stream);
                self.resume_listener();
            }
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
}

/// The port of a `CONNECT <port>` line (without its newline).
fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    line.trim_end_matches('\r').strip_prefix("CONNECT ")?.trim().parse().ok()
}

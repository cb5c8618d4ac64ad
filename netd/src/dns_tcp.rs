//! DNS over TCP (port 53 of any address): netd terminates the connection
//! itself with a smoltcp socket (no host connect) and answers each
//! length-prefixed question like a UDP one (dns_proxy.rs), relaying allowed
//! ones upstream over UDP. What resolvers fall back to when an answer is
//! truncated, and what `dig +tcp` uses.
use std::collections::HashMap;

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, State as TcpState};
use smoltcp::wire::IpListenEndpoint;

use crate::tcp::Key;

/// DNS-over-TCP connections a sandbox may hold at once (they count as flows too).
pub const MAX_CONNS: usize = 16;
/// Per direction: the largest DNS message and its length prefix.
const BUFFER: usize = 65535 + 2;

pub struct Conn {
    pub key: Key,
    pub handle: SocketHandle,
    inbuf: Vec<u8>,
}

#[derive(Default)]
pub struct Conns {
    conns: HashMap<u64, Conn>,
    by_key: HashMap<Key, u64>,
    next: u64,
}

impl Conns {
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.by_key.contains_key(key)
    }

    /// A connection for `key`: a smoltcp socket listening on exactly its
    /// remote endpoint, for the SYN the caller feeds it next.
    pub fn open(&mut self, key: Key, sockets: &mut SocketSet<'static>) -> u64 {
        let mut s = tcp::Socket::new(tcp::SocketBuffer::new(vec![0; BUFFER]), tcp::SocketBuffer::new(vec![0; BUFFER]));
        // A fresh socket always accepts a listen on a non-zero port (53).
        let _ = s.listen(IpListenEndpoint { addr: Some((*key.remote.ip()).into()), port: key.remote.port() });
        s.set_timeout(Some(smoltcp::time::Duration::from_secs(30)));
        let handle = sockets.add(s);
        let id = self.next;
        self.next += 1;
        self.conns.insert(id, Conn { key, handle, inbuf: Vec::new() });
        self.by_key.insert(key, id);
        id
    }

    /// Reads the questions that arrived (each handed to `question`) and
    /// drops finished connections (each id handed to `closed`).
    pub fn service(
        &mut self,
        sockets: &mut SocketSet<'static>,
        mut question: impl FnMut(u64, &[u8]),
        mut closed: impl FnMut(u64),
    ) {
        let mut done = Vec::new();
        for (&id, c) in self.conns.iter_mut() {
            let sock = sockets.get_mut::<tcp::Socket>(c.handle);
            match sock.state() {
                TcpState::Closed | TcpState::TimeWait => {
                    done.push(id);
                    continue;
                }
                // The client is done asking: netd closes its side too.
                TcpState::CloseWait => sock.close(),
                _ => {}
            }
            while sock.can_recv() {
                let room = BUFFER - c.inbuf.len();
                let inbuf = &mut c.inbuf;
                let _ = sock.recv(|b| {
                    let n = b.len().min(room);
                    inbuf.extend_from_slice(&b[..n]);
                    (n, ())
                });
                if c.inbuf.len() >= BUFFER {
                    break;
                }
            }
            let mut at = 0;
            while c.inbuf.len() >= at + 2 {
                let len = u16::from_be_bytes([c.inbuf[at], c.inbuf[at + 1]]) as usize;
                if c.inbuf.len() < at + 2 + len {
                    break;
                }
                question(id, &c.inbuf[at + 2..at + 2 + len]);
                at += 2 + len;
            }
            c.inbuf.drain(..at);
        }
        for id in done {
            if let Some(c) = self.conns.remove(&id) {
                self.by_key.remove(&c.key);
                sockets.remove(c.handle);
                closed(id);
            }
        }
    }

    /// Writes an answer (length-prefixed) to connection `id`; a client that
    /// does not read its answers is reset.
    pub fn answer(&mut self, id: u64, msg: &[u8], sockets: &mut SocketSet<'static>) {
        let Some(c) = self.conns.get(&id) else { return };
        let sock = sockets.get_mut::<tcp::Socket>(c.handle);
        if !sock.may_send() || sock.send_capacity() - sock.send_queue() < msg.len() + 2 {
            sock.abort();
            return;
        }
        let _ = sock.send_slice(&(msg.len() as u16).to_be_bytes());
        let _ = sock.send_slice(msg);
    }
}

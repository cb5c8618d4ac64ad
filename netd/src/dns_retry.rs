//! A question asked again over TCP upstream: when the upstream's UDP answer
//! to a question that came over DNS-over-TCP ([`crate::dns_tcp`]) has TC set
//! (it did not fit a datagram), netd asks the same upstream the same question
//! over TCP (RFC 7766) and relays that full answer instead. A question that
//! came over UDP gets the truncated answer as it is: the sandbox's resolver
//! then asks again over TCP itself, and so lands here.
//!
//! Each retry is one non-blocking host connection, one length-prefixed
//! question out, one length-prefixed answer in; at most [`MAX_RETRIES`] at
//! once (more get SERVFAIL), each within its own upstream timeout.
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use pvisor_net::dns;

use crate::dns_proxy::{Pending, UPSTREAM_TIMEOUT};

/// Upstream TCP retries in flight at once (DNS-over-TCP connections are
/// capped at 16, and a client waits for its answers).
pub const MAX_RETRIES: usize = 16;
/// The largest DNS message over TCP, and its length prefix.
const MAX_MESSAGE: usize = 65535 + 2;

struct Retry {
    sock: TcpStream,
    /// The length-prefixed question (under netd's id), and how much of it went.
    out: Vec<u8>,
    sent: usize,
    inbuf: Vec<u8>,
    netd_id: u16,
    pending: Pending,
}

/// What a retry's event came to.
pub enum Outcome {
    /// Not done yet.
    Waiting,
    /// The upstream's answer (its id is still netd's), for the question.
    Answer(Pending, Vec<u8>),
    /// No answer (refused, reset, closed early, malformed): SERVFAIL.
    Failed(Pending),
}

#[derive(Default)]
pub struct Retries {
    slots: Vec<Option<Retry>>,
}

impl Retries {
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks `upstream` the question of `pending` again over TCP, under
    /// `netd_id`; its events come as `Token(base + slot)`. Gives the question
    /// back when it cannot (too many retries, the connect failed at once).
    pub fn start(
        &mut self,
        registry: &Registry,
        base: usize,
        upstream: SocketAddr,
        netd_id: u16,
        mut pending: Pending,
        now: Instant,
    ) -> Result<(), Pending> {
        let query = &pending.query;
        if self.len() >= MAX_RETRIES || query.len() > u16::MAX as usize {
            return Err(pending);
        }
        let Ok(mut sock) = TcpStream::connect(upstream) else { return Err(pending) };
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        if registry.register(&mut sock, Token(base + slot), Interest::READABLE | Interest::WRITABLE).is_err() {
            return Err(pending);
        }
        let mut out = Vec::with_capacity(2 + query.len());
        out.extend_from_slice(&(query.len() as u16).to_be_bytes());
        out.extend_from_slice(query);
        dns::set_id(&mut out[2..], netd_id);
        pending.deadline = now + UPSTREAM_TIMEOUT;
        self.slots[slot] = Some(Retry { sock, out, sent: 0, inbuf: Vec::new(), netd_id, pending });
        Ok(())
    }

    /// Moves retry `slot` on after an event: writes what is left of the
    /// question, reads what arrived of the answer.
    pub fn ready(&mut self, slot: usize, registry: &Registry) -> Outcome {
        let Some(r) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return Outcome::Waiting };
        match r.progress() {
            Ok(None) => Outcome::Waiting,
            Ok(Some(answer)) => {
                let r = self.remove(slot, registry);
                r.map_or(Outcome::Waiting, |r| Outcome::Answer(r.pending, answer))
            }
            Err(_) => self.remove(slot, registry).map_or(Outcome::Waiting, |r| Outcome::Failed(r.pending)),
        }
    }

    /// The questions whose retry ran out of time (each handed to `failed`).
    pub fn expire(&mut self, now: Instant, registry: &Registry, mut failed: impl FnMut(Pending)) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|r| r.pending.deadline <= now) {
                if let Some(r) = self.remove(slot, registry) {
                    failed(r.pending);
                }
            }
        }
    }

    /// Drops the retries whose question matches `gone` (its client left).
    pub fn forget(&mut self, registry: &Registry, gone: impl Fn(&Pending) -> bool) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|r| gone(&r.pending)) {
                self.remove(slot, registry);
            }
        }
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|r| r.pending.deadline).min()
    }

    fn remove(&mut self, slot: usize, registry: &Registry) -> Option<Retry> {
        let mut r = self.slots.get_mut(slot)?.take()?;
        let _ = registry.deregister(&mut r.sock);
        Some(r)
    }
}

impl Retry {
    /// Ok(Some(answer)) once the whole answer is in; Err on anything that
    /// ends the connection without one.
    fn progress(&mut self) -> io::Result<Option<Vec<u8>>> {
        if let Some(e) = self.sock.take_error()? {
            return Err(e);
        }
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                // Not connected yet, or the buffer is full: the next event.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::NotConnected => {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&buf[..n]);
                    if self.inbuf.len() > MAX_MESSAGE {
                        return Err(io::ErrorKind::InvalidData.into());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if self.inbuf.len() >= 2 {
                let len = u16::from_be_bytes([self.inbuf[0], self.inbuf[1]]) as usize;
                if self.inbuf.len() >= 2 + len {
                    let answer = self.inbuf[2..2 + len].to_vec();
                    let ok = dns::parse_answer(&answer).is_ok_and(|a| a.id == self.netd_id);
                    return if ok { Ok(Some(answer)) } else { Err(io::ErrorKind::InvalidData.into()) };
                }
            }
        }
    }
}

//! netd's resolver: it answers every DNS question its sandbox sends to port
//! 53 of any address. Denied names get NXDOMAIN, AAAA and HTTPS/SVCB questions
//! an empty answer (netd is IPv4 only, and HTTPS records could carry address
//! hints past the policy), allowed ones are forwarded upstream under an id of
//! netd's own; the A records of the answer bind their addresses to the name
//! asked (what domain rules are matched against), and the answer is relayed.
//! A truncated answer (TC) to a question that came over TCP is asked again
//! upstream over TCP ([`crate::dns_retry`]).
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use mio::Registry;
use pvisor_net::dns;
use smoltcp::wire::EthernetAddress;

use crate::dns_retry::{Outcome, Retries};
use crate::judge::Judge;
use crate::limits::MAX_PENDING_DNS;
use crate::names::Names;

/// A question not answered upstream in this time gets SERVFAIL.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the answer to a question goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A UDP datagram from `server` (the address the sandbox asked) to `client`.
    Udp { mac: EthernetAddress, server: SocketAddrV4, client: SocketAddrV4 },
    /// The DNS-over-TCP connection `conn` (dns_tcp.rs).
    Tcp { conn: u64 },
}

/// A question netd asked upstream and awaits the answer of.
pub struct Pending {
    pub route: Route,
    /// The sandbox's id of the question.
    pub id: u16,
    pub name: String,
    /// The sandbox's query as it came (for a SERVFAIL, and a TCP retry).
    pub query: Vec<u8>,
    pub deadline: Instant,
}

/// The SERVFAIL answer to `p`, in `out`; false if its query does not parse.
fn servfail(p: &Pending, out: &mut Vec<u8>) -> bool {
    let Ok(q) = dns::parse_query(&p.query) else { return false };
    dns::reply(&p.query, &q, dns::RCODE_SERVFAIL, out);
    true
}

/// A DNS message for the sandbox, and where it goes.
pub struct ToGuest<'a> {
    pub route: Route,
    pub msg: &'a [u8],
}

pub struct Dns {
    sock: UdpSocket,
    upstream: Vec<SocketAddr>,
    pending: HashMap<u16, Pending>,
    retries: Retries,
    rng: u64,
    buf: Vec<u8>,
    out: Vec<u8>,
    pub queries: u64,
}

impl Dns {
    pub fn new(sock: UdpSocket, upstream: Vec<SocketAddr>, seed: u64) -> Dns {
        Dns {
            sock,
            upstream,
            pending: HashMap::new(),
            retries: Retries::default(),
            rng: seed | 1,
            buf: vec![0; 4096],
            out: Vec::new(),
            queries: 0,
        }
    }

    pub fn socket(&mut self) -> &mut UdpSocket {
        &mut self.sock
    }

    /// An id for upstream no pending question has (xorshift, seeded randomly:
    /// off-path spoofing needs the id).
    fn fresh_id(&mut self) -> u16 {
        loop {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let id = (self.rng >> 24) as u16;
            if !self.pending.contains_key(&id) {
                return id;
            }
        }
    }

    /// A question from the sandbox. Returns the reply to send at once, if
    /// netd answers it itself.
    pub fn query(&mut self, msg: &[u8], route: Route, judge: &dyn Judge, now: Instant) -> Option<&[u8]> {
        self.queries += 1;
        let q = dns::parse_query(msg).ok()?;
        let rcode = if matches!(q.qtype, dns::TYPE_AAAA | dns::TYPE_HTTPS | dns::TYPE_SVCB) {
            Some(dns::RCODE_NOERROR)
        } else if !judge.decide_name(&q.name) {
            Some(dns::RCODE_NXDOMAIN)
        } else if self.pending.len() >= MAX_PENDING_DNS || self.upstream.is_empty() {
            Some(dns::RCODE_SERVFAIL)
        } else {
            None
        };
        if let Some(rcode) = rcode {
            dns::reply(msg, &q, rcode, &mut self.out);
            return Some(&self.out);
        }
        let id = self.fresh_id();
        self.buf.clear();
        self.buf.extend_from_slice(msg);
        dns::set_id(&mut self.buf, id);
        // Spread questions over the upstreams by id; a lost one times out.
        let upstream = self.upstream[id as usize % self.upstream.len()];
        if self.sock.send_to(&self.buf, upstream).is_err() {
            dns::reply(msg, &q, dns::RCODE_SERVFAIL, &mut self.out);
            return Some(&self.out);
        }
        self.pending.insert(
            id,
            Pending { route, id: q.id, name: q.name, query: msg.to_vec(), deadline: now + UPSTREAM_TIMEOUT },
        );
        None
    }

    /// Reads upstream answers: binds their A records and hands each relayed
    /// answer to `send`. A truncated one to a question that came over TCP
    /// starts a TCP retry instead, its events as `Token(retry_base + slot)`.
    pub fn answers(
        &mut self,
        names: &mut Names,
        now: Instant,
        registry: &Registry,
        retry_base: usize,
        mut send: impl FnMut(ToGuest<'_>),
    ) -> io::Result<()> {
        self.buf.resize(4096, 0);
        loop {
            let (n, from) = match self.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors from an upstream surface here; the question times out.
                Err(_) => continue,
            };
            if !self.upstream.contains(&from) {
                continue;
            }
            let msg = &mut self.buf[..n];
            let truncated = dns::is_truncated(msg);
            let parsed = dns::parse_answer(msg);
            let id = match (&parsed, truncated) {
                (Ok(a), _) => a.id,
                // Cut short mid-record: only the header is needed to retry.
                (Err(_), true) => u16::from_be_bytes([msg[0], msg[1]]),
                (Err(_), false) => continue,
            };
            let Some(p) = self.pending.remove(&id) else { continue };
            if truncated && matches!(p.route, Route::Tcp { .. }) {
                if let Err(p) = self.retries.start(registry, retry_base, from, id, p, now) {
                    if servfail(&p, &mut self.out) {
                        send(ToGuest { route: p.route, msg: &self.out });
                    }
                }
                continue;
            }
            for a in parsed.iter().flat_map(|a| &a.a_records) {
                names.bind(a.addr, &p.name, dns::binding_ttl(a.ttl), now);
            }
            dns::set_id(msg, p.id);
            send(ToGuest { route: p.route, msg });
        }
    }

    /// An event of TCP retry `slot`: relays its answer (binding its A
    /// records) or a SERVFAIL once it is done.
    pub fn retry_ready(
        &mut self,
        slot: usize,
        registry: &Registry,
        names: &mut Names,
        now: Instant,
        mut send: impl FnMut(ToGuest<'_>),
    ) {
        match self.retries.ready(slot, registry) {
            Outcome::Waiting => {}
            Outcome::Answer(p, mut msg) => {
                for a in dns::parse_answer(&msg).iter().flat_map(|a| &a.a_records) {
                    names.bind(a.addr, &p.name, dns::binding_ttl(a.ttl), now);
                }
                dns::set_id(&mut msg, p.id);
                send(ToGuest { route: p.route, msg: &msg });
            }
            Outcome::Failed(p) => {
                if servfail(&p, &mut self.out) {
                    send(ToGuest { route: p.route, msg: &self.out });
                }
            }
        }
    }

    /// SERVFAIL for questions upstream did not answer in time (over UDP or
    /// in a TCP retry).
    pub fn expire(&mut self, now: Instant, registry: &Registry, mut send: impl FnMut(ToGuest<'_>)) {
        let late: Vec<u16> = self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(id, _)| *id).collect();
        let mut failed: Vec<Pending> = late.into_iter().filter_map(|id| self.pending.remove(&id)).collect();
        self.retries.expire(now, registry, |p| failed.push(p));
        for p in failed {
            if servfail(&p, &mut self.out) {
                send(ToGuest { route: p.route, msg: &self.out });
            }
        }
    }

    /// Forgets the questions of a closed DNS-over-TCP connection.
    pub fn forget(&mut self, conn: u64, registry: &Registry) {
        self.pending.retain(|_, p| p.route != Route::Tcp { conn });
        self.retries.forget(registry, |p| p.route == Route::Tcp { conn });
    }

    /// The earliest deadline of a pending question.
    pub fn next_deadline(&self) -> Option<Instant> {
        let retries = self.retries.next_deadline();
        self.pending.values().map(|p| p.deadline).chain(retries).min()
    }
}

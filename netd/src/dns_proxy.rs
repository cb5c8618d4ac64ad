//! netd's resolver: it answers every DNS question its sandbox sends to port
//! 53 of any address. Denied names get NXDOMAIN, AAAA and HTTPS/SVCB questions
//! an empty answer (netd is IPv4 only, and HTTPS records could carry address
//! hints past the policy), allowed ones are forwarded upstream under an id of
//! netd's own; the A records of the answer bind their addresses to the name
//! asked (what domain rules are matched against), and the answer is relayed.
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use pvisor_net::dns;
use smoltcp::wire::EthernetAddress;

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

struct Pending {
    route: Route,
    id: u16,
    name: String,
    /// Header and question of the query (for a SERVFAIL).
    query: Vec<u8>,
    deadline: Instant,
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
    rng: u64,
    buf: Vec<u8>,
    out: Vec<u8>,
    pub queries: u64,
}

impl Dns {
    pub fn new(sock: UdpSocket, upstream: Vec<SocketAddr>, seed: u64) -> Dns {
        Dns { sock, upstream, pending: HashMap::new(), rng: seed | 1, buf: vec![0; 4096], out: Vec::new(), queries: 0 }
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
        let query = msg[..q.end].to_vec();
        self.pending.insert(id, Pending { route, id: q.id, name: q.name, query, deadline: now + UPSTREAM_TIMEOUT });
        None
    }

    /// Reads upstream answers: binds their A records and hands each relayed
    /// answer to `send`.
    pub fn answers(&mut self, names: &mut Names, now: Instant, mut send: impl FnMut(ToGuest<'_>)) -> io::Result<()> {
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
            let Ok(answer) = dns::parse_answer(msg) else { continue };
            let Some(p) = self.pending.remove(&answer.id) else { continue };
            for a in &answer.a_records {
                names.bind(a.addr, &p.name, dns::binding_ttl(a.ttl), now);
            }
            dns::set_id(msg, p.id);
            send(ToGuest { route: p.route, msg });
        }
    }

    /// SERVFAIL for questions upstream did not answer in time.
    pub fn expire(&mut self, now: Instant, mut send: impl FnMut(ToGuest<'_>)) {
        let late: Vec<u16> = self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(id, _)| *id).collect();
        for id in late {
            let Some(p) = self.pending.remove(&id) else { continue };
            let Ok(q) = dns::parse_query(&p.query) else { continue };
            dns::reply(&p.query, &q, dns::RCODE_SERVFAIL, &mut self.out);
            send(ToGuest { route: p.route, msg: &self.out });
        }
    }

    /// Forgets the questions of a closed DNS-over-TCP connection.
    pub fn forget(&mut self, conn: u64) {
        self.pending.retain(|_, p| p.route != Route::Tcp { conn });
    }

    /// The earliest deadline of a pending question.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }
}

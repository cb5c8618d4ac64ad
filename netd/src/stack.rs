//! The per-sandbox stack: the event loop's state and what it does with each
//! frame from the link and each host socket event.
//!
//! netd plays the gateway `10.0.2.2` and resolver `10.0.2.3` (plan.rs) and,
//! with smoltcp's any_ip and a default route via itself, every other address:
//! a TCP SYN to any destination is judged here and, when allowed, held until
//! the host connect succeeds, then fed to a smoltcp socket listening on
//! exactly that destination, so the sandbox sees the SYN-ACK only when the
//! far end is there. DNS, UDP and refusals are answered by hand.
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{OwnedFd, RawFd};
use std::time::{Duration, Instant};

use mio::net::{TcpStream, UdpSocket};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use pvisor_net::plan;
use pvisor_proto::net::{NetConfig, NetStats};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr};

use crate::device::Device;
use crate::dns_proxy::{Dns, Route, ToGuest};
use crate::error::Error;
use crate::frames::{self, Ingress};
use crate::hostaddr::HostAddrs;
use crate::judge::Judge;
use crate::limits::{Limits, SMALL_TCP_BUFFER_BYTES, TCP_MEMORY_BUDGET};
use crate::link::{Link, MAX_FRAME};
use crate::names::Names;
use crate::ping::Ping;
use crate::{dns_tcp, tcp, udp};

const LINK: Token = Token(0);
/// The control socket's token ([`Stack::watch`]).
pub const CONTROL: Token = Token(1);
const DNS: Token = Token(2);
const PING: Token = Token(3);
const TCP_BASE: usize = 1 << 24;
const UDP_BASE: usize = 2 << 24;
/// DNS questions asked again over TCP upstream (dns_retry.rs).
const RETRY_BASE: usize = 3 << 24;
/// Frames read from the link per turn before host sockets get their turn.
const LINK_BATCH: usize = 256;
/// Largest frame netd sends: the tap's MTU plus the Ethernet header.
const MTU_FRAME: usize = plan::TAP_MTU as usize + frames::ETH_LEN;
/// How often idle UDP flows are looked for.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// Kernel socket buffers asked for on host TCP sockets (throughput).
const HOST_SOCKET_BUFFER: libc::c_int = 1 << 20;

/// What one turn of the loop saw that its caller acts on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The watched control socket is readable.
    pub control: bool,
    /// The sandbox's side of the link is gone.
    pub link_closed: bool,
}

pub struct Stack {
    poll: Poll,
    events: Events,
    epoch: Instant,
    dev: Device,
    iface: Interface,
    sockets: SocketSet<'static>,
    tcp: tcp::Flows,
    udp: udp::Flows,
    dns: Dns,
    dns_tcp: dns_tcp::Conns,
    /// The ping socket: not tried yet, there, or refused by the host.
    ping: PingState,
    /// The sandbox's MAC, as last seen (for echo replies).
    guest_mac: EthernetAddress,
    judge: Box<dyn Judge>,
    names: Names,
    hosts: HostAddrs,
    limits: Limits,
    udp_rate: udp::RateLimit,
    /// Frames netd builds itself.
    out: Vec<u8>,
    /// Datagrams from host sockets.
    rbuf: Vec<u8>,
    /// The link may have more frames (a batch stopped early).
    link_pending: bool,
    housekeeping_at: Instant,
    rx_bytes: u64,
    flows_denied: u64,
    /// Buffer bytes held by open TCP flows (see limits::TCP_MEMORY_BUDGET).
    tcp_memory: usize,
}

enum PingState {
    Untried,
    Open(Ping),
    Unavailable,
}

/// A seed for smoltcp's ISNs and the DNS ids.
fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        // Not secret material; time is an acceptable fallback.
        return std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    }
    u64::from_ne_bytes(b)
}

fn set_buffers(fd: RawFd) {
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: the value is a c_int that outlives the call, its size is passed.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&HOST_SOCKET_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Whether `ip` is in the sandbox's own subnet (10.0.2.0/24).
fn in_plan_subnet(ip: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - plan::PREFIX_LEN);
    u32::from(ip) & mask == u32::from(plan::GATEWAY_IP) & mask
}

impl Stack {
    /// A stack on `link` with `config`'s upstream resolvers (else
    /// `fallback_dns`, the host's) and limits, judging by `judge`.
    pub fn new(
        link: OwnedFd,
        config: &NetConfig,
        judge: Box<dyn Judge>,
        fallback_dns: &[SocketAddr],
    ) -> Result<Stack, Error> {
        let mut upstream = Vec::new();
        for s in &config.upstream_dns {
            let addr = s
                .parse::<SocketAddr>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| Error::Config(format!("upstream DNS {s:?} is not ip[:port]")))?;
            upstream.push(addr);
        }
        if upstream.is_empty() {
            upstream = fallback_dns.to_vec();
        }
        upstream.retain(SocketAddr::is_ipv4);
        let limits = Limits::from_proto(config.limits.as_ref());
        let link = Link::new(link).map_err(Error::Link)?;
        let poll = Poll::new().map_err(Error::Poll)?;
        let link_fd = link.raw_fd();
        poll.registry()
            .register(&mut SourceFd(&link_fd), LINK, Interest::READABLE | Interest::WRITABLE)
            .map_err(Error::Poll)?;
        let mut dns_sock =
            UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))).map_err(|e| Error::Config(e.to_string()))?;
        poll.registry().register(&mut dns_sock, DNS, Interest::READABLE).map_err(Error::Poll)?;

        let seed = random_seed();
        let mut dev = Device::new(link, MTU_FRAME);
        let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(plan::GATEWAY_MAC)));
        cfg.random_seed = seed;
        let epoch = Instant::now();
        let mut iface = Interface::new(cfg, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(plan::GATEWAY_IP.into(), plan::PREFIX_LEN));
            let _ = a.push(IpCidr::new(plan::DNS_IP.into(), plan::PREFIX_LEN));
        });
        iface
            .routes_mut()
            .add_default_ipv4_route(plan::GATEWAY_IP)
            .map_err(|_| Error::Config("no room for the default route".into()))?;
        iface.set_any_ip(true);
        Ok(Stack {
            poll,
            events: Events::with_capacity(256),
            epoch,
            dev,
            iface,
            sockets: SocketSet::new(Vec::new()),
            tcp: tcp::Flows::default(),
            udp: udp::Flows::default(),
            dns: Dns::new(dns_sock, upstream, seed.rotate_left(32)),
            dns_tcp: dns_tcp::Conns::default(),
            ping: PingState::Untried,
            guest_mac: EthernetAddress(plan::GUEST_MAC),
            judge,
            names: Names::default(),
            hosts: HostAddrs::default(),
            limits,
            udp_rate: udp::RateLimit::new(limits.udp_packets_per_sec, epoch),
            out: Vec::with_capacity(2048),
            rbuf: vec![0; MAX_FRAME],
            link_pending: false,
            housekeeping_at: epoch,
            rx_bytes: 0,
            flows_denied: 0,
            tcp_memory: 0,
        })
    }

    /// Replaces the judge for new flows and questions (established flows stay).
    pub fn set_judge(&mut self, judge: Box<dyn Judge>) {
        self.judge = judge;
    }

    /// Adds `fd` (the control socket) to the loop; [`Turn::control`] reports it.
    pub fn watch(&self, fd: RawFd) -> Result<(), Error> {
        self.poll.registry().register(&mut SourceFd(&fd), CONTROL, Interest::READABLE).map_err(Error::Poll)
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stats(&self) -> NetStats {
        NetStats {
            tx_bytes: self.dev.tx_bytes,
            rx_bytes: self.rx_bytes,
            flows: self.flows() as u32,
            flows_denied: self.flows_denied,
            dns_queries: self.dns.queries,
        }
    }

    /// What the stack holds right now, for a test's or an operator's
    /// diagnosis of a stalled transfer: the link's backpressure state and
    /// each TCP flow's (its smoltcp socket and host stream).
    pub fn describe(&self) -> String {
        let mut out = format!(
            "link: full {} stashed {} rx queued {} pending {}; tcp memory {}; dropped {}\n",
            self.dev.is_full(),
            self.dev.is_stashed(),
            self.dev.rx_queued(),
            self.link_pending,
            self.tcp_memory,
            self.dev.tx_dropped,
        );
        for slot in self.tcp.slots() {
            if let Some(flow) = self.tcp.get(slot) {
                out.push_str(&flow.describe(&self.sockets));
                out.push('\n');
            }
        }
        out
    }

    fn smol_now(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(now.duration_since(self.epoch).as_micros() as i64)
    }

    fn timeout(&mut self, now: Instant) -> Duration {
        if self.link_pending {
            return Duration::ZERO;
        }
        let smol = self.smol_now(now);
        let mut t = self.iface.poll_delay(smol, &self.sockets).map_or(HOUSEKEEPING, Duration::from);
        if let Some(d) = self.dns.next_deadline() {
            t = t.min(d.saturating_duration_since(now));
        }
        t.min(HOUSEKEEPING)
    }

    /// One turn of the loop: waits for events (at most until smoltcp's next
    /// timer), moves frames and data, returns what the caller must handle.
    pub fn turn(&mut self) -> Result<Turn, Error> {
        match self.turn_inner() {
            // The sandbox's end of a SOCK_SEQPACKET link went away mid-write.
            // (EBADFD: a tap whose device went with the sandbox's namespace.)
            Err(Error::Link(e))
                if matches!(e.raw_os_error(), Some(libc::ECONNRESET) | Some(libc::EPIPE) | Some(libc::EBADFD)) =>
            {
                Ok(Turn { control: false, link_closed: true })
            }
            r => r,
        }
    }

    fn turn_inner(&mut self) -> Result<Turn, Error> {
        let timeout = self.timeout(Instant::now());
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Poll(e)),
        }
        let mut turn = Turn::default();
        let (mut link, mut dns, mut ping, mut link_room) = (self.link_pending, false, false, false);
        let mut connecting = Vec::new();
        let mut udp_ready = Vec::new();
        let mut retry_ready = Vec::new();
        for ev in self.events.iter() {
            match ev.token() {
                LINK => {
                    link |= ev.is_readable() || ev.is_read_closed() || ev.is_error();
                    link_room |= ev.is_writable();
                }
                CONTROL => turn.control = true,
                DNS => dns = true,
                PING => ping = true,
                Token(t) if (TCP_BASE..UDP_BASE).contains(&t) => {
                    if let Some(f) = self.tcp.get_mut(t - TCP_BASE) {
                        f.readable |= ev.is_readable() || ev.is_read_closed() || ev.is_error();
                        f.writable |= ev.is_writable() || ev.is_write_closed() || ev.is_error();
                        if matches!(f.state, tcp::State::Connecting { .. }) {
                            connecting.push(t - TCP_BASE);
                        }
                    }
                }
                Token(t) if (UDP_BASE..RETRY_BASE).contains(&t) => udp_ready.push(t - UDP_BASE),
                Token(t) if t >= RETRY_BASE => retry_ready.push(t - RETRY_BASE),
                Token(_) => {}
            }
        }
        let now = Instant::now();
        if link_room {
            self.dev.writable().map_err(Error::Link)?;
        }
        if link {
            turn.link_closed = self.read_link(now)?;
        }
        for slot in connecting {
            self.connect_done(slot)?;
        }
        if dns {
            self.dns_answers(now)?;
        }
        for slot in retry_ready {
            self.dns_retry(slot, now)?;
        }
        for slot in udp_ready {
            self.udp_replies(slot, now)?;
        }
        if ping {
            self.ping_replies(now)?;
        }
        self.poll_smoltcp(now)?;
        self.service_tcp();
        self.service_dns_tcp(now);
        // What servicing queued (data, FINs, RSTs) goes out now.
        self.poll_smoltcp(now)?;
        if now >= self.housekeeping_at {
            self.housekeeping(now)?;
        }
        Ok(turn)
    }

    fn poll_smoltcp(&mut self, now: Instant) -> Result<(), Error> {
        let smol = self.smol_now(now);
        self.iface.poll(smol, &mut self.dev, &mut self.sockets);
        match self.dev.error.take() {
            Some(e) => Err(Error::Link(e)),
            None => Ok(()),
        }
    }

    /// Reads a batch of frames; true when the link is closed.
    fn read_link(&mut self, now: Instant) -> Result<bool, Error> {
        self.link_pending = true;
        for _ in 0..LINK_BATCH {
            if self.dev.rx_full() {
                self.poll_smoltcp(now)?;
            }
            let mut buf = self.dev.buffer();
            match self.dev.link().recv(&mut buf) {
                Ok(None) => {
                    self.dev.recycle(buf);
                    self.link_pending = false;
                    return Ok(false);
                }
                Ok(Some(0)) => {
                    self.dev.recycle(buf);
                    self.link_pending = false;
                    return Ok(true);
                }
                Ok(Some(n)) => {
                    self.rx_bytes += n as u64;
                    self.ingress(buf, n, now)?;
                }
                Err(e) => return Err(Error::Link(e)),
            }
        }
        Ok(false)
    }

    /// One frame from the sandbox.
    fn ingress(&mut self, buf: Vec<u8>, n: usize, now: Instant) -> Result<(), Error> {
        let (mac, ingress) = frames::classify(&buf[..n]);
        match ingress {
            // netd answers for every address of the sandbox's subnet but the
            // sandbox's own, so that a connect to a neighbour is refused at
            // once rather than after an ARP timeout.
            Ingress::Arp { target } if in_plan_subnet(target) && target != plan::SANDBOX_IP => {
                self.dev.push_rx(buf, n);
            }
            Ingress::Tcp { src, dst, syn, ack, rst, seq, seg_len } => {
                let key = tcp::Key { guest: src, remote: dst };
                match self.tcp.find(&key).and_then(|s| self.tcp.get_mut(s)) {
                    // A retransmitted SYN while the host connect runs.
                    Some(f) if matches!(f.state, tcp::State::Connecting { .. }) => self.dev.recycle(buf),
                    Some(_) => {
                        self.dev.push_rx(buf, n);
                    }
                    None if self.dns_tcp.contains(&key) => {
                        self.dev.push_rx(buf, n);
                    }
                    // DNS over TCP, at any address: netd answers it itself.
                    None if syn && !ack && !rst && dst.port() == 53 => {
                        if self.flows() < self.limits.max_flows && self.dns_tcp.len() < dns_tcp::MAX_CONNS {
                            self.dns_tcp.open(key, &mut self.sockets);
                            self.dev.push_rx(buf, n);
                        } else {
                            self.flows_denied += 1;
                            self.refuse_tcp(key, mac, seq, seg_len)?;
                            self.dev.recycle(buf);
                        }
                    }
                    None if syn && !ack && !rst => {
                        self.new_tcp(key, mac, &buf[..n], seq, seg_len)?;
                        self.dev.recycle(buf);
                    }
                    // Unknown segments: smoltcp answers them with a RST.
                    None => {
                        self.dev.push_rx(buf, n);
                    }
                }
            }
            Ingress::Udp { src, dst, payload } => {
                if self.udp_rate.take(now) {
                    if dst.port() == 53 {
                        let route = Route::Udp { mac, server: dst, client: src };
                        if let Some(reply) = self.dns.query(payload, route, &*self.judge, now) {
                            frames::udp(&mut self.out, mac, dst, src, reply);
                            self.dev.send(&self.out).map_err(Error::Link)?;
                        }
                    } else {
                        self.udp_datagram(udp::Key { guest: src, remote: dst }, mac, payload, &buf[..n], now)?;
                    }
                }
                self.dev.recycle(buf);
            }
            // Pings of netd's own addresses: smoltcp answers them.
            Ingress::IcmpEcho { dst, .. } if dst == plan::GATEWAY_IP || dst == plan::DNS_IP => {
                self.dev.push_rx(buf, n);
            }
            Ingress::IcmpEcho { src, dst, ident, seq, data } => {
                self.guest_mac = mac;
                self.echo(src, dst, ident, seq, data, now);
                self.dev.recycle(buf);
            }
            _ => self.dev.recycle(buf),
        }
        Ok(())
    }

    fn flows(&self) -> usize {
        self.tcp.len() + self.udp.len() + self.dns_tcp.len()
    }

    /// Whether a new flow to `dst` may start; `udp` for the QUIC rule.
    fn allowed(&mut self, dst: SocketAddrV4, udp: bool, now: Instant) -> bool {
        if self.flows() >= self.limits.max_flows {
            return false;
        }
        let ip = *dst.ip();
        if in_plan_subnet(ip) || dst.port() == 853 || (!udp && dst.port() == 53) {
            return false;
        }
        let is_host = self.hosts.is_host(ip, now);
        let names = self.names.lookup(ip, now);
        let v = self.judge.judge(ip, &names, is_host);
        v.allow && (!udp || dst.port() != 443 || v.by_address_rule)
    }

    fn refuse_tcp(&mut self, key: tcp::Key, mac: EthernetAddress, seq: u32, seg_len: u32) -> Result<(), Error> {
        frames::tcp_rst(&mut self.out, mac, key.remote, key.guest, seq, seg_len);
        self.dev.send(&self.out).map_err(Error::Link)
    }

    fn new_tcp(
        &mut self,
        key: tcp::Key,
        mac: EthernetAddress,
        syn: &[u8],
        seq: u32,
        seg_len: u32,
    ) -> Result<(), Error> {
        if !self.allowed(key.remote, false, Instant::now()) {
            self.flows_denied += 1;
            return self.refuse_tcp(key, mac, seq, seg_len);
        }
        let mut stream = match TcpStream::connect(SocketAddr::V4(key.remote)) {
            Ok(s) => s,
            Err(_) => return self.refuse_tcp(key, mac, seq, seg_len),
        };
        let _ = stream.set_nodelay(true);
        set_buffers(std::os::fd::AsRawFd::as_raw_fd(&stream));
        let token = Token(TCP_BASE + self.tcp.next_slot());
        if self.poll.registry().register(&mut stream, token, Interest::READABLE | Interest::WRITABLE).is_err() {
            return self.refuse_tcp(key, mac, seq, seg_len);
        }
        self.tcp.insert(tcp::Flow::new(key, mac, stream, syn.to_vec(), seq, seg_len));
        Ok(())
    }

    /// A connecting flow's host socket fired: open the smoltcp side and feed
    /// it the held SYN, or refuse.
    fn connect_done(&mut self, slot: usize) -> Result<(), Error> {
        let Some(flow) = self.tcp.get_mut(slot) else { return Ok(()) };
        match flow.connect_result() {
            Ok(false) => Ok(()),
            Ok(true) => {
                let full = self.limits.tcp_buffer_bytes;
                let buffer =
                    if self.tcp_memory + 2 * full <= TCP_MEMORY_BUDGET { full } else { SMALL_TCP_BUFFER_BYTES };
                flow.buffer_bytes = 2 * buffer;
                self.tcp_memory += 2 * buffer;
                let handle = self.sockets.add(tcp::socket(&flow.key, buffer));
                let tcp::State::Connecting { syn, .. } =
                    std::mem::replace(&mut flow.state, tcp::State::Open { handle })
                else {
                    return Ok(());
                };
                if self.dev.rx_full() {
                    self.poll_smoltcp(Instant::now())?;
                }
                let mut buf = self.dev.buffer();
                buf[..syn.len()].copy_from_slice(&syn);
                self.dev.push_rx(buf, syn.len());
                Ok(())
            }
            Err(_) => {
                let Some(mut flow) = self.tcp.remove(slot) else { return Ok(()) };
                let _ = self.poll.registry().deregister(&mut flow.stream);
                if let tcp::State::Connecting { seq, seg_len, .. } = flow.state {
                    self.refuse_tcp(flow.key, flow.mac, seq, seg_len)?;
                }
                Ok(())
            }
        }
    }

    fn service_tcp(&mut self) {
        for slot in self.tcp.slots() {
            let Some(flow) = self.tcp.get_mut(slot) else { continue };
            if flow.service(&mut self.sockets) == tcp::Outcome::Remove {
                if let Some(mut flow) = self.tcp.remove(slot) {
                    let _ = self.poll.registry().deregister(&mut flow.stream);
                    if let tcp::State::Open { handle } = flow.state {
                        self.sockets.remove(handle);
                        self.tcp_memory -= flow.buffer_bytes;
                    }
                }
            }
        }
    }

    fn service_dns_tcp(&mut self, now: Instant) {
        let mut questions = Vec::new();
        let mut closed = Vec::new();
        self.dns_tcp.service(&mut self.sockets, |id, q| questions.push((id, q.to_vec())), |id| closed.push(id));
        for id in closed {
            self.dns.forget(id, self.poll.registry());
        }
        for (id, q) in questions {
            if let Some(reply) = self.dns.query(&q, Route::Tcp { conn: id }, &*self.judge, now) {
                self.dns_tcp.answer(id, reply, &mut self.sockets);
            }
        }
    }

    /// An echo request elsewhere: judged like a flow, sent through the ping
    /// socket if the host allows one, else dropped.
    fn echo(&mut self, src: Ipv4Addr, dst: Ipv4Addr, ident: u16, seq: u16, data: &[u8], now: Instant) {
        if in_plan_subnet(dst) || !self.udp_rate.take(now) {
            return;
        }
        let is_host = self.hosts.is_host(dst, now);
        let names = self.names.lookup(dst, now);
        if !self.judge.judge(dst, &names, is_host).allow {
            self.flows_denied += 1;
            return;
        }
        if let PingState::Untried = self.ping {
            self.ping = match Ping::open() {
                Ok(p) => {
                    let fd = p.raw_fd();
                    match self.poll.registry().register(&mut SourceFd(&fd), PING, Interest::READABLE) {
                        Ok(()) => PingState::Open(p),
                        Err(_) => PingState::Unavailable,
                    }
                }
                Err(_) => PingState::Unavailable,
            };
        }
        if let PingState::Open(p) = &mut self.ping {
            p.send(src, dst, ident, seq, data, now);
        }
    }

    fn ping_replies(&mut self, now: Instant) -> Result<(), Error> {
        let PingState::Open(p) = &mut self.ping else { return Ok(()) };
        let (dev, out, mac, mut err) = (&mut self.dev, &mut self.out, self.guest_mac, None);
        p.replies(now, |r| {
            frames::echo_reply(out, mac, r.from, r.to, r.ident, r.seq, r.data);
            if let Err(e) = dev.send(out) {
                err = Some(e);
            }
        });
        err.map_or(Ok(()), |e| Err(Error::Link(e)))
    }

    /// A datagram from the sandbox to `key.remote` (not DNS).
    fn udp_datagram(
        &mut self,
        key: udp::Key,
        mac: EthernetAddress,
        payload: &[u8],
        frame: &[u8],
        now: Instant,
    ) -> Result<(), Error> {
        if let Some(flow) = self.udp.find(&key).and_then(|s| self.udp.get_mut(s)) {
            flow.last = now;
            // A full socket buffer drops the datagram, as a congested link would.
            let _ = flow.sock.send(payload);
            return Ok(());
        }
        let sock = if self.allowed(key.remote, true, now) { self.udp_socket(key) } else { None };
        let Some(mut sock) = sock else {
            self.flows_denied += 1;
            frames::port_unreachable(&mut self.out, mac, frames::ip_packet(frame));
            return self.dev.send(&self.out).map_err(Error::Link);
        };
        let _ = sock.send(payload);
        let token = Token(UDP_BASE + self.udp.next_slot());
        if self.poll.registry().register(&mut sock, token, Interest::READABLE).is_ok() {
            self.udp.insert(udp::Flow { key, mac, sock, last: now });
        }
        Ok(())
    }

    fn udp_socket(&self, key: udp::Key) -> Option<UdpSocket> {
        let sock = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))).ok()?;
        sock.connect(SocketAddr::V4(key.remote)).ok()?;
        Some(sock)
    }

    fn udp_replies(&mut self, slot: usize, now: Instant) -> Result<(), Error> {
        let Some(flow) = self.udp.get_mut(slot) else { return Ok(()) };
        loop {
            match flow.sock.recv(&mut self.rbuf) {
                Ok(n) => {
                    flow.last = now;
                    frames::udp(&mut self.out, flow.mac, flow.key.remote, flow.key.guest, &self.rbuf[..n]);
                    self.dev.send(&self.out).map_err(Error::Link)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock, or an ICMP error the host got for the flow.
                Err(_) => return Ok(()),
            }
        }
    }

    fn dns_answers(&mut self, now: Instant) -> Result<(), Error> {
        let (dev, out, conns, sockets, mut err) =
            (&mut self.dev, &mut self.out, &mut self.dns_tcp, &mut self.sockets, None);
        let send = |m: ToGuest<'_>| deliver(m, dev, out, conns, sockets, &mut err);
        self.dns.answers(&mut self.names, now, self.poll.registry(), RETRY_BASE, send).map_err(Error::Poll)?;
        err.map_or(Ok(()), |e| Err(Error::Link(e)))
    }

    fn dns_retry(&mut self, slot: usize, now: Instant) -> Result<(), Error> {
        let (dev, out, conns, sockets, mut err) =
            (&mut self.dev, &mut self.out, &mut self.dns_tcp, &mut self.sockets, None);
        let send = |m: ToGuest<'_>| deliver(m, dev, out, conns, sockets, &mut err);
        self.dns.retry_ready(slot, self.poll.registry(), &mut self.names, now, send);
        err.map_or(Ok(()), |e| Err(Error::Link(e)))
    }

    fn housekeeping(&mut self, now: Instant) -> Result<(), Error> {
        self.housekeeping_at = now + HOUSEKEEPING;
        for slot in udp::idle(&self.udp, now) {
            if let Some(mut f) = self.udp.remove(slot) {
                let _ = self.poll.registry().deregister(&mut f.sock);
            }
        }
        self.names.expire(now);
        let (dev, out, conns, sockets, mut err) =
            (&mut self.dev, &mut self.out, &mut self.dns_tcp, &mut self.sockets, None);
        self.dns.expire(now, self.poll.registry(), |m| deliver(m, dev, out, conns, sockets, &mut err));
        err.map_or(Ok(()), |e| Err(Error::Link(e)))
    }
}

/// Sends a DNS message to the sandbox the way its question came.
fn deliver(
    m: ToGuest<'_>,
    dev: &mut Device,
    out: &mut Vec<u8>,
    conns: &mut dns_tcp::Conns,
    sockets: &mut SocketSet<'static>,
    err: &mut Option<io::Error>,
) {
    match m.route {
        Route::Udp { mac, server, client } => {
            frames::udp(out, mac, server, client, m.msg);
            if let Err(e) = dev.send(out) {
                *err = Some(e);
            }
        }
        Route::Tcp { conn } => conns.answer(conn, m.msg, sockets),
    }
}

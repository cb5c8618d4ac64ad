//! The harness of the stack tests: netd's library on one end of a
//! SOCK_SEQPACKET socketpair (in a thread), a "guest" on the other: raw frames
//! built here, or a smoltcp interface playing the sandbox.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use pvisor_net::plan;
use pvisor_netd::{Judge, Stack, Verdict};
use pvisor_proto::net::NetConfig;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, HardwareAddress, Icmpv4Message,
    Icmpv4Packet, IpAddress, IpCidr, IpProtocol, Ipv4Packet, TcpPacket, TcpSeqNumber, UdpPacket,
};

/// Give up on a condition after this long (a hang guard, not a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What the judge was asked: destination and the names bound to it.
pub type Asked = Arc<Mutex<Vec<(Ipv4Addr, Vec<String>)>>>;

/// Allows flows to `allow` (loopback test servers, which the real policy
/// always refuses) and names ending in `.allowed.test` or equal to
/// `allowed.test`; records every flow question.
pub struct TestJudge {
    pub allow: Vec<Ipv4Addr>,
    /// Allowed as if by a domain rule (not an IP/CIDR rule).
    pub by_name: Vec<Ipv4Addr>,
    pub asked: Asked,
}

impl Judge for TestJudge {
    fn judge(&self, dst: Ipv4Addr, names: &[&str], _is_host: bool) -> Verdict {
        self.asked.lock().unwrap().push((dst, names.iter().map(|s| s.to_string()).collect()));
        let by_address_rule = self.allow.contains(&dst);
        Verdict { allow: by_address_rule || self.by_name.contains(&dst), by_address_rule, reason: "test" }
    }

    fn decide_name(&self, name: &str) -> bool {
        name == "allowed.test" || name.ends_with(".allowed.test")
    }
}

/// A DNS question (header with RD, one question of `qtype`, class IN).
pub fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![(id >> 8) as u8, id as u8, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, (qtype >> 8) as u8, qtype as u8, 0, 1]);
    q
}

/// The guest end of a frame pipe, for raw frames.
pub struct Frames {
    pub guest: OwnedFd,
}

impl Frames {
    pub fn new(guest: OwnedFd) -> Frames {
        set_nonblocking(&guest);
        Frames { guest }
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: frame is valid for reads of its length.
        let n = unsafe { libc::write(self.guest.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        assert_eq!(n, frame.len() as isize, "frame written");
    }

    /// The next frame from netd for which `pick` returns Some.
    pub fn expect<T>(&self, what: &str, mut pick: impl FnMut(&[u8]) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        let mut buf = vec![0u8; 70000];
        loop {
            match recv(&self.guest, &mut buf) {
                Some(n) => {
                    if let Some(t) = pick(&buf[..n]) {
                        return t;
                    }
                }
                None => {
                    assert!(Instant::now() < deadline, "no frame: {what}");
                    wait_readable(&self.guest, 50);
                }
            }
        }
    }
}

/// netd running on one end of a frame pipe.
pub struct Netd {
    pub frames: Frames,
    pub asked: Asked,
    thread: Option<JoinHandle<()>>,
}

impl std::ops::Deref for Netd {
    type Target = Frames;
    fn deref(&self) -> &Frames {
        &self.frames
    }
}

impl Netd {
    pub fn start(config: NetConfig, allow: Vec<Ipv4Addr>) -> Netd {
        Netd::start_with(config, allow, Vec::new())
    }

    pub fn start_with(config: NetConfig, allow: Vec<Ipv4Addr>, by_name: Vec<Ipv4Addr>) -> Netd {
        let (guest, link) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair");
        let asked: Asked = Arc::default();
        let judge = TestJudge { allow, by_name, asked: asked.clone() };
        let thread = std::thread::spawn(move || {
            let mut stack = Stack::new(link, &config, Box::new(judge), &[]).expect("stack");
            loop {
                let turn = stack.turn().expect("turn");
                if turn.link_closed {
                    return;
                }
            }
        });
        Netd { frames: Frames::new(guest), asked, thread: Some(thread) }
    }

    /// Stops netd (closing the link ends its loop) and waits for it. Every
    /// clone of the guest end must be gone first.
    pub fn stop(self) {
        let Netd { frames, thread, .. } = self;
        drop(frames);
        if let Some(t) = thread {
            t.join().expect("netd thread");
        }
    }

    /// A second handle on the guest end (for a smoltcp guest).
    pub fn guest_fd(&self) -> OwnedFd {
        self.frames.guest.try_clone().expect("dup")
    }
}

fn set_nonblocking(fd: &OwnedFd) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

pub fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    (n > 0).then_some(n as usize)
}

pub fn wait_readable(fd: &OwnedFd, ms: i32) {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

pub const GUEST_MAC: EthernetAddress = EthernetAddress(plan::GUEST_MAC);

/// An ARP request from the guest for `target`.
pub fn arp_request(target: Ipv4Addr) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: GUEST_MAC,
        source_protocol_addr: plan::SANDBOX_IP,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut f = vec![0u8; 14 + repr.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
    eth.set_dst_addr(EthernetAddress::BROADCAST);
    eth.set_src_addr(GUEST_MAC);
    eth.set_ethertype(EthernetProtocol::Arp);
    repr.emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    f
}

/// The ARP reply in `frame`, if it is one: (sender MAC, sender IP).
pub fn arp_reply(frame: &[u8]) -> Option<(EthernetAddress, Ipv4Addr)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    match ArpRepr::parse(&ArpPacket::new_checked(&frame[14..]).ok()?).ok()? {
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply, source_hardware_addr, source_protocol_addr, ..
        } => Some((source_hardware_addr, source_protocol_addr)),
        _ => None,
    }
}

/// A UDP datagram from the guest's `src_port` to `dst`.
pub fn udp_frame(src_port: u16, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + payload.len()];
    let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
    eth.set_dst_addr(EthernetAddress(plan::GATEWAY_MAC));
    eth.set_src_addr(GUEST_MAC);
    eth.set_ethertype(EthernetProtocol::Ipv4);
    let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_total_len((20 + 8 + payload.len()) as u16);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Udp);
    ip.set_src_addr(plan::SANDBOX_IP);
    ip.set_dst_addr(*dst.ip());
    ip.fill_checksum();
    let mut udp = UdpPacket::new_unchecked(&mut f[34..]);
    udp.set_src_port(src_port);
    udp.set_dst_port(dst.port());
    udp.set_len((8 + payload.len()) as u16);
    udp.payload_mut().copy_from_slice(payload);
    udp.fill_checksum(&IpAddress::Ipv4(plan::SANDBOX_IP), &IpAddress::Ipv4(*dst.ip()));
    f
}

/// A TCP SYN from the guest's `src_port` to `dst` with sequence number `seq`.
pub fn syn_frame(src_port: u16, dst: SocketAddrV4, seq: u32) -> Vec<u8> {
    syn_frame_with(src_port, dst, seq, &[])
}

/// A TCP SYN carrying `options` (a multiple of 4 bytes).
pub fn syn_frame_with(src_port: u16, dst: SocketAddrV4, seq: u32, options: &[u8]) -> Vec<u8> {
    tcp_frame(src_port, dst, seq, None, 65535, options)
}

/// A TCP segment from the guest's `src_port` to `dst`, without data: a SYN
/// when `ack` is `None`, else an ACK of `ack`, offering `window`.
pub fn tcp_frame(src_port: u16, dst: SocketAddrV4, seq: u32, ack: Option<u32>, window: u16, options: &[u8]) -> Vec<u8> {
    let tcp_len = 20 + options.len();
    let mut f = vec![0u8; 14 + 20 + tcp_len];
    let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
    eth.set_dst_addr(EthernetAddress(plan::GATEWAY_MAC));
    eth.set_src_addr(GUEST_MAC);
    eth.set_ethertype(EthernetProtocol::Ipv4);
    let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_total_len((20 + tcp_len) as u16);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Tcp);
    ip.set_src_addr(plan::SANDBOX_IP);
    ip.set_dst_addr(*dst.ip());
    ip.fill_checksum();
    let mut tcp = TcpPacket::new_unchecked(&mut f[34..]);
    tcp.set_src_port(src_port);
    tcp.set_dst_port(dst.port());
    tcp.set_seq_number(TcpSeqNumber(seq as i32));
    tcp.set_header_len(tcp_len as u8);
    tcp.clear_flags();
    match ack {
        None => tcp.set_syn(true),
        Some(ack) => {
            tcp.set_ack(true);
            tcp.set_ack_number(TcpSeqNumber(ack as i32));
        }
    }
    tcp.options_mut().copy_from_slice(options);
    tcp.set_window_len(window);
    tcp.fill_checksum(&IpAddress::Ipv4(plan::SANDBOX_IP), &IpAddress::Ipv4(*dst.ip()));
    f
}

/// The acknowledgment number of a RST|ACK to the guest in `frame`.
pub fn rst_to_guest(frame: &[u8]) -> Option<u32> {
    let ip = Ipv4Packet::new_checked(frame.get(14..)?).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(&frame[14 + ip.header_len() as usize..]).ok()?;
    (tcp.rst() && tcp.ack()).then(|| tcp.ack_number().0 as u32)
}

/// The window scale a SYN-ACK to the guest in `frame` offers, if it is one.
pub fn syn_ack_window_scale(frame: &[u8]) -> Option<Option<u8>> {
    let ip = Ipv4Packet::new_checked(frame.get(14..)?).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(&frame[14 + ip.header_len() as usize..]).ok()?;
    if !(tcp.syn() && tcp.ack()) {
        return None;
    }
    let caps = smoltcp::phy::ChecksumCapabilities::ignored();
    let repr = smoltcp::wire::TcpRepr::parse(&tcp, &ip.src_addr().into(), &ip.dst_addr().into(), &caps).ok()?;
    Some(repr.window_scale)
}

/// The UDP datagram in `frame` to the guest: (source, destination port, payload).
pub fn udp_to_guest(frame: &[u8]) -> Option<(SocketAddrV4, u16, Vec<u8>)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(&frame[14..]).ok()?;
    if ip.next_header() != IpProtocol::Udp || !ip.verify_checksum() {
        return None;
    }
    let udp = UdpPacket::new_checked(&frame[14 + ip.header_len() as usize..]).ok()?;
    assert!(udp.verify_checksum(&IpAddress::Ipv4(ip.src_addr()), &IpAddress::Ipv4(ip.dst_addr())), "UDP checksum");
    Some((SocketAddrV4::new(ip.src_addr(), udp.src_port()), udp.dst_port(), udp.payload().to_vec()))
}

/// An ICMP echo request from the guest to `dst`.
pub fn echo_request(dst: Ipv4Addr, seq: u16, data: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + data.len()];
    let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
    eth.set_dst_addr(EthernetAddress(plan::GATEWAY_MAC));
    eth.set_src_addr(GUEST_MAC);
    eth.set_ethertype(EthernetProtocol::Ipv4);
    let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_total_len((20 + 8 + data.len()) as u16);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Icmp);
    ip.set_src_addr(plan::SANDBOX_IP);
    ip.set_dst_addr(dst);
    ip.fill_checksum();
    let mut icmp = Icmpv4Packet::new_unchecked(&mut f[34..]);
    icmp.set_msg_type(Icmpv4Message::EchoRequest);
    icmp.set_msg_code(0);
    icmp.set_echo_ident(ECHO_IDENT);
    icmp.set_echo_seq_no(seq);
    icmp.data_mut().copy_from_slice(data);
    icmp.fill_checksum();
    f
}

/// The ident of [`echo_request`]s.
pub const ECHO_IDENT: u16 = 0x77;

/// An ICMP echo reply to the guest in `frame` (with the guest's ident): (source, sequence, data).
pub fn echo_reply(frame: &[u8]) -> Option<(Ipv4Addr, u16, Vec<u8>)> {
    let ip = Ipv4Packet::new_checked(frame.get(14..)?).ok()?;
    if ip.next_header() != IpProtocol::Icmp {
        return None;
    }
    let icmp = Icmpv4Packet::new_checked(&frame[14 + ip.header_len() as usize..]).ok()?;
    (icmp.msg_type() == Icmpv4Message::EchoReply && icmp.echo_ident() == ECHO_IDENT && icmp.verify_checksum())
        .then(|| (ip.src_addr(), icmp.echo_seq_no(), icmp.data().to_vec()))
}

/// The ICMP destination-unreachable code in `frame`, if it is one.
pub fn icmp_unreachable(frame: &[u8]) -> Option<u8> {
    let ip = Ipv4Packet::new_checked(frame.get(14..)?).ok()?;
    if ip.next_header() != IpProtocol::Icmp {
        return None;
    }
    let body = &frame[14 + ip.header_len() as usize..];
    (body.first() == Some(&3)).then(|| body[1])
}

/// A smoltcp interface playing the sandbox on the guest end of the pipe.
pub struct Guest<'a> {
    pub iface: Interface,
    pub sockets: SocketSet<'a>,
    pub dev: GuestDev,
    epoch: Instant,
}

pub struct GuestDev {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Guest<'_> {
    pub fn new(fd: OwnedFd) -> Guest<'static> {
        let mut dev = GuestDev { fd, buf: vec![0; 70000] };
        let cfg = Config::new(HardwareAddress::Ethernet(GUEST_MAC));
        let mut iface = Interface::new(cfg, &mut dev, smoltcp::time::Instant::from_micros(0));
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(plan::SANDBOX_IP.into(), plan::PREFIX_LEN)).unwrap();
        });
        iface.routes_mut().add_default_ipv4_route(plan::GATEWAY_IP).unwrap();
        Guest { iface, sockets: SocketSet::new(Vec::new()), dev, epoch: Instant::now() }
    }

    pub fn poll(&mut self) {
        let now = smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64);
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
    }

    /// Polls until `done` holds.
    pub fn until(&mut self, what: &str, mut done: impl FnMut(&mut Guest<'_>) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            self.poll();
            if done(self) {
                return;
            }
            assert!(Instant::now() < deadline, "guest: {what}");
            wait_readable(&self.dev.fd, 5);
        }
    }

    pub fn cx(&mut self) -> &mut smoltcp::iface::Context {
        self.iface.context()
    }
}

pub struct GuestRx<'a>(&'a [u8]);
pub struct GuestTx<'a>(&'a OwnedFd);

impl phy::RxToken for GuestRx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl phy::TxToken for GuestTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut b = vec![0u8; len];
        let r = f(&mut b);
        // SAFETY: b is valid for reads of its length.
        unsafe { libc::write(self.0.as_raw_fd(), b.as_ptr().cast(), b.len()) };
        r
    }
}

impl phy::Device for GuestDev {
    type RxToken<'a> = GuestRx<'a>;
    type TxToken<'a> = GuestTx<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(GuestRx<'_>, GuestTx<'_>)> {
        let n = recv(&self.fd, &mut self.buf)?;
        Some((GuestRx(&self.buf[..n]), GuestTx(&self.fd)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<GuestTx<'_>> {
        Some(GuestTx(&self.fd))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = plan::TAP_MTU as usize + 14;
        c
    }
}

//! Frames from the sandbox into netd's whole data path (`pvisor_netd::Stack`:
//! classification, ARP and TCP through smoltcp, the DNS proxy, UDP, ICMP,
//! held SYNs) over a SOCK_SEQPACKET link, as a vm sandbox's virtio-net
//! device feeds it.
//!
//! The input is a sequence of frames, each prefixed by its length (two
//! bytes, big-endian). The judge refuses every flow, so nothing leaves the
//! machine; DNS names of even length are "allowed" and forwarded to a local
//! socket this target holds and never answers.
//!
//! Invariants: the stack survives any frames (no panic, no error but the
//! link closing); everything it sends the sandbox is an Ethernet frame from
//! the gateway's MAC, and its IPv4 packets have correct IP, TCP, UDP and
//! ICMP checksums and lengths.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pvisor_netd::frames::ETH_LEN;
use pvisor_netd::{Judge, Stack, Verdict};
use pvisor_proto::net::NetConfig;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};

/// Most turns of the loop per input (each handles up to a batch of frames).
const MAX_TURNS: usize = 64;

struct DenyFlows;

impl Judge for DenyFlows {
    fn judge(&self, _dst: Ipv4Addr, _names: &[&str], _is_host: bool) -> Verdict {
        Verdict::deny("fuzzing")
    }
    fn decide_name(&self, name: &str) -> bool {
        name.len().is_multiple_of(2)
    }
}

/// A local UDP socket standing in for the upstream resolver (never read).
fn upstream() -> SocketAddr {
    static SOCK: OnceLock<UdpSocket> = OnceLock::new();
    let sock = SOCK.get_or_init(|| UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding a local UDP socket"));
    sock.local_addr().expect("a bound socket has an address")
}

fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array it is given.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fn send(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: frame is valid for reads of frame.len() bytes.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) };
    // A full link drops the frame, as a real one would.
    let _ = n;
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    usize::try_from(n).ok()
}

/// What netd sent the sandbox: well-formed, with correct checksums.
fn check_egress(frame: &[u8]) {
    let eth = EthernetFrame::new_checked(frame).expect("netd sent a short Ethernet frame");
    assert_eq!(eth.src_addr().0, pvisor_net::plan::GATEWAY_MAC, "frame not from the gateway's MAC");
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return;
    }
    let ip = Ipv4Packet::new_checked(&frame[ETH_LEN..]).expect("netd sent a malformed IPv4 packet");
    assert!(ip.verify_checksum(), "bad IPv4 checksum");
    assert_eq!(ip.total_len() as usize, frame.len() - ETH_LEN, "IPv4 length does not match the frame");
    let (src, dst) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
    match ip.next_header() {
        IpProtocol::Tcp => {
            let tcp = TcpPacket::new_checked(ip.payload()).expect("malformed TCP");
            assert!(tcp.verify_checksum(&src, &dst), "bad TCP checksum");
        }
        IpProtocol::Udp => {
            let udp = UdpPacket::new_checked(ip.payload()).expect("malformed UDP");
            assert!(udp.verify_checksum(&src, &dst), "bad UDP checksum");
        }
        IpProtocol::Icmp => {
            let icmp = Icmpv4Packet::new_checked(ip.payload()).expect("malformed ICMP");
            assert!(icmp.verify_checksum(), "bad ICMP checksum");
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let (ours, theirs) = seqpacket_pair();
    let config = NetConfig { upstream_dns: vec![upstream().to_string()], ..NetConfig::default() };
    let mut stack = Stack::new(theirs, &config, Box::new(DenyFlows), &[]).expect("netd's stack starts");
    let mut rest = data;
    while let [hi, lo, tail @ ..] = rest {
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
        send(&ours, &tail[..len]);
        rest = &tail[len..];
    }
    // SAFETY: shutdown on an fd we own: netd then reads the end of the link.
    unsafe { libc::shutdown(ours.as_raw_fd(), libc::SHUT_WR) };
    let mut closed = false;
    for _ in 0..MAX_TURNS {
        let turn = stack.turn().expect("a turn of netd's loop fails on sandbox input");
        if turn.link_closed {
            closed = true;
            break;
        }
    }
    assert!(closed, "netd did not see the end of the link in {MAX_TURNS} turns");
    let mut buf = vec![0u8; pvisor_netd::link::MAX_FRAME];
    while let Some(n) = recv(&ours, &mut buf) {
        check_egress(&buf[..n]);
    }
});

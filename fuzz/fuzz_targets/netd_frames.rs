//! Frames from the sandbox as netd classifies them before smoltcp sees them
//! (`pvisor_netd::frames`): Ethernet, ARP, IPv4, TCP, UDP, ICMP.
//!
//! Invariants: classification never reads past the IP packet's own length;
//! every frame netd writes in answer (a UDP reply, the RST refusing a
//! connect, an echo reply, an ICMP port unreachable quoting the frame) is a
//! well-formed IPv4 packet with correct checksums that classifies back to
//! what was meant, addressed back to the sender (or is dropped, when it
//! comes from an address netd takes nothing from).
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use pvisor_netd::frames::{self, Ingress, ETH_LEN};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, Icmpv4Message, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, TcpPacket,
    UdpPacket,
};

/// Whether netd takes packets from `ip` (no reply can go to 0.0.0.0, a
/// broadcast or a group), so whether an answer from it reads back.
fn answerable(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
}

/// What classifying netd's answer from `from` must give.
fn expected(from: Ipv4Addr, meant: Ingress<'_>) -> Ingress<'_> {
    if answerable(from) {
        meant
    } else {
        Ingress::Other
    }
}

/// The IPv4 packet of a frame netd wrote, checked.
fn ip_of(out: &[u8], mac: EthernetAddress) -> Ipv4Packet<&[u8]> {
    let eth = EthernetFrame::new_checked(out).expect("netd wrote a short Ethernet frame");
    assert_eq!(eth.dst_addr(), mac);
    let ip = Ipv4Packet::new_checked(&out[ETH_LEN..]).expect("netd wrote a malformed IPv4 packet");
    assert!(ip.verify_checksum(), "bad IPv4 checksum");
    assert_eq!(ip.total_len() as usize, out.len() - ETH_LEN, "IPv4 length does not match the frame");
    ip
}

fuzz_target!(|frame: &[u8]| {
    let (mac, ingress) = frames::classify(frame);
    let mut out = Vec::new();
    match ingress {
        Ingress::Udp { src, dst, payload } => {
            assert!(payload.len() + ETH_LEN + 28 <= frame.len());
            frames::udp(&mut out, mac, dst, src, payload);
            let ip = ip_of(&out, mac);
            let udp = UdpPacket::new_checked(ip.payload()).expect("malformed UDP");
            let (s, d) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
            assert!(udp.verify_checksum(&s, &d), "bad UDP checksum");
            assert_eq!(frames::classify(&out).1, expected(*dst.ip(), Ingress::Udp { src: dst, dst: src, payload }));
        }
        Ingress::Tcp { src, dst, seq, seg_len, .. } => {
            frames::tcp_rst(&mut out, mac, dst, src, seq, seg_len);
            let ip = ip_of(&out, mac);
            let tcp = TcpPacket::new_checked(ip.payload()).expect("malformed TCP");
            let (s, d) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
            assert!(tcp.verify_checksum(&s, &d), "bad TCP checksum");
            assert_eq!(tcp.ack_number().0 as u32, seq.wrapping_add(seg_len));
            let rst = Ingress::Tcp { src: dst, dst: src, syn: false, ack: true, rst: true, seq: 0, seg_len: 0 };
            assert_eq!(frames::classify(&out).1, expected(*dst.ip(), rst));
        }
        Ingress::IcmpEcho { src, dst, ident, seq, data } => {
            frames::echo_reply(&mut out, mac, dst, src, ident, seq, data);
            let ip = ip_of(&out, mac);
            assert_eq!((ip.src_addr(), ip.dst_addr(), ip.next_header()), (dst, src, IpProtocol::Icmp));
            let icmp = Icmpv4Packet::new_checked(ip.payload()).expect("malformed ICMP");
            assert!(icmp.verify_checksum(), "bad ICMP checksum");
            assert_eq!(icmp.msg_type(), Icmpv4Message::EchoReply);
            assert_eq!((icmp.echo_ident(), icmp.echo_seq_no(), icmp.data()), (ident, seq, data));
        }
        Ingress::Arp { .. } | Ingress::Other => {}
    }
    let packet = frames::ip_packet(frame);
    frames::port_unreachable(&mut out, mac, packet);
    if let Ok(orig) = Ipv4Packet::new_checked(packet) {
        let ip = ip_of(&out, mac);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (orig.dst_addr(), orig.src_addr()));
        let icmp = Icmpv4Packet::new_checked(ip.payload()).expect("malformed ICMP");
        assert!(icmp.verify_checksum(), "bad ICMP checksum");
        assert_eq!(icmp.msg_type(), Icmpv4Message::DstUnreachable);
        assert!(packet.starts_with(icmp.data()), "the quote is not the packet's start");
    }
});

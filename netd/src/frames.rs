//! Reading the frames netd must look at before smoltcp does, and writing the
//! ones it answers itself (RSTs for refused connects, UDP and DNS replies,
//! ICMP errors and echo replies), with smoltcp's wire accessors.
use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::wire::{
    ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv4Message, Icmpv4Packet, IpAddress,
    IpProtocol, Ipv4Packet, TcpPacket, TcpSeqNumber, UdpPacket,
};

pub const ETH_LEN: usize = 14;
pub const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;
const TCP_LEN: usize = 20;
const ICMP_LEN: usize = 8;
const TTL: u8 = 64;

/// What a frame from the sandbox is, as far as netd's routing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress<'a> {
    /// An ARP request or reply asking about `target`.
    Arp {
        target: Ipv4Addr,
    },
    Tcp {
        src: SocketAddrV4,
        dst: SocketAddrV4,
        syn: bool,
        ack: bool,
        rst: bool,
        seq: u32,
        seg_len: u32,
    },
    Udp {
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &'a [u8],
    },
    IcmpEcho {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ident: u16,
        seq: u16,
        data: &'a [u8],
    },
    /// Anything else (IPv6, fragments, malformed): dropped.
    Other,
}

/// Classifies a frame; also returns its source MAC (the sandbox's).
pub fn classify(frame: &[u8]) -> (EthernetAddress, Ingress<'_>) {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return (EthernetAddress([0; 6]), Ingress::Other) };
    let mac = eth.src_addr();
    let payload = &frame[ETH_LEN..];
    let ingress = match eth.ethertype() {
        EthernetProtocol::Arp => match ArpPacket::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) {
            Ok(ArpRepr::EthernetIpv4 { target_protocol_addr, .. }) => Ingress::Arp { target: target_protocol_addr },
            _ => Ingress::Other,
        },
        EthernetProtocol::Ipv4 => ipv4(payload),
        _ => Ingress::Other,
    };
    (mac, ingress)
}

fn ipv4(packet: &[u8]) -> Ingress<'_> {
    let Ok(ip) = Ipv4Packet::new_checked(packet) else { return Ingress::Other };
    // smoltcp's length check lets a header shorter than 20 bytes through
    // (its "payload" would be the addresses).
    if ip.version() != 4 || usize::from(ip.header_len()) < IP_LEN || ip.more_frags() || ip.frag_offset() != 0 {
        return Ingress::Other;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    // Nothing can answer a packet from no address, a broadcast or a group:
    // smoltcp would panic replying to 0.0.0.0 (it asserts a destination).
    if src.is_unspecified() || src.is_broadcast() || src.is_multicast() {
        return Ingress::Other;
    }
    let body = &packet[ip.header_len() as usize..ip.total_len() as usize];
    match ip.next_header() {
        IpProtocol::Tcp => {
            let Ok(tcp) = TcpPacket::new_checked(body) else { return Ingress::Other };
            Ingress::Tcp {
                src: SocketAddrV4::new(src, tcp.src_port()),
                dst: SocketAddrV4::new(dst, tcp.dst_port()),
                syn: tcp.syn(),
                ack: tcp.ack(),
                rst: tcp.rst(),
                seq: tcp.seq_number().0 as u32,
                seg_len: tcp.segment_len() as u32,
            }
        }
        IpProtocol::Udp => {
            let Ok(udp) = UdpPacket::new_checked(body) else { return Ingress::Other };
            let len = (udp.len() as usize).min(body.len());
            Ingress::Udp {
                src: SocketAddrV4::new(src, udp.src_port()),
                dst: SocketAddrV4::new(dst, udp.dst_port()),
                payload: &body[UDP_LEN..len],
            }
        }
        IpProtocol::Icmp => {
            let Ok(icmp) = Icmpv4Packet::new_checked(body) else { return Ingress::Other };
            if icmp.msg_type() != Icmpv4Message::EchoRequest {
                return Ingress::Other;
            }
            Ingress::IcmpEcho { src, dst, ident: icmp.echo_ident(), seq: icmp.echo_seq_no(), data: &body[ICMP_LEN..] }
        }
        _ => Ingress::Other,
    }
}

/// Writes the Ethernet and IPv4 headers of a frame from `src` to the sandbox
/// (`dst`, at `mac`) carrying `l4_len` bytes of `proto`, sized in `out`.
fn headers(out: &mut Vec<u8>, mac: EthernetAddress, src: Ipv4Addr, dst: Ipv4Addr, proto: IpProtocol, l4_len: usize) {
    out.clear();
    out.resize(ETH_LEN + IP_LEN + l4_len, 0);
    let mut eth = EthernetFrame::new_unchecked(&mut out[..]);
    eth.set_dst_addr(mac);
    eth.set_src_addr(EthernetAddress(pvisor_net::plan::GATEWAY_MAC));
    eth.set_ethertype(EthernetProtocol::Ipv4);
    let mut ip = Ipv4Packet::new_unchecked(&mut out[ETH_LEN..]);
    ip.set_version(4);
    ip.set_header_len(IP_LEN as u8);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len((IP_LEN + l4_len) as u16);
    ip.set_ident(0);
    ip.clear_flags();
    ip.set_dont_frag(true);
    ip.set_frag_offset(0);
    ip.set_hop_limit(TTL);
    ip.set_next_header(proto);
    ip.set_src_addr(src);
    ip.set_dst_addr(dst);
    ip.fill_checksum();
}

/// A UDP datagram from `src` to the sandbox's `dst`.
pub fn udp(out: &mut Vec<u8>, mac: EthernetAddress, src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) {
    headers(out, mac, *src.ip(), *dst.ip(), IpProtocol::Udp, UDP_LEN + payload.len());
    let mut udp = UdpPacket::new_unchecked(&mut out[ETH_LEN + IP_LEN..]);
    udp.set_src_port(src.port());
    udp.set_dst_port(dst.port());
    udp.set_len((UDP_LEN + payload.len()) as u16);
    udp.payload_mut().copy_from_slice(payload);
    udp.fill_checksum(&IpAddress::Ipv4(*src.ip()), &IpAddress::Ipv4(*dst.ip()));
}

/// The RST|ACK that refuses the connect whose SYN was `seq`/`seg_len` from
/// the sandbox's `guest` to `remote` (ECONNREFUSED in the sandbox).
pub fn tcp_rst(
    out: &mut Vec<u8>,
    mac: EthernetAddress,
    remote: SocketAddrV4,
    guest: SocketAddrV4,
    seq: u32,
    seg_len: u32,
) {
    headers(out, mac, *remote.ip(), *guest.ip(), IpProtocol::Tcp, TCP_LEN);
    let mut tcp = TcpPacket::new_unchecked(&mut out[ETH_LEN + IP_LEN..]);
    tcp.set_src_port(remote.port());
    tcp.set_dst_port(guest.port());
    tcp.set_seq_number(TcpSeqNumber(0));
    tcp.set_ack_number(TcpSeqNumber(seq.wrapping_add(seg_len) as i32));
    tcp.set_header_len(TCP_LEN as u8);
    tcp.clear_flags();
    tcp.set_rst(true);
    tcp.set_ack(true);
    tcp.set_window_len(0);
    tcp.set_urgent_at(0);
    tcp.fill_checksum(&IpAddress::Ipv4(*remote.ip()), &IpAddress::Ipv4(*guest.ip()));
}

/// ICMP port unreachable for the IP packet `orig` (its header and first 8
/// bytes are quoted), from `orig`'s destination: ECONNREFUSED on the
/// sandbox's connected UDP socket.
pub fn port_unreachable(out: &mut Vec<u8>, mac: EthernetAddress, orig: &[u8]) {
    let Ok(ip) = Ipv4Packet::new_checked(orig) else { return };
    let quoted = &orig[..(ip.header_len() as usize + 8).min(orig.len())];
    let (from, to) = (ip.dst_addr(), ip.src_addr());
    headers(out, mac, from, to, IpProtocol::Icmp, ICMP_LEN + quoted.len());
    let mut icmp = Icmpv4Packet::new_unchecked(&mut out[ETH_LEN + IP_LEN..]);
    icmp.set_msg_type(Icmpv4Message::DstUnreachable);
    icmp.set_msg_code(3);
    // The 4 unused bytes after the checksum.
    icmp.set_echo_ident(0);
    icmp.set_echo_seq_no(0);
    icmp.data_mut().copy_from_slice(quoted);
    icmp.fill_checksum();
}

/// An ICMP echo reply from `src` to the sandbox's `dst`.
#[allow(clippy::too_many_arguments)]
pub fn echo_reply(
    out: &mut Vec<u8>,
    mac: EthernetAddress,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    seq: u16,
    data: &[u8],
) {
    headers(out, mac, src, dst, IpProtocol::Icmp, ICMP_LEN + data.len());
    let mut icmp = Icmpv4Packet::new_unchecked(&mut out[ETH_LEN + IP_LEN..]);
    icmp.set_msg_type(Icmpv4Message::EchoReply);
    icmp.set_msg_code(0);
    icmp.set_echo_ident(ident);
    icmp.set_echo_seq_no(seq);
    icmp.data_mut().copy_from_slice(data);
    icmp.fill_checksum();
}

/// The IP packet of a frame (for ICMP errors quoting it).
pub fn ip_packet(frame: &[u8]) -> &[u8] {
    frame.get(ETH_LEN..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);

    /// A UDP frame from `src` built by netd's own writer (then read as if
    /// the sandbox had sent it).
    fn udp_from(src: Ipv4Addr) -> Vec<u8> {
        let mut out = Vec::new();
        udp(&mut out, MAC, SocketAddrV4::new(src, 5353), SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 3), 53), b"q");
        out
    }

    #[test]
    fn well_formed_udp_is_classified() {
        let frame = udp_from(Ipv4Addr::new(10, 0, 2, 100));
        let (_, ingress) = classify(&frame);
        assert!(matches!(ingress, Ingress::Udp { payload: b"q", .. }), "{ingress:?}");
    }

    /// Found by the netd_stack fuzz target: a TCP SYN from 0.0.0.0 to port 53
    /// made smoltcp panic answering it, which killed netd.
    #[test]
    fn packets_from_no_address_a_broadcast_or_a_group_are_dropped() {
        for src in [Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST, Ipv4Addr::new(224, 0, 0, 251)] {
            assert_eq!(classify(&udp_from(src)).1, Ingress::Other, "from {src}");
        }
    }

    /// Found by the netd_frames fuzz target: a header length under 20 bytes
    /// was accepted and the UDP header read from the IP addresses.
    #[test]
    fn a_short_ip_header_is_dropped() {
        let mut frame = udp_from(Ipv4Addr::new(10, 0, 2, 100));
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[ETH_LEN..]);
        ip.set_header_len(16);
        ip.fill_checksum();
        assert_eq!(classify(&frame).1, Ingress::Other);
    }
}

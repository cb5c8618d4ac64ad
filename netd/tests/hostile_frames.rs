//! Frames no well-behaved sandbox sends, found by the fuzz targets in
//! fuzz/ (`netd_stack`): netd must drop them and keep serving.
mod common;

use std::net::{Ipv4Addr, SocketAddrV4};

use common::*;
use pvisor_net::plan;
use pvisor_proto::net::NetConfig;
use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};

/// `frame` (an IPv4 TCP frame) as if sent from `src`, checksums redone.
fn from(mut frame: Vec<u8>, src: Ipv4Addr) -> Vec<u8> {
    let mut ip = Ipv4Packet::new_unchecked(&mut frame[14..]);
    ip.set_src_addr(src);
    ip.fill_checksum();
    let dst = ip.dst_addr();
    let mut tcp = TcpPacket::new_unchecked(&mut frame[34..]);
    tcp.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    frame
}

/// A SYN from 0.0.0.0 to the resolver's port 53 (DNS over TCP, answered by
/// smoltcp) or anywhere else made smoltcp panic replying to no address.
#[test]
fn tcp_from_no_address_is_dropped_and_netd_keeps_serving() {
    let netd = Netd::start(NetConfig::default(), vec![]);
    for src in [Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST] {
        netd.send(&from(syn_frame(40000, SocketAddrV4::new(plan::DNS_IP, 53), 1000), src));
        netd.send(&from(syn_frame(40001, SocketAddrV4::new(Ipv4Addr::new(93, 184, 216, 34), 443), 7), src));
    }
    netd.send(&arp_request(plan::GATEWAY_IP));
    let (_, ip) = netd.expect("ARP reply after the hostile frames", arp_reply);
    assert_eq!(ip, plan::GATEWAY_IP);
    netd.stop();
}

//! A sandbox that closes its receive window, with nothing left in flight, and
//! whose window update is then lost still gets the rest of a download: netd
//! probes the zero window (RFC 9293 3.8.6.1) instead of waiting for an update
//! that never comes. A Linux guest with a small receive buffer closes its
//! window to 64 KiB segments several times per download (TCPToZeroWindowAdv);
//! before netd probed, one lost update stalled the flow for good (the flaky
//! `virtio_net_netd_qemu` test).
//!
//! The sandbox is played with raw frames, so that the window is zero exactly
//! when every byte netd sent is acknowledged (no retransmission can restart
//! the flow).
mod common;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};

use common::*;
use pvisor_net::plan;
use pvisor_proto::net::NetConfig;
use smoltcp::wire::{IpProtocol, Ipv4Packet, TcpPacket};

const DOWNLOAD: usize = 64 << 10;
const FIRST_WINDOW: u16 = 1000;
const GUEST_PORT: u16 = 50100;
const GUEST_ISN: u32 = 1000;

/// A TCP segment from netd to the guest's port.
#[derive(Debug)]
struct Segment {
    seq: u32,
    syn: bool,
    fin: bool,
    data: usize,
}

fn segment_to_guest(frame: &[u8]) -> Option<Segment> {
    let ip = Ipv4Packet::new_checked(frame.get(14..)?).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(&frame[14 + ip.header_len() as usize..]).ok()?;
    assert!(!tcp.rst(), "netd reset the flow");
    (tcp.dst_port() == GUEST_PORT).then(|| Segment {
        seq: tcp.seq_number().0 as u32,
        syn: tcp.syn(),
        fin: tcp.fin(),
        data: tcp.payload().len(),
    })
}

/// An ACK from the guest acknowledging `ack` and offering `window`.
fn ack_frame(dst: SocketAddrV4, seq: u32, ack: u32, window: u16) -> Vec<u8> {
    tcp_frame(GUEST_PORT, dst, seq, Some(ack), window, &[])
}

#[test]
fn a_lost_window_update_does_not_stall_a_download() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.local_addr().unwrap().port());
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&vec![0x5a; DOWNLOAD]).unwrap();
        // Dropping s sends the host's FIN.
    });
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    let seq = GUEST_ISN + 1;

    // As a guest does first: the gateway's address (netd learns the guest's from it).
    netd.send(&arp_request(plan::GATEWAY_IP));
    netd.expect("the gateway's ARP reply", arp_reply);
    netd.send(&syn_frame(GUEST_PORT, host, GUEST_ISN));
    let syn_ack = netd.expect("SYN-ACK", |f| segment_to_guest(f).filter(|s| s.syn));
    let mut next = syn_ack.seq.wrapping_add(1);
    netd.send(&ack_frame(host, seq, next, FIRST_WINDOW));

    // A window's worth arrives; the guest acknowledges all of it and closes its window.
    let mut got = 0usize;
    while got < usize::from(FIRST_WINDOW) {
        let s = netd.expect("data within the first window", |f| segment_to_guest(f).filter(|s| s.data > 0));
        assert_eq!(s.seq, next, "in order, nothing lost on this wire");
        got += s.data;
        next = next.wrapping_add(s.data as u32);
    }
    assert_eq!(got, usize::from(FIRST_WINDOW), "netd kept to the window");
    netd.send(&ack_frame(host, seq, next, 0));

    // The guest's window opens again, and the update that says so is lost:
    // only a probe from netd can restart the flow.
    let probe = netd.expect("a zero-window probe", |f| segment_to_guest(f).filter(|s| s.data > 0));
    assert_eq!((probe.seq, probe.data), (next, 1), "a probe carries the next byte");
    got += 1;
    next = next.wrapping_add(1);
    netd.send(&ack_frame(host, seq, next, u16::MAX));

    // The rest, acknowledged as it comes, then the host's FIN.
    loop {
        let s = netd.expect("the rest of the download", segment_to_guest);
        if s.seq == next {
            got += s.data;
            next = next.wrapping_add(s.data as u32 + u32::from(s.fin));
        }
        netd.send(&ack_frame(host, seq, next, u16::MAX));
        if s.fin && s.seq.wrapping_add(s.data as u32).wrapping_add(1) == next {
            break;
        }
    }
    assert_eq!(got, DOWNLOAD);
    server.join().unwrap();
    netd.stop();
}

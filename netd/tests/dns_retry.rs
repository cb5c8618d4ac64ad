//! A truncated upstream answer (TC): a question that came over TCP is asked
//! again upstream over TCP and gets the full answer (whose A records bind
//! like any); one that came over UDP gets the truncated answer as it is; an
//! upstream that takes no TCP gives the TCP client a SERVFAIL. Against a
//! stand-in upstream on loopback that truncates every UDP answer.
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use pvisor_net::{dns, plan};
use pvisor_proto::net::NetConfig;
use smoltcp::socket::tcp;

const NAME: &str = "big.allowed.test";
/// More A records than a 512-byte datagram holds.
const RECORDS: u8 = 40;

fn record(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, i + 1)
}

/// The full answer to `query`: [`RECORDS`] A records.
fn full_answer(query: &[u8]) -> Vec<u8> {
    let q = dns::parse_query(query).unwrap();
    let mut r = Vec::new();
    dns::reply(query, &q, dns::RCODE_NOERROR, &mut r);
    r[7] = RECORDS;
    for i in 0..RECORDS {
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
        r.extend_from_slice(&record(i).octets());
    }
    r
}

/// How many questions the stand-in got over each transport.
#[derive(Default)]
struct Counts {
    udp: AtomicUsize,
    tcp: AtomicUsize,
}

/// A resolver on loopback whose UDP answers are all truncated (header and
/// question, TC set) and, with `tcp`, a TCP listener on the same port that
/// answers in full.
fn stand_in(tcp: bool) -> (SocketAddr, Arc<Counts>) {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = udp.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            c.udp.fetch_add(1, Ordering::SeqCst);
            let q = dns::parse_query(&buf[..n]).unwrap();
            let mut r = Vec::new();
            dns::reply(&buf[..n], &q, dns::RCODE_NOERROR, &mut r);
            r[2] |= 0x02; // TC
            udp.send_to(&r, from).unwrap();
        }
    });
    if tcp {
        let listener = TcpListener::bind(addr).unwrap();
        let c = counts.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut s = conn.unwrap();
                let mut len = [0u8; 2];
                s.read_exact(&mut len).unwrap();
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                s.read_exact(&mut q).unwrap();
                c.tcp.fetch_add(1, Ordering::SeqCst);
                assert_eq!(dns::parse_query(&q).unwrap().name, NAME);
                let r = full_answer(&q);
                s.write_all(&(r.len() as u16).to_be_bytes()).unwrap();
                s.write_all(&r).unwrap();
            }
        });
    }
    (addr, counts)
}

/// Asks netd's resolver over DNS-over-TCP; the answer.
fn ask_over_tcp(netd: &Netd, id: u16) -> Vec<u8> {
    let mut guest = Guest::new(netd.guest_fd());
    let h = guest
        .sockets
        .add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 65536]), tcp::SocketBuffer::new(vec![0; 65536])));
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (plan::DNS_IP, 53), 50100 + id).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let q = query(id, NAME, dns::TYPE_A);
    let s = guest.sockets.get_mut::<tcp::Socket>(h);
    s.send_slice(&(q.len() as u16).to_be_bytes()).unwrap();
    s.send_slice(&q).unwrap();
    let mut got = Vec::new();
    guest.until("an answer", |g| {
        let s = g.sockets.get_mut::<tcp::Socket>(h);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        got.len() >= 2 && got.len() >= 2 + u16::from_be_bytes([got[0], got[1]]) as usize
    });
    let len = u16::from_be_bytes([got[0], got[1]]) as usize;
    got[2..2 + len].to_vec()
}

#[test]
fn a_truncated_answer_is_asked_again_over_tcp_for_a_tcp_client_and_relayed_as_is_over_udp() {
    let (upstream, counts) = stand_in(true);
    let netd = Netd::start(NetConfig { upstream_dns: vec![upstream.to_string()], ..Default::default() }, vec![]);

    // Over UDP: the truncated answer, under the client's id, and no TCP.
    let resolver = SocketAddrV4::new(plan::DNS_IP, 53);
    netd.send(&udp_frame(40010, resolver, &query(0x1010, NAME, dns::TYPE_A)));
    let (_, port, msg) = netd.expect("the truncated answer", udp_to_guest);
    assert_eq!(port, 40010);
    assert!(dns::is_truncated(&msg), "relayed as it came");
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.a_records.len()), (0x1010, 0));
    assert_eq!(counts.tcp.load(Ordering::SeqCst), 0, "a UDP client retries over TCP itself");

    // Over TCP: netd asks upstream over UDP, gets TC, asks again over TCP.
    let msg = ask_over_tcp(&netd, 0x2020);
    assert!(!dns::is_truncated(&msg), "the full answer");
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.rcode), (0x2020, dns::RCODE_NOERROR), "under the client's id");
    let addrs: Vec<Ipv4Addr> = a.a_records.iter().map(|r| r.addr).collect();
    assert_eq!(addrs, (0..RECORDS).map(record).collect::<Vec<_>>());
    assert_eq!((counts.udp.load(Ordering::SeqCst), counts.tcp.load(Ordering::SeqCst)), (2, 1));

    // The full answer's records bind to the name like any answer's: a
    // connect to the last one is judged with the name.
    let last = record(RECORDS - 1);
    let mut guest = Guest::new(netd.guest_fd());
    let h = guest
        .sockets
        .add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 4096]), tcp::SocketBuffer::new(vec![0; 4096])));
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (last, 443), 50000).unwrap();
    guest.until("reset", |g| g.sockets.get::<tcp::Socket>(h).state() == tcp::State::Closed);
    let asked = netd.asked.lock().unwrap().clone();
    assert_eq!(asked, [(last, vec![NAME.to_string()])]);
    drop(guest);
    netd.stop();
}

#[test]
fn an_upstream_without_tcp_gives_the_tcp_client_a_servfail() {
    let (upstream, counts) = stand_in(false);
    let netd = Netd::start(NetConfig { upstream_dns: vec![upstream.to_string()], ..Default::default() }, vec![]);
    let msg = ask_over_tcp(&netd, 0x3030);
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.rcode), (0x3030, dns::RCODE_SERVFAIL));
    assert_eq!(counts.udp.load(Ordering::SeqCst), 1);
    netd.stop();
}

//! netd's stack on an in-memory frame pipe (a SOCK_SEQPACKET socketpair),
//! with raw frames and a smoltcp interface playing the sandbox.
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};

use common::*;
use pvisor_net::{dns, plan};
use pvisor_proto::net::{NetConfig, NetLimits};
use smoltcp::socket::tcp;

const DENIED: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

#[test]
fn arp_is_answered_for_the_subnet_but_the_sandbox_itself() {
    let netd = Netd::start(NetConfig::default(), vec![]);
    let neighbour = Ipv4Addr::new(10, 0, 2, 5);
    for ip in [plan::GATEWAY_IP, plan::DNS_IP, neighbour] {
        // The sandbox's own address and addresses off the subnet get no answer,
        // so the first reply is the one asked next.
        netd.send(&arp_request(plan::SANDBOX_IP));
        netd.send(&arp_request(Ipv4Addr::new(203, 0, 113, 1)));
        netd.send(&arp_request(ip));
        let (mac, from) = netd.expect("ARP reply", arp_reply);
        assert_eq!((mac.0, from), (plan::GATEWAY_MAC, ip));
    }
    // A neighbour is refused at once, like every address of the subnet but DNS.
    netd.send(&syn_frame(43100, SocketAddrV4::new(neighbour, 80), 5));
    assert_eq!(netd.expect("RST from a neighbour", rst_to_guest), 6);
    netd.stop();
}

#[test]
fn pings_of_the_gateway_are_answered_others_dropped() {
    let netd = Netd::start(NetConfig::default(), vec![]);
    netd.send(&arp_request(plan::GATEWAY_IP));
    netd.expect("ARP reply", arp_reply);
    // Elsewhere (no ping socket forwarding yet): dropped, so the gateway's reply is the first.
    netd.send(&echo_request(Ipv4Addr::new(203, 0, 113, 1), 7, b"far"));
    netd.send(&echo_request(plan::GATEWAY_IP, 8, b"near"));
    let (from, seq, data) = netd.expect("echo reply", echo_reply);
    assert_eq!((from, seq, data.as_slice()), (plan::GATEWAY_IP, 8, &b"near"[..]));
    netd.stop();
}

#[test]
fn dns_denied_is_nxdomain_allowed_is_relayed_and_binds_the_name() {
    // A stand-in upstream on loopback (netd's own traffic may go there).
    let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
    let up_addr = upstream.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let (n, from) = upstream.recv_from(&mut buf).unwrap();
        let q = dns::parse_query(&buf[..n]).unwrap();
        assert_eq!(q.name, "www.allowed.test");
        let mut r = Vec::new();
        dns::reply(&buf[..n], &q, dns::RCODE_NOERROR, &mut r);
        r[7] = 1; // ANCOUNT = 1
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 10]);
        upstream.send_to(&r, from).unwrap();
    });
    let config = NetConfig { upstream_dns: vec![up_addr.to_string()], ..Default::default() };
    let netd = Netd::start(config, vec![]);

    // Denied name, to an address that is not even the resolver: NXDOMAIN from it.
    let anywhere = SocketAddrV4::new(Ipv4Addr::new(8, 8, 8, 8), 53);
    netd.send(&udp_frame(40000, anywhere, &query(0x1111, "denied.test", dns::TYPE_A)));
    let (from, port, msg) = netd.expect("NXDOMAIN", udp_to_guest);
    assert_eq!((from, port), (anywhere, 40000));
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.rcode), (0x1111, dns::RCODE_NXDOMAIN));

    // AAAA: an empty answer, never forwarded.
    let resolver = SocketAddrV4::new(plan::DNS_IP, 53);
    netd.send(&udp_frame(40001, resolver, &query(0x2222, "www.allowed.test", dns::TYPE_AAAA)));
    let (_, _, msg) = netd.expect("empty AAAA answer", udp_to_guest);
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.rcode, a.a_records.len()), (0x2222, dns::RCODE_NOERROR, 0));

    // Allowed: relayed from upstream, under the guest's id.
    netd.send(&udp_frame(40002, resolver, &query(0x3333, "www.allowed.test", dns::TYPE_A)));
    let (from, port, msg) = netd.expect("relayed answer", udp_to_guest);
    assert_eq!((from, port), (resolver, 40002));
    let a = dns::parse_answer(&msg).unwrap();
    assert_eq!((a.id, a.rcode), (0x3333, dns::RCODE_NOERROR));
    assert_eq!(a.a_records[0].addr, Ipv4Addr::new(203, 0, 113, 10));
    server.join().unwrap();

    // A connect to that address is judged with the name bound to it.
    let mut guest = Guest::new(netd.guest_fd());
    let h = guest
        .sockets
        .add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 4096]), tcp::SocketBuffer::new(vec![0; 4096])));
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::new(203, 0, 113, 10), 443), 50000).unwrap();
    guest.until("reset", |g| g.sockets.get::<tcp::Socket>(h).state() == tcp::State::Closed);
    let asked = netd.asked.lock().unwrap().clone();
    assert_eq!(asked, [(Ipv4Addr::new(203, 0, 113, 10), vec!["www.allowed.test".to_string()])]);
    drop(guest);
    netd.stop();
}

#[test]
fn dns_over_tcp_is_answered_by_netd() {
    let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
    let up_addr = upstream.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let (n, from) = upstream.recv_from(&mut buf).unwrap();
        let q = dns::parse_query(&buf[..n]).unwrap();
        assert_eq!(q.name, "allowed.test");
        let mut r = Vec::new();
        dns::reply(&buf[..n], &q, dns::RCODE_NOERROR, &mut r);
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 1, 0, 0, 4, 203, 0, 113, 20]);
        upstream.send_to(&r, from).unwrap();
    });
    let netd = Netd::start(NetConfig { upstream_dns: vec![up_addr.to_string()], ..Default::default() }, vec![]);
    let mut guest = Guest::new(netd.guest_fd());
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    // Any address: netd answers port 53 itself, no host connect.
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::new(192, 0, 2, 53), 53), 50020).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let mut framed = Vec::new();
    for q in [query(0x4444, "denied.test", dns::TYPE_A), query(0x5555, "allowed.test", dns::TYPE_A)] {
        framed.extend_from_slice(&(q.len() as u16).to_be_bytes());
        framed.extend_from_slice(&q);
    }
    guest.sockets.get_mut::<tcp::Socket>(h).send_slice(&framed).unwrap();
    let mut got = Vec::new();
    let mut answers = Vec::new();
    guest.until("two answers", |g| {
        let s = g.sockets.get_mut::<tcp::Socket>(h);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        while got.len() >= 2 && got.len() >= 2 + u16::from_be_bytes([got[0], got[1]]) as usize {
            let len = u16::from_be_bytes([got[0], got[1]]) as usize;
            answers.push(dns::parse_answer(&got[2..2 + len]).unwrap());
            got.drain(..2 + len);
        }
        answers.len() == 2
    });
    assert_eq!((answers[0].id, answers[0].rcode), (0x4444, dns::RCODE_NXDOMAIN));
    assert_eq!((answers[1].id, answers[1].rcode), (0x5555, dns::RCODE_NOERROR));
    assert_eq!(answers[1].a_records[0].addr, Ipv4Addr::new(203, 0, 113, 20));
    server.join().unwrap();
    // The client closes; netd closes too.
    guest.sockets.get_mut::<tcp::Socket>(h).close();
    guest.until("closed", |g| {
        matches!(g.sockets.get::<tcp::Socket>(h).state(), tcp::State::TimeWait | tcp::State::Closed)
    });
    drop(guest);
    netd.stop();
}

fn tcp_socket(guest: &mut Guest<'_>) -> smoltcp::iface::SocketHandle {
    guest.sockets.add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 65536]), tcp::SocketBuffer::new(vec![0; 65536])))
}

#[test]
fn a_denied_connect_is_reset_at_once() {
    let netd = Netd::start(NetConfig::default(), vec![]);
    let mut guest = Guest::new(netd.guest_fd());
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (DENIED, 80), 50001).unwrap();
    let mut saw_syn_sent = false;
    guest.until("reset", |g| {
        let s = g.sockets.get::<tcp::Socket>(h).state();
        saw_syn_sent |= s == tcp::State::SynSent;
        assert_ne!(s, tcp::State::Established, "a denied connect never completes");
        s == tcp::State::Closed
    });
    assert!(saw_syn_sent);
    drop(guest);
    netd.stop();
}

#[test]
fn an_allowed_connect_completes_only_when_the_host_side_does_and_data_flows_both_ways() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A port nobody listens on (bound then dropped).
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap(); // until the guest's FIN
        assert_eq!(got, b"hello from the sandbox");
        s.write_all(b"hello from the host").unwrap();
        // Dropping s sends the host's FIN.
    });
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    let mut guest = Guest::new(netd.guest_fd());

    // Nobody listening: the host connect fails, so the sandbox gets a RST, not a SYN-ACK.
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, closed), 50002).unwrap();
    guest.until("refused", |g| {
        let s = g.sockets.get::<tcp::Socket>(h).state();
        assert_ne!(s, tcp::State::Established, "SYN-ACK without a far end");
        s == tcp::State::Closed
    });

    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50003).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let s = guest.sockets.get_mut::<tcp::Socket>(h);
    s.send_slice(b"hello from the sandbox").unwrap();
    s.close(); // half-close: the host sees EOF, and still answers
    let mut got = Vec::new();
    guest.until("the host's answer and FIN", |g| {
        let s = g.sockets.get_mut::<tcp::Socket>(h);
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        !s.may_recv() && matches!(s.state(), tcp::State::TimeWait | tcp::State::Closed)
    });
    assert_eq!(got, b"hello from the host");
    server.join().unwrap();
    drop(guest);
    netd.stop();
}

#[test]
fn resets_are_passed_on_both_ways() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    let mut guest = Guest::new(netd.guest_fd());

    // The host resets (SO_LINGER 0 close): the sandbox's socket is reset.
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50010).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let (s, _) = listener.accept().unwrap();
    let s2 = with_linger0(s);
    drop(s2);
    guest.until("reset by the host", |g| g.sockets.get::<tcp::Socket>(h).state() == tcp::State::Closed);

    // The sandbox resets: the host side reads ECONNRESET, not a clean EOF.
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50011).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let (mut s, _) = listener.accept().unwrap();
    guest.sockets.get_mut::<tcp::Socket>(h).abort();
    guest.poll();
    let mut buf = [0u8; 16];
    let err = s.read(&mut buf).expect_err("a reset, not EOF");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    drop(guest);
    netd.stop();
}

/// `s` with SO_LINGER 0, so that dropping it sends a RST.
fn with_linger0(s: std::net::TcpStream) -> std::net::TcpStream {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: the value is a linger struct that outlives the call, its size is passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    s
}

#[test]
fn quic_and_dns_over_tls_are_refused_unless_an_address_rule_allows() {
    // Loopback is allowed here as if by a domain rule only.
    let netd = Netd::start_with(NetConfig::default(), vec![], vec![Ipv4Addr::LOCALHOST]);
    netd.send(&udp_frame(43000, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 443), b"quic"));
    assert_eq!(netd.expect("UDP/443 refused", icmp_unreachable), 3);
    netd.send(&syn_frame(43001, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 853), 77));
    assert_eq!(netd.expect("TCP/853 reset", rst_to_guest), 78);
    netd.send(&syn_frame(43002, SocketAddrV4::new(plan::GATEWAY_IP, 80), 99));
    assert_eq!(netd.expect("the sandbox's subnet is refused", rst_to_guest), 100);
    // Other UDP to the same address goes.
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(addr) = sink.local_addr().unwrap() else { unreachable!() };
    netd.send(&udp_frame(43003, addr, b"fine"));
    let mut buf = [0u8; 8];
    assert_eq!(sink.recv(&mut buf).unwrap(), 4);
    netd.stop();
}

#[test]
fn flows_past_the_memory_budget_get_small_buffers() {
    // 16 MiB per direction: the 64 MiB budget holds two such flows.
    let limits = NetLimits { tcp_buffer_bytes: 16 << 20, ..Default::default() };
    let netd = Netd::start(NetConfig { limits: Some(limits), ..Default::default() }, vec![Ipv4Addr::LOCALHOST]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(server) = listener.local_addr().unwrap() else { unreachable!() };
    // netd learns the guest's MAC from its ARP request (smoltcp needs it to answer).
    netd.send(&arp_request(plan::GATEWAY_IP));
    netd.expect("ARP reply", arp_reply);
    // NOP, window scale 7: the SYN-ACK's window scale shows netd's buffer.
    let ws = [1, 3, 3, 7];
    let mut scales = Vec::new();
    for i in 0..3u16 {
        netd.send(&syn_frame_with(44000 + i, server, 1000, &ws));
        scales.push(netd.expect("SYN-ACK", syn_ack_window_scale));
    }
    assert_eq!(scales, [Some(9), Some(9), Some(0)], "16 MiB, 16 MiB, then 16 KiB");
    netd.stop();
}

#[test]
fn udp_is_relayed_both_ways() {
    let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = match echo.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..2 {
            let (n, from) = echo.recv_from(&mut buf).unwrap();
            echo.send_to(&buf[..n], from).unwrap();
        }
    });
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    for payload in [&b"ping one"[..], b"ping two"] {
        netd.send(&udp_frame(41000, addr, payload));
        let (from, port, got) = netd.expect("echo", udp_to_guest);
        assert_eq!((from, port, got.as_slice()), (addr, 41000, payload));
    }
    server.join().unwrap();
    // A denied destination: ICMP port unreachable (ECONNREFUSED in the sandbox).
    netd.send(&udp_frame(41001, SocketAddrV4::new(DENIED, 9999), b"x"));
    assert_eq!(netd.expect("port unreachable", icmp_unreachable), 3);
    netd.stop();
}

#[test]
fn past_the_flow_limit_new_flows_are_refused() {
    let limits = NetLimits { max_flows: 2, ..Default::default() };
    let netd = Netd::start(NetConfig { limits: Some(limits), ..Default::default() }, vec![Ipv4Addr::LOCALHOST]);
    let sinks: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    for (i, sink) in sinks.iter().enumerate() {
        let std::net::SocketAddr::V4(addr) = sink.local_addr().unwrap() else { unreachable!() };
        netd.send(&udp_frame(42000 + i as u16, addr, b"flow"));
        if i < 2 {
            let mut buf = [0u8; 16];
            assert_eq!(sink.recv(&mut buf).unwrap(), 4, "flow {i} passes");
        } else {
            assert_eq!(netd.expect("refusal of the third flow", icmp_unreachable), 3);
        }
    }
    // TCP counts too: a connect to a listening server is refused at the limit.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut guest = Guest::new(netd.guest_fd());
    let h = tcp_socket(&mut guest);
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50004).unwrap();
    guest.until("reset at the limit", |g| g.sockets.get::<tcp::Socket>(h).state() == tcp::State::Closed);
    drop(guest);
    netd.stop();
}

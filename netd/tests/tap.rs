//! netd on a real tap (the ns backend's link) with Linux's own stack as the
//! sandbox: a thread enters a private network namespace (root), creates
//! `eth0` as a tap (IFF_TAP | IFF_NO_PI, MTU 65520, 10.0.2.100/24, default
//! route via 10.0.2.2) and hands its fd to netd, which runs in the host's
//! namespace. The sandbox thread's kernel sockets then reach a host server
//! through netd, resolve through it, and are refused by it.
//!
//! The host server listens on the host's own outward address (found with a
//! UDP connect; the test judge ignores that it is the host's). Prints the
//! rate of a 100 MiB download (kernel TCP in the sandbox, smoltcp in netd).
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use pvisor_net::{dns, iface, plan};
use pvisor_netd::Stack;
use pvisor_proto::net::NetConfig;

const TOTAL: usize = 100 << 20;

/// Opens /dev/net/tun as a tap named `eth0` in the calling thread's namespace.
fn tap() -> OwnedFd {
    // SAFETY: open with a constant path and flags; checked below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open /dev/net/tun: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"eth0") {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq we own, valid for the call.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::TUNSETIFF, &mut ifr) };
    assert_eq!(r, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    fd
}

/// The address the host uses outward (its default route's source), if any.
fn host_address() -> Option<Ipv4Addr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("203.0.113.1:9").ok()?;
    match s.local_addr().ok()? {
        SocketAddr::V4(a) if !a.ip().is_loopback() => Some(*a.ip()),
        _ => None,
    }
}

#[test]
fn linux_behind_a_tap_reaches_the_host_through_netd() {
    if !pvisor_testkit::require_root("a private network namespace and /dev/net/tun") {
        return;
    }
    let Some(host) =
        pvisor_testkit::require(host_address(), "the host has no outward IPv4 address to serve the test from")
    else {
        return;
    };
    let listener = TcpListener::bind((host, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");
        let chunk = vec![0x3c_u8; 1 << 20];
        for _ in 0..TOTAL / chunk.len() {
            s.write_all(&chunk).unwrap();
        }
    });

    let (fd_tx, fd_rx) = std::sync::mpsc::channel();
    let sandbox = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace for this thread");
        iface::loopback_up().unwrap();
        let tap = tap();
        iface::configure(plan::IFACE, plan::SANDBOX_IP, plan::PREFIX_LEN, plan::TAP_MTU).unwrap();
        iface::default_route(plan::GATEWAY_IP).unwrap();
        fd_tx.send(tap).unwrap();

        // DNS through netd: a denied name is NXDOMAIN.
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.set_read_timeout(Some(PATIENCE)).unwrap();
        udp.send_to(&query(0x6666, "denied.test", dns::TYPE_A), (plan::DNS_IP, 53)).unwrap();
        let mut buf = [0u8; 512];
        let n = udp.recv(&mut buf).expect("netd's DNS answer");
        let a = dns::parse_answer(&buf[..n]).unwrap();
        assert_eq!((a.id, a.rcode), (0x6666, dns::RCODE_NXDOMAIN));

        // A denied destination: refused at once, no timeout.
        let err =
            TcpStream::connect_timeout(&SocketAddr::from(([198, 51, 100, 7], 80)), PATIENCE).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);

        // The host server: 100 MiB down.
        let mut s = TcpStream::connect((host, port)).expect("connect through netd");
        s.write_all(b"hello").unwrap();
        let start = Instant::now();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        loop {
            match s.read(&mut buf).unwrap() {
                0 => break,
                n => got += n,
            }
        }
        (got, start.elapsed())
    });
    let tap = fd_rx.recv().unwrap();
    let judge = TestJudge { allow: vec![host], by_name: vec![], asked: Asked::default() };
    let netd = std::thread::spawn(move || {
        let mut stack = Stack::new(tap, &NetConfig::default(), Box::new(judge), &[]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        // A tap does not report its sandbox's end going away; the test ends the loop.
        while Instant::now() < deadline && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
            stack.turn().unwrap();
        }
    });
    let (got, took) = sandbox.join().expect("the sandbox thread");
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
    netd.join().unwrap();
    assert_eq!(got, TOTAL);
    println!(
        "tap download (kernel TCP in the sandbox): {} MiB in {:.3} s = {:.2} Gbit/s",
        TOTAL >> 20,
        took.as_secs_f64(),
        TOTAL as f64 * 8.0 / took.as_secs_f64() / 1e9
    );
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

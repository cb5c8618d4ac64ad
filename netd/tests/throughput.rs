//! Throughput through netd on the in-memory frame pipe: a smoltcp guest
//! downloads 100 MiB from a host TCP server on loopback through netd, at the
//! tap's MTU (65520). A benchmark, not a test: it asserts only that every
//! byte arrived, and prints the rate. Both ends' stacks share the machine's
//! cores with the server, so it understates what netd alone can do.
//!
//! `cargo test --release -p pvisor-netd --test throughput -- --ignored --nocapture`
mod common;

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::time::Instant;

use common::*;
use pvisor_proto::net::NetConfig;
use smoltcp::socket::tcp;

const TOTAL: usize = 100 << 20;

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn download_100_mib() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![0x5a_u8; 1 << 20];
        for _ in 0..TOTAL / chunk.len() {
            s.write_all(&chunk).unwrap();
        }
    });
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    let mut guest = Guest::new(netd.guest_fd());
    let h = guest
        .sockets
        .add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 1 << 20]), tcp::SocketBuffer::new(vec![0; 64 << 10])));
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50000).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let start = Instant::now();
    let mut got = 0usize;
    guest.until("100 MiB and the server's FIN", |g| {
        let s = g.sockets.get_mut::<tcp::Socket>(h);
        while s.can_recv() {
            got += s.recv(|b| (b.len(), b.len())).unwrap();
        }
        !s.may_recv()
    });
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(got, TOTAL);
    println!(
        "netd pipe throughput: {} MiB in {:.3} s = {:.2} Gbit/s",
        TOTAL >> 20,
        secs,
        TOTAL as f64 * 8.0 / secs / 1e9
    );
    server.join().unwrap();
    drop(guest);
    netd.stop();
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn upload_100_mib() {
    use std::io::Read;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            match s.read(&mut buf).unwrap() {
                0 => return total,
                n => total += n,
            }
        }
    });
    let netd = Netd::start(NetConfig::default(), vec![Ipv4Addr::LOCALHOST]);
    let mut guest = Guest::new(netd.guest_fd());
    let h = guest
        .sockets
        .add(tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 64 << 10]), tcp::SocketBuffer::new(vec![0; 1 << 20])));
    let cx = guest.iface.context();
    guest.sockets.get_mut::<tcp::Socket>(h).connect(cx, (Ipv4Addr::LOCALHOST, port), 50001).unwrap();
    guest.until("established", |g| g.sockets.get::<tcp::Socket>(h).may_send());
    let start = Instant::now();
    let mut sent = 0usize;
    let chunk = vec![0xa5_u8; 1 << 16];
    guest.until("100 MiB sent and acknowledged", |g| {
        let s = g.sockets.get_mut::<tcp::Socket>(h);
        while sent < TOTAL && s.can_send() {
            sent += s.send_slice(&chunk[..(TOTAL - sent).min(chunk.len())]).unwrap();
        }
        if sent == TOTAL && s.send_queue() == 0 {
            s.close();
            return true;
        }
        false
    });
    guest.until("closed", |g| {
        !g.sockets.get::<tcp::Socket>(h).is_open() || g.sockets.get::<tcp::Socket>(h).state() == tcp::State::FinWait2
    });
    let got = server.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(got, TOTAL);
    println!("netd pipe upload: {} MiB in {:.3} s = {:.2} Gbit/s", TOTAL >> 20, secs, TOTAL as f64 * 8.0 / secs / 1e9);
    drop(guest);
    netd.stop();
}

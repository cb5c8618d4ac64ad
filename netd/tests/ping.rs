//! ICMP echo through netd's ping socket. Ping sockets need the host's
//! net.ipv4.ping_group_range to include netd's group (here it is "1 0": none),
//! so the test runs netd in a network namespace of its own (per thread, as
//! root) whose ping_group_range it opens; the kernel answers the echo on that
//! namespace's loopback.
mod common;

use std::net::Ipv4Addr;

use common::*;
use pvisor_netd::Stack;
use pvisor_proto::net::NetConfig;

#[test]
fn echo_goes_through_a_ping_socket_where_the_host_allows_it() {
    if !pvisor_testkit::require_root("a private network namespace (unshare CLONE_NEWNET)") {
        return;
    }
    let (guest, link) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let netd = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace for this thread");
        pvisor_net::iface::loopback_up().expect("lo up");
        // /proc/sys/net is the opening thread's network namespace.
        std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647")
            .expect("open ping_group_range in the new namespace");
        let asked = Asked::default();
        let judge = TestJudge { allow: vec![Ipv4Addr::LOCALHOST], by_name: vec![], asked };
        let mut stack = Stack::new(link, &NetConfig::default(), Box::new(judge), &[]).unwrap();
        while !stack.turn().unwrap().link_closed {}
    });
    let frames = Frames::new(guest);
    // Denied destination: dropped, so the first reply is the loopback one.
    frames.send(&echo_request(Ipv4Addr::new(203, 0, 113, 1), 1, b"nobody"));
    frames.send(&echo_request(Ipv4Addr::LOCALHOST, 2, b"anyone home"));
    let (from, seq, data) = frames.expect("echo reply", echo_reply);
    assert_eq!((from, seq, data.as_slice()), (Ipv4Addr::LOCALHOST, 2, &b"anyone home"[..]));
    drop(frames);
    netd.join().unwrap();
}

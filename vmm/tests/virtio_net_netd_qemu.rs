//! End to end through the vm backend's network path: a Linux guest under
//! QEMU (TCG) drives this crate's virtio-net model through the vhost-user
//! back-end; the device's SOCK_SEQPACKET link goes to pvisor-netd's real
//! stack (its library, in a thread); netd reaches ordinary host sockets.
//!
//! The guest configures eth0 as the agent does, resolves a name through
//! netd's resolver (10.0.2.3, relayed to a stand-in upstream DNS server on
//! the host's loopback), gets NXDOMAIN for a denied name, connects to a TCP
//! server on this host by the resolved address, exchanges a line with it,
//! and downloads 4 MiB from a second one (which crosses the device's flow
//! control many times). The judge permits this host's address (the real
//! policy always refuses it) and names under `allowed.test`.
//!
//! Needs the guest kernel (`PVISOR_GUEST_KERNEL`), qemu-system-x86 and
//! busybox-static; without the kernel it prints SKIP (a failure under `PVISOR_TEST_STRICT=1`).

mod qemu;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use pvisor_netd::{Judge, Stack, Verdict};
use pvisor_proto::net::NetConfig;
use pvisor_vmm::devices::virtio::net::Net;
use pvisor_vmm::devices::virtio::vhost_user::net::{serve_net, QEMU_DEVICE_PROPS};
use qemu::{busybox_initramfs, guest_kernel, one};

const GUEST_MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x64];
const MTU: u16 = 65520;
const DOWNLOAD: usize = 4 << 20;
const ALLOWED: &str = "web.allowed.test";

/// Permits flows to this host's address and names under `allowed.test`.
struct HostJudge(Ipv4Addr);

impl Judge for HostJudge {
    fn judge(&self, dst: Ipv4Addr, _names: &[&str], _is_host: bool) -> Verdict {
        let allow = dst == self.0;
        Verdict { allow, by_address_rule: allow, reason: "test" }
    }

    fn decide_name(&self, name: &str) -> bool {
        name.ends_with(".allowed.test")
    }
}

/// This host's IPv4 address on its default route (no packet is sent), or
/// `None` on a host without one.
fn host_address() -> Option<Ipv4Addr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("198.51.100.1:9").ok()?;
    match s.local_addr().ok()? {
        SocketAddr::V4(a) if !a.ip().is_loopback() && !a.ip().is_unspecified() => Some(*a.ip()),
        _ => None,
    }
}

/// A stand-in upstream resolver on loopback: every A question is answered
/// with `answer`, anything else with an empty answer.
fn fake_upstream(answer: Ipv4Addr, stop: Arc<AtomicBool>) -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind upstream");
    sock.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let addr = sock.local_addr().expect("addr");
    let thread = std::thread::spawn(move || {
        let mut asked = 0;
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            let q = &buf[..n];
            if n < 17 {
                continue;
            }
            asked += 1;
            // The question ends after its name's zero label, then qtype and qclass.
            let mut end = 12;
            while end < n && q[end] != 0 {
                end += 1 + usize::from(q[end]);
            }
            let qend = (end + 5).min(n);
            let qtype = u16::from_be_bytes([q[end + 1], q[end + 2]]);
            let mut r = q[..qend].to_vec();
            r[2] = 0x81; // response, RD
            r[3] = 0x80; // RA, NOERROR
            r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
            if qtype == 1 {
                r[7] = 1; // one answer
                r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
                r.extend_from_slice(&answer.octets());
            }
            let _ = sock.send_to(&r, from);
        }
        asked
    });
    (addr, thread)
}

fn init_script(host: Ipv4Addr, echo_port: u16, bulk_port: u16) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t sysfs sysfs /sys
ip link set eth0 up
ip addr add 10.0.2.100/24 dev eth0
ip route add default via 10.0.2.2
# Asked again if a reply came after busybox's timeout (a TCG guest on a busy
# host is slow), as a stub resolver's `attempts` would; the tries are counted.
for try in 1 2 3; do
  ADDR=$(nslookup {ALLOWED} 10.0.2.3 2>/dev/null | awk '/^Address: /{{a=$2}} END{{print a}}')
  [ -n "$ADDR" ] && break
done
echo "PVISOR-RESOLVE-TRIES $try"
echo "PVISOR-RESOLVED $ADDR"
nslookup denied.test 10.0.2.3 >/tmp/denied 2>&1; echo "PVISOR-DENIED-RC $?"
cat /tmp/denied
echo "hello from the guest" | nc -w 20 $ADDR {echo_port} >/tmp/echo 2>&1; echo "PVISOR-ECHO-RC $?"
echo "PVISOR-ECHO $(cat /tmp/echo)"
echo "PVISOR-BULK $(nc -w 60 {host} {bulk_port} </dev/null | wc -c)"
echo PVISOR-INIT-DONE
reboot -f
"#
    )
}

#[test]
fn linux_guest_resolves_and_connects_through_netd() {
    let Some(kernel) = guest_kernel() else { return };
    let Some(host) =
        pvisor_testkit::require(host_address(), "this host has no IPv4 address on a default route for netd to reach")
    else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (upstream, dns_thread) = fake_upstream(host, stop.clone());

    // The host's servers: a line echo (with a greeting) and a bulk sender.
    let echo = TcpListener::bind((host, 0)).expect("bind echo");
    let bulk = TcpListener::bind((host, 0)).expect("bind bulk");
    let (echo_port, bulk_port) = (echo.local_addr().unwrap().port(), bulk.local_addr().unwrap().port());
    let echo_thread = std::thread::spawn(move || {
        let (conn, peer) = echo.accept().expect("echo accept");
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line).expect("read line");
        (&conn).write_all(format!("host got: {}", line).as_bytes()).expect("reply");
        (peer, line)
    });
    let bulk_thread = std::thread::spawn(move || {
        let (mut conn, _) = bulk.accept().expect("bulk accept");
        let chunk = vec![0x5au8; 64 * 1024];
        for _ in 0..DOWNLOAD / chunk.len() {
            conn.write_all(&chunk).expect("bulk write");
        }
        // Drain until the guest closes, so the last bytes are not reset away.
        let _ = conn.shutdown(std::net::Shutdown::Write);
        let _ = conn.read_to_end(&mut Vec::new());
    });

    let (dev_end, netd_end) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair");
    let config = NetConfig { upstream_dns: vec![upstream.to_string()], ..Default::default() };
    let mut stack = Stack::new(netd_end, &config, Box::new(HostJudge(host)), &[]).expect("netd stack");
    let netd_stop = stop.clone();
    let netd = std::thread::spawn(move || {
        while !netd_stop.load(Ordering::Relaxed) {
            match stack.turn() {
                Ok(t) if t.link_closed => break,
                Ok(_) => {}
                Err(e) => panic!("netd: {e}"),
            }
        }
        (stack.stats(), stack.describe())
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let initrd = dir.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(&init_script(host, echo_port, bulk_port), &[])).expect("initrd");
    let net = Net::new(dev_end, GUEST_MAC, MTU).expect("net device");
    let sock = dir.path().join("net.sock");
    let server = serve_net("vhost-user-net", net, &sock).expect("serve net");
    let chardev = format!("socket,id=vnet,path={}", sock.display());
    let mac = GUEST_MAC.map(|b| format!("{b:02x}")).join(":");
    let device = format!("virtio-net-device,netdev=net0,mac={mac},host_mtu={MTU},{QEMU_DEVICE_PROPS}");
    let booted = qemu::try_boot(
        &kernel,
        &initrd,
        &[],
        "",
        &[
            "-machine",
            "memory-backend=mem",
            "-global",
            "virtio-mmio.force-legacy=false",
            "-object",
            "memory-backend-memfd,id=mem,size=256M,share=on",
            "-chardev",
            &chardev,
            "-netdev",
            "vhost-user,id=net0,chardev=vnet",
            "-device",
            &device,
        ],
    );
    let (counters, device_state) = server.device().with_device(|d| (d.counters(), d.describe()));
    let served = server.join();
    stop.store(true, Ordering::Relaxed);
    let (stats, netd_state) = netd.join().expect("netd thread");
    let asked = dns_thread.join().expect("dns thread");
    let state =
        format!("{counters:?}\n{device_state}\n{stats:?}\n{netd_state}upstream asked {asked}\nserver: {served:?}");
    let console = booted.unwrap_or_else(|failure| panic!("{failure}\n--- device, netd ---\n{state}"));
    let context = format!("{state}\n{console}");

    assert_eq!(one(&console, "PVISOR-RESOLVED "), host.to_string(), "the name resolved through netd\n{context}");
    assert_ne!(one(&console, "PVISOR-DENIED-RC "), "0", "a denied name is NXDOMAIN\n{context}");
    assert_eq!(one(&console, "PVISOR-ECHO-RC "), "0", "{context}");
    assert_eq!(one(&console, "PVISOR-ECHO "), "host got: hello from the guest", "{context}");
    let (peer, line) = echo_thread.join().expect("echo thread");
    assert_eq!(line, "hello from the guest\n");
    assert!(!peer.ip().is_loopback() || host.is_loopback(), "netd connected from a host socket: {peer}");
    assert_eq!(one(&console, "PVISOR-BULK "), DOWNLOAD.to_string(), "the download arrived whole\n{context}");
    bulk_thread.join().expect("bulk thread");
    assert!(asked >= 1, "the allowed name went upstream\n{context}");
    assert_eq!((counters.tx_dropped, counters.rx_dropped, counters.bad_chains), (0, 0, 0), "{context}");
    assert!(counters.rx_bytes >= DOWNLOAD as u64, "{context}");
}

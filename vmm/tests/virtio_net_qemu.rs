//! A Linux guest under QEMU (TCG, `-M microvm`) driving this crate's
//! virtio-net model through the vhost-user back-end, with the test playing
//! netd on the other end of the SOCK_SEQPACKET socketpair: it answers ARP
//! for the gateway and ICMP echo, from raw frames.
//!
//! The guest (busybox) reads the MTU and MAC the device offered, configures
//! eth0 as the agent does (10.0.2.100/24, default route via 10.0.2.2), pings
//! the gateway with small packets and with 60000-byte ones: one frame each
//! way (no fragmentation at MTU 65520), which the guest receives through
//! several mergeable rx buffers.
//!
//! Needs the guest kernel (`PVISOR_GUEST_KERNEL`, scripts/guest-kernel.sh),
//! qemu-system-x86 and busybox-static; without the kernel it prints SKIP
//! (a failure under CI).

mod qemu;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{recv, send, setsockopt, socketpair, sockopt, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::sys::time::TimeVal;
use pvisor_vmm::devices::virtio::net::Net;
use pvisor_vmm::devices::virtio::vhost_user::net::{serve_net, QEMU_DEVICE_PROPS};
use qemu::{busybox_initramfs, guest_kernel, one};

/// The addressing plan (pvisor_net::plan).
const GUEST_MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x64];
const GATEWAY_MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x02];
const GATEWAY_IP: [u8; 4] = [10, 0, 2, 2];
const MTU: u16 = 65520;

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t sysfs sysfs /sys
echo "PVISOR-NET-MTU $(cat /sys/class/net/eth0/mtu)"
echo "PVISOR-NET-MAC $(cat /sys/class/net/eth0/address)"
ip link set eth0 up
ip addr add 10.0.2.100/24 dev eth0
ip route add default via 10.0.2.2
ping -c 3 -W 10 10.0.2.2 >/tmp/small 2>&1; echo "PVISOR-PING $?"
cat /tmp/small
ping -c 2 -W 10 -s 60000 10.0.2.2 >/tmp/big 2>&1; echo "PVISOR-BIGPING $?"
cat /tmp/big
echo "PVISOR-RX-DROPPED $(cat /sys/class/net/eth0/statistics/rx_dropped) $(cat /sys/class/net/eth0/statistics/rx_length_errors)"
echo PVISOR-INIT-DONE
reboot -f
"#;

/// What the fake netd saw.
#[derive(Default, Debug)]
struct Seen {
    arp_requests: usize,
    echo_requests: usize,
    largest_frame: usize,
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The answer to `frame`, if it is ARP for the gateway or ICMP echo to it.
fn answer(frame: &[u8], seen: &mut Seen) -> Option<Vec<u8>> {
    seen.largest_frame = seen.largest_frame.max(frame.len());
    if frame.len() < 14 || frame[0..6] != [0xff; 6] && frame[0..6] != GATEWAY_MAC {
        return None;
    }
    let src_mac: [u8; 6] = frame[6..12].try_into().ok()?;
    match u16::from_be_bytes([frame[12], frame[13]]) {
        // ARP request (Ethernet/IPv4) for the gateway's address.
        0x0806 if frame.len() >= 42 && frame[20..22] == [0, 1] && frame[38..42] == GATEWAY_IP => {
            seen.arp_requests += 1;
            let mut r = Vec::with_capacity(42);
            r.extend_from_slice(&src_mac);
            r.extend_from_slice(&GATEWAY_MAC);
            r.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
            r.extend_from_slice(&GATEWAY_MAC);
            r.extend_from_slice(&GATEWAY_IP);
            r.extend_from_slice(&frame[22..32]); // the asker's MAC and IP
            Some(r)
        }
        0x0800 if frame.len() >= 34 => {
            let ihl = usize::from(frame[14] & 0x0f) * 4;
            let ip = &frame[14..];
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            if ip[9] != 1 || ip[16..20] != GATEWAY_IP || total > ip.len() || total < ihl + 8 {
                return None;
            }
            let icmp = &ip[ihl..total];
            if icmp[0] != 8 {
                return None;
            }
            seen.echo_requests += 1;
            let mut r = Vec::with_capacity(14 + total);
            r.extend_from_slice(&src_mac);
            r.extend_from_slice(&GATEWAY_MAC);
            r.extend_from_slice(&[0x08, 0x00]);
            let mut reply_ip = ip[..total].to_vec();
            reply_ip[12..16].copy_from_slice(&ip[16..20]);
            reply_ip[16..20].copy_from_slice(&ip[12..16]);
            reply_ip[10..12].copy_from_slice(&[0, 0]);
            let sum = checksum(&reply_ip[..ihl]);
            reply_ip[10..12].copy_from_slice(&sum.to_be_bytes());
            reply_ip[ihl] = 0; // echo reply
            reply_ip[ihl + 2..ihl + 4].copy_from_slice(&[0, 0]);
            let sum = checksum(&reply_ip[ihl..]);
            reply_ip[ihl + 2..ihl + 4].copy_from_slice(&sum.to_be_bytes());
            r.extend_from_slice(&reply_ip);
            Some(r)
        }
        _ => None,
    }
}

/// Plays netd on `peer` until `stop` is set.
fn fake_netd(peer: OwnedFd, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    setsockopt(&peer, sockopt::ReceiveTimeout, &TimeVal::new(0, 200_000)).expect("SO_RCVTIMEO");
    let mut buf = vec![0u8; 70_000];
    while !stop.load(Ordering::Relaxed) {
        let n = match recv(peer.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
            Err(e) => panic!("fake netd recv: {e}"),
        };
        let reply = answer(&buf[..n], &mut seen.lock().expect("seen"));
        if let Some(reply) = reply {
            send(peer.as_raw_fd(), &reply, MsgFlags::empty()).expect("fake netd send");
        }
    }
}

#[test]
fn linux_guest_pings_through_vhost_user_net() {
    let Some(kernel) = guest_kernel() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let initrd = dir.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(INIT, &[])).expect("write initrd");

    let (dev_end, peer) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair");
    let net = Net::new(dev_end, GUEST_MAC, MTU).expect("net device");
    let sock = dir.path().join("net.sock");
    let server = serve_net("vhost-user-net", net, &sock).expect("serve net");
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let netd = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || fake_netd(peer, stop, seen))
    };

    let chardev = format!("socket,id=vnet,path={}", sock.display());
    let mac = GUEST_MAC.map(|b| format!("{b:02x}")).join(":");
    let device = format!("virtio-net-device,netdev=net0,mac={mac},host_mtu={MTU},{QEMU_DEVICE_PROPS}");
    let console = qemu::boot(
        &kernel,
        &initrd,
        &[],
        "",
        &[
            "-machine",
            "memory-backend=mem",
            // A virtio 1.x transport, as under the project's VMM (QEMU's
            // virtio-mmio is legacy by default).
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
    stop.store(true, Ordering::Relaxed);
    netd.join().expect("fake netd");
    let (counters, acked) = server.device().with_device(|d| (d.counters(), d.acked_features()));
    let served = server.join();
    let seen = seen.lock().expect("seen");
    let context = format!("{seen:?}\n{counters:?}\nserver: {served:?}\n--- console ---\n{console}");

    assert_eq!(one(&console, "PVISOR-NET-MTU "), MTU.to_string(), "the MTU the device offered\n{context}");
    assert_eq!(one(&console, "PVISOR-NET-MAC "), mac, "{context}");
    assert_eq!(one(&console, "PVISOR-PING "), "0", "small pings answered\n{context}");
    assert_eq!(one(&console, "PVISOR-BIGPING "), "0", "60000-byte pings answered\n{context}");
    assert!(seen.arp_requests >= 1, "{context}");
    assert!(seen.echo_requests >= 5, "{context}");
    assert!(seen.largest_frame >= 14 + 20 + 8 + 60000, "a big ping is one frame at this MTU\n{context}");
    assert_eq!(one(&console, "PVISOR-RX-DROPPED "), "0 0", "{context}");
    assert!(counters.rx_frames >= 6 && counters.tx_frames >= 6, "{context}");
    assert_eq!((counters.tx_dropped, counters.rx_dropped, counters.bad_chains), (0, 0, 0), "{context}");
    assert_ne!(acked & 1 << 32, 0, "the guest drove a virtio 1.x device (VERSION_1)\n{context}");
    assert_ne!(acked & 1 << 15, 0, "and took MRG_RXBUF\n{context}");
    assert!(served.is_ok(), "the back-end ends cleanly when qemu exits\n{context}");
}

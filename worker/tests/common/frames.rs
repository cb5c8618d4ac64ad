//! Hand-built frames for the worker's tests that talk to the real netd over a
//! SOCK_SEQPACKET link (as the vm backend's virtio-net device does): a DNS
//! question from the sandbox in an Ethernet/IPv4/UDP frame, the answer read
//! back, and a stand-in upstream resolver on the host's loopback.
#![allow(dead_code)]
use pvisor_net::plan;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

/// A DNS question for `name` (type A, recursion desired).
pub fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The answer to `query` with one A record `addr`.
pub fn dns_answer(query: &[u8], addr: Ipv4Addr) -> Vec<u8> {
    let mut a = query.to_vec();
    a[2..4].copy_from_slice(&[0x81, 0x80]);
    a[6..8].copy_from_slice(&[0, 1]);
    a.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
    a.extend_from_slice(&addr.octets());
    a
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A UDP datagram from the sandbox's `src_port` to `dst` (UDP checksum 0:
/// none, which IPv4 allows).
pub fn udp_frame(src_port: u16, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload.len());
    f.extend_from_slice(&plan::GATEWAY_MAC);
    f.extend_from_slice(&plan::GUEST_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&plan::SANDBOX_IP.octets());
    ip.extend_from_slice(&dst.ip().octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&src_port.to_be_bytes());
    f.extend_from_slice(&dst.port().to_be_bytes());
    f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// The UDP payload of a frame netd sent the sandbox to `port`, if it is one.
pub fn udp_payload_to(frame: &[u8], port: u16) -> Option<&[u8]> {
    if frame.len() < 42 || frame[12..14] != [0x08, 0x00] || frame[23] != 17 {
        return None;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let udp = frame.get(14 + ihl..)?;
    (udp.len() >= 8 && u16::from_be_bytes([udp[2], udp[3]]) == port).then(|| &udp[8..])
}

/// A DNS message's response code.
pub fn rcode(msg: &[u8]) -> u8 {
    msg[3] & 0x0f
}

/// A resolver on `sock` that answers every question for `name` with
/// `addr`, NXDOMAIN otherwise, from a thread of its own; returns its address.
/// (netd's upstream is not judged, it is the operator's: one on the host's
/// loopback serves too.)
pub fn stand_in_upstream(sock: UdpSocket, name: &'static str, addr: Ipv4Addr) -> String {
    let at = sock.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let wanted = dns_query(0, name);
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let q = &buf[..n];
            let answer = match q.len() >= wanted.len() && q[12..wanted.len()] == wanted[12..] {
                true => dns_answer(q, addr),
                false => {
                    let mut a = q.to_vec();
                    a[2..4].copy_from_slice(&[0x81, 0x83]);
                    a
                }
            };
            let _ = sock.send_to(&answer, from);
        }
    });
    at
}

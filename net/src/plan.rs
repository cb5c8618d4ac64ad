//! The addressing plan of every sandbox (the same in all of them; sandboxes
//! never see each other, so there is nothing to allocate).
//!
//! The sandbox is `10.0.2.100/24` on `eth0`; netd answers as the gateway
//! `10.0.2.2` and the resolver `10.0.2.3` (and, for DNS, any address on port 53).
use std::net::Ipv4Addr;

pub const IFACE: &str = "eth0";
pub const SANDBOX_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
pub const PREFIX_LEN: u8 = 24;
pub const GATEWAY_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
pub const DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// netd's Ethernet address (locally administered).
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x02];
/// The vm guest's Ethernet address (a tap picks its own).
pub const GUEST_MAC: [u8; 6] = [0x02, 0x70, 0x76, 0x00, 0x00, 0x64];
/// MTU of the ns backend's tap (large frames: fewer trips through netd).
pub const TAP_MTU: u32 = 65520;

/// `/etc/resolv.conf` of a sandbox.
pub fn resolv_conf() -> String {
    format!("# written by pvisor: the sandbox's resolver is its network process\nnameserver {DNS_IP}\noptions edns0 trust-ad\n")
}

/// `/etc/hosts` of a sandbox named `hostname`.
pub fn hosts(hostname: &str) -> String {
    format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{SANDBOX_IP}\t{hostname}\n")
}

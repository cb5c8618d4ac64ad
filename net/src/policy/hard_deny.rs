//! The destinations no policy can open, and the private ranges only an
//! explicit IP/CIDR rule can.
//!
//! Hard deny protects the host and its neighbours whatever the sandbox's
//! owner writes: "this" network, loopback, link-local (cloud metadata at
//! 169.254.169.254), multicast, broadcast and the reserved 240/4, their IPv6
//! equivalents, and the host's own addresses (netd knows them). Private
//! ranges (RFC 1918, CGNAT 100.64/10, IPv6 ULA and link-local) are where
//! internal services live: a domain rule or the default action never reaches
//! them, so a name that resolves to 10.0.0.5 (DNS rebinding) stays refused.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::cidr::unmap;

/// Where a destination falls before any rule is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Never allowed; the reason names the range.
    HardDeny(&'static str),
    /// Allowed only by an IP or CIDR allow rule.
    Private,
    /// Up to the rules and the default.
    Public,
}

/// The class of `ip` (IPv4-mapped IPv6 is classed as its IPv4 address).
pub fn classify(ip: IpAddr) -> Class {
    match unmap(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    let [a, b, ..] = ip.octets();
    if a == 0 {
        Class::HardDeny("\"this\" network 0.0.0.0/8")
    } else if a == 127 {
        Class::HardDeny("loopback 127.0.0.0/8")
    } else if a == 169 && b == 254 {
        Class::HardDeny("link-local 169.254.0.0/16")
    } else if (224..240).contains(&a) {
        Class::HardDeny("multicast 224.0.0.0/4")
    } else if a >= 240 {
        // 255.255.255.255 (broadcast) included.
        Class::HardDeny("reserved 240.0.0.0/4")
    } else if is_private_v4(a, b) {
        Class::Private
    } else {
        Class::Public
    }
}

/// RFC 1918 (10/8, 172.16/12, 192.168/16) and CGNAT 100.64/10.
fn is_private_v4(a: u8, b: u8) -> bool {
    a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168) || (a == 100 && (64..128).contains(&b))
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Class::HardDeny("unspecified ::")
    } else if ip.is_loopback() {
        Class::HardDeny("loopback ::1")
    } else if first & 0xff00 == 0xff00 {
        Class::HardDeny("multicast ff00::/8")
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfe80 || first & 0xffc0 == 0xfec0 {
        // Unique local fc00::/7, link-local fe80::/10, deprecated site-local fec0::/10.
        Class::Private
    } else {
        Class::Public
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Class {
        classify(s.parse().expect("test address"))
    }

    #[test]
    fn hard_deny_table() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(matches!(class(s), Class::HardDeny(_)), "{s}: {:?}", class(s));
        }
    }

    #[test]
    fn private_ranges() {
        for s in [
            "10.0.0.5",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(class(s), Class::Private, "{s}");
        }
    }

    #[test]
    fn public_addresses() {
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "192.169.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "203.0.113.10",
            "198.51.100.53",
            "192.0.2.1",
            "2001:db8::1",
            "2606:4700::1111",
        ] {
            assert_eq!(class(s), Class::Public, "{s}");
        }
    }
}

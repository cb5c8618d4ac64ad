//! Whether an address is one of the host's own (always refused): netd tries
//! to bind a UDP socket to it; EADDRNOTAVAIL means it is not. Answers are
//! cached briefly (addresses come and go rarely, flows start often).
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

const CACHE_FOR: Duration = Duration::from_secs(10);
const MAX_ENTRIES: usize = 4096;

#[derive(Default)]
pub struct HostAddrs {
    cache: HashMap<Ipv4Addr, (bool, Instant)>,
}

impl HostAddrs {
    pub fn is_host(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        if let Some(&(is, at)) = self.cache.get(&ip) {
            if now.duration_since(at) < CACHE_FOR {
                return is;
            }
        }
        let is = probe(ip);
        if self.cache.len() >= MAX_ENTRIES {
            self.cache.clear();
        }
        self.cache.insert(ip, (is, now));
        is
    }
}

fn probe(ip: Ipv4Addr) -> bool {
    match UdpSocket::bind(SocketAddrV4::new(ip, 0)) {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => false,
        // Anything else (out of fds, ...): fail closed.
        Err(e) => e.kind() != io::ErrorKind::AddrNotAvailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_ours_documentation_addresses_are_not() {
        let mut h = HostAddrs::default();
        assert!(h.is_host(Ipv4Addr::LOCALHOST, Instant::now()));
        assert!(!h.is_host(Ipv4Addr::new(203, 0, 113, 77), Instant::now()));
    }
}

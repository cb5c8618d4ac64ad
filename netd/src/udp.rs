//! UDP flows: one connected host socket per (sandbox port, destination),
//! expired after 60 s without traffic. Datagrams are parsed and emitted by
//! hand (frames.rs); smoltcp never sees UDP.
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use smoltcp::wire::EthernetAddress;

/// A flow without traffic in either direction for this long is closed.
pub const IDLE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub guest: SocketAddrV4,
    pub remote: SocketAddrV4,
}

pub struct Flow {
    pub key: Key,
    pub mac: EthernetAddress,
    pub sock: UdpSocket,
    pub last: Instant,
}

/// The flow table (slots index mio tokens).
pub type Flows = crate::slots::Slots<Flow>;

impl crate::slots::Keyed for Flow {
    type Key = Key;
    fn key(&self) -> Key {
        self.key
    }
}

/// Slots of flows idle since before `now - IDLE`.
pub fn idle(flows: &Flows, now: Instant) -> Vec<usize> {
    flows.select(|f| now.duration_since(f.last) >= IDLE)
}

/// A token bucket: at most `rate` datagrams per second, bursts up to `rate`.
pub struct RateLimit {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    pub fn new(rate: u32, now: Instant) -> RateLimit {
        RateLimit { rate: f64::from(rate), tokens: f64::from(rate), at: now }
    }

    /// Takes one token; false when the sandbox is over its rate.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_refills() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(3, t0);
        assert!(r.take(t0) && r.take(t0) && r.take(t0));
        assert!(!r.take(t0));
        assert!(r.take(t0 + Duration::from_millis(400)));
    }
}

//! UDP flows: one connected host socket per (sandbox port, destination),
//! expired after 60 s without traffic. Datagrams are parsed and emitted by
//! hand (frames.rs); smoltcp never sees UDP.
use std::collections::HashMap;
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

#[derive(Default)]
pub struct Flows {
    slots: Vec<Option<Flow>>,
    free: Vec<usize>,
    by_key: HashMap<Key, usize>,
}

impl Flows {
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn find(&self, key: &Key) -> Option<usize> {
        self.by_key.get(key).copied()
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Flow> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    pub fn next_slot(&self) -> usize {
        self.free.last().copied().unwrap_or(self.slots.len())
    }

    pub fn insert(&mut self, flow: Flow) -> usize {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.by_key.insert(flow.key, slot);
        self.slots[slot] = Some(flow);
        slot
    }

    pub fn remove(&mut self, slot: usize) -> Option<Flow> {
        let flow = self.slots.get_mut(slot)?.take()?;
        self.by_key.remove(&flow.key);
        self.free.push(slot);
        Some(flow)
    }

    /// Slots of flows idle since before `now - IDLE`.
    pub fn idle(&self, now: Instant) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.as_ref().filter(|f| now.duration_since(f.last) >= IDLE).map(|_| i))
            .collect()
    }
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

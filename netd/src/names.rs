//! The names DNS bound to addresses for this sandbox: what a domain rule is
//! matched against when a flow to that address starts.
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Bound (address, name) pairs kept at most; past it the oldest expire first
/// (a sandbox resolving endlessly cannot grow netd).
const MAX_BINDINGS: usize = 8192;

#[derive(Default)]
pub struct Names {
    by_addr: HashMap<Ipv4Addr, Vec<(String, Instant)>>,
    count: usize,
}

impl Names {
    /// Binds `addr` to `name` until `now + ttl` (extending an existing binding).
    pub fn bind(&mut self, addr: Ipv4Addr, name: &str, ttl: Duration, now: Instant) {
        let until = now + ttl;
        if self.count >= MAX_BINDINGS {
            self.expire(now);
            if self.count >= MAX_BINDINGS {
                return;
            }
        }
        let entry = self.by_addr.entry(addr).or_default();
        match entry.iter_mut().find(|(n, _)| n == name) {
            Some((_, t)) => *t = (*t).max(until),
            None => {
                entry.push((name.to_string(), until));
                self.count += 1;
            }
        }
    }

    /// The unexpired names bound to `addr`.
    pub fn lookup(&self, addr: Ipv4Addr, now: Instant) -> Vec<&str> {
        self.by_addr
            .get(&addr)
            .map(|v| v.iter().filter(|(_, t)| *t > now).map(|(n, _)| n.as_str()).collect())
            .unwrap_or_default()
    }

    /// Drops expired bindings.
    pub fn expire(&mut self, now: Instant) {
        let mut count = 0;
        self.by_addr.retain(|_, v| {
            v.retain(|(_, t)| *t > now);
            count += v.len();
            !v.is_empty()
        });
        self.count = count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_expire() {
        let mut n = Names::default();
        let t0 = Instant::now();
        let a = Ipv4Addr::new(203, 0, 113, 10);
        n.bind(a, "x.test", Duration::from_secs(60), t0);
        n.bind(a, "y.test", Duration::from_secs(120), t0);
        assert_eq!(n.lookup(a, t0 + Duration::from_secs(1)), ["x.test", "y.test"]);
        assert_eq!(n.lookup(a, t0 + Duration::from_secs(61)), ["y.test"]);
        n.expire(t0 + Duration::from_secs(121));
        assert!(n.lookup(a, t0).is_empty());
    }
}

//! A private stand-in for `pvisor_net::policy` (written in parallel by the
//! policy helper), with the API its module docs promise, so netd can be built
//! and tested before it lands. IPv4 only; to be replaced by the real module.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use pvisor_proto::net as pb;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: u32,
    len: u8,
}

#[derive(Debug)]
pub struct PolicyError(String);

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, PolicyError> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().map_err(|_| PolicyError(format!("bad prefix in {s:?}")))?),
            None => (s, 32),
        };
        let addr: Ipv4Addr = addr.parse().map_err(|_| PolicyError(format!("not an IPv4 address or CIDR: {s:?}")))?;
        if len > 32 {
            return Err(PolicyError(format!("bad prefix in {s:?}")));
        }
        Ok(Cidr { net: u32::from(addr) & mask(len), len })
    }

    const fn new(a: [u8; 4], len: u8) -> Cidr {
        Cidr { net: u32::from_be_bytes(a), len }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == self.net
    }
}

const fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - len as u32)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Cidr(Cidr),
    Domain { name: String, wildcard: bool },
}

#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    target: Target,
}

#[derive(Debug, Clone)]
pub struct Policy {
    default_action: Action,
    egress: Vec<Rule>,
}

fn action(a: i32) -> Action {
    if a == pb::Action::Allow as i32 {
        Action::Allow
    } else {
        Action::Deny
    }
}

impl Policy {
    pub fn from_proto(p: &pb::EgressPolicy) -> Result<Policy, PolicyError> {
        let mut egress = Vec::new();
        for r in &p.egress {
            let t = r.target.trim().to_ascii_lowercase();
            let target =
                if t.starts_with(|c: char| c.is_ascii_digit()) && !t.contains(|c: char| c.is_ascii_alphabetic()) {
                    Target::Cidr(Cidr::parse(&t)?)
                } else if t.contains(':') {
                    continue; // IPv6: netd is v4 only.
                } else if let Some(base) = t.strip_prefix("*.") {
                    Target::Domain { name: base.to_string(), wildcard: true }
                } else {
                    Target::Domain { name: t, wildcard: false }
                };
            egress.push(Rule { action: action(r.action), target });
        }
        Ok(Policy { default_action: action(p.default_action), egress })
    }

    pub fn decide_name(&self, name: &str) -> Action {
        self.egress
            .iter()
            .find(|r| matches!(&r.target, Target::Domain { .. }) && domain_matches(&r.target, name))
            .map_or(self.default_action, |r| r.action)
    }

    /// Whether the first address rule matching `ip` allows it.
    pub fn allowed_by_address_rule(&self, ip: IpAddr) -> bool {
        let IpAddr::V4(ip) = ip else { return false };
        self.egress
            .iter()
            .find(|r| matches!(r.target, Target::Cidr(c) if c.contains(ip)))
            .is_some_and(|r| r.action == Action::Allow)
    }
}

fn domain_matches(t: &Target, name: &str) -> bool {
    match t {
        Target::Domain { name: base, wildcard: false } => name == base,
        Target::Domain { name: base, wildcard: true } => {
            name.len() > base.len() + 1
                && name.ends_with(base.as_str())
                && name.as_bytes()[name.len() - base.len() - 1] == b'.'
        }
        Target::Cidr(_) => false,
    }
}

pub struct Judgement {
    pub allow: bool,
    pub reason: &'static str,
}

const HARD_DENY: &[Cidr] = &[
    Cidr::new([0, 0, 0, 0], 8),
    Cidr::new([127, 0, 0, 0], 8),
    Cidr::new([169, 254, 0, 0], 16),
    Cidr::new([224, 0, 0, 0], 4),
    Cidr::new([240, 0, 0, 0], 4),
];
const PRIVATE: &[Cidr] = &[
    Cidr::new([10, 0, 0, 0], 8),
    Cidr::new([172, 16, 0, 0], 12),
    Cidr::new([192, 168, 0, 0], 16),
    Cidr::new([100, 64, 0, 0], 10),
];

pub fn judge(p: &Policy, extra_deny: &[Cidr], dst: IpAddr, names: &[&str], is_host: bool) -> Judgement {
    let IpAddr::V4(ip) = dst else { return Judgement { allow: false, reason: "IPv6" } };
    if HARD_DENY.iter().chain(extra_deny).any(|c| c.contains(ip)) || is_host {
        return Judgement { allow: false, reason: "always denied" };
    }
    let private = PRIVATE.iter().any(|c| c.contains(ip));
    for r in &p.egress {
        let hit = match &r.target {
            Target::Cidr(c) => c.contains(ip),
            t => !private && names.iter().any(|n| domain_matches(t, n)),
        };
        if hit {
            return Judgement { allow: r.action == Action::Allow, reason: "rule" };
        }
    }
    if private {
        return Judgement { allow: false, reason: "private range without an address rule" };
    }
    Judgement { allow: p.default_action == Action::Allow, reason: "default action" }
}

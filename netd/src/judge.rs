//! The decisions netd asks for: may a new flow go to this address, may this
//! name be resolved.
//!
//! [`Judge`] is a trait so that tests can permit what the real policy always
//! refuses (a loopback test server); the process uses [`PolicyJudge`], the
//! sandbox's egress policy plus the configured extra deny list.
use std::net::{IpAddr, Ipv4Addr};

use pvisor_proto::net::{EgressPolicy, NetConfig};

use crate::standin as policy;

/// The answer for one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allow: bool,
    /// Whether an IP or CIDR rule (not a domain rule, not the default)
    /// allowed it: what UDP/443 (QUIC) needs.
    pub by_address_rule: bool,
    pub reason: &'static str,
}

impl Verdict {
    pub const fn deny(reason: &'static str) -> Verdict {
        Verdict { allow: false, by_address_rule: false, reason }
    }
}

/// What netd consults for every new flow and every DNS question.
pub trait Judge: Send {
    /// Whether a new flow to `dst` may go, given the names DNS bound to `dst`
    /// and whether `dst` is one of the host's own addresses.
    fn judge(&self, dst: Ipv4Addr, names: &[&str], is_host: bool) -> Verdict;
    /// Whether a DNS question for `name` is resolved (else NXDOMAIN).
    fn decide_name(&self, name: &str) -> bool;
}

/// Builds the judge of a policy (the process's, and after every `policy`
/// control message).
pub trait JudgeFactory {
    fn make(&self, policy: &EgressPolicy, config: &NetConfig) -> Result<Box<dyn Judge>, String>;
}

/// The sandbox's egress policy, as the broker normalised it.
pub struct PolicyJudge {
    policy: policy::Policy,
    extra_deny: Vec<policy::Cidr>,
}

impl PolicyJudge {
    pub fn new(p: &EgressPolicy, config: &NetConfig) -> Result<PolicyJudge, String> {
        let policy = policy::Policy::from_proto(p).map_err(|e| e.to_string())?;
        let extra_deny =
            config.deny.iter().map(|d| policy::Cidr::parse(d).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
        Ok(PolicyJudge { policy, extra_deny })
    }
}

impl Judge for PolicyJudge {
    fn judge(&self, dst: Ipv4Addr, names: &[&str], is_host: bool) -> Verdict {
        let j = policy::judge(&self.policy, &self.extra_deny, IpAddr::V4(dst), names, is_host);
        let by_address_rule = j.allow && self.policy.allowed_by_address_rule(IpAddr::V4(dst));
        Verdict { allow: j.allow, by_address_rule, reason: j.reason }
    }

    fn decide_name(&self, name: &str) -> bool {
        self.policy.decide_name(name) == policy::Action::Allow
    }
}

/// [`PolicyJudge`] for every policy.
pub struct PolicyJudges;

impl JudgeFactory for PolicyJudges {
    fn make(&self, policy: &EgressPolicy, config: &NetConfig) -> Result<Box<dyn Judge>, String> {
        Ok(Box::new(PolicyJudge::new(policy, config)?))
    }
}

//! The decisions netd asks for: may a new flow go to this address, may this
//! name be resolved.
//!
//! [`Judge`] is a trait so that tests can permit what the real policy always
//! refuses (a loopback test server); the process uses [`PolicyJudge`], the
//! sandbox's egress policy plus the configured extra deny list.
use std::net::{IpAddr, Ipv4Addr};

use pvisor_proto::net::{EgressPolicy, NetConfig};

use pvisor_net::policy;

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
        let extra_deny = config
            .deny
            .iter()
            .map(|d| policy::Cidr::parse_ip_or_cidr(d).ok_or_else(|| format!("deny entry {d:?} is no IP or CIDR")))
            .collect::<Result<_, _>>()?;
        Ok(PolicyJudge { policy, extra_deny })
    }
}

impl Judge for PolicyJudge {
    fn judge(&self, dst: Ipv4Addr, names: &[&str], is_host: bool) -> Verdict {
        let j = policy::judge(&self.policy, &self.extra_deny, IpAddr::V4(dst), names, is_host);
        let by_address_rule = j.allow && allowed_by_address_rule(&self.policy, IpAddr::V4(dst));
        Verdict { allow: j.allow, by_address_rule, reason: j.reason }
    }

    fn decide_name(&self, name: &str) -> bool {
        self.policy.decide_name(name) == policy::Action::Allow
    }
}

/// Whether the first IP or CIDR rule matching `dst` allows it (UDP/443, QUIC,
/// is opened by such a rule only, never by a domain rule or the default).
fn allowed_by_address_rule(p: &policy::Policy, dst: IpAddr) -> bool {
    p.egress
        .iter()
        .find(|r| !r.target.is_domain() && r.target.matches_ip(dst))
        .is_some_and(|r| r.action == policy::Action::Allow)
}

/// [`PolicyJudge`] for every policy.
pub struct PolicyJudges;

impl JudgeFactory for PolicyJudges {
    fn make(&self, policy: &EgressPolicy, config: &NetConfig) -> Result<Box<dyn Judge>, String> {
        Ok(Box::new(PolicyJudge::new(policy, config)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::net::{Action, EgressRule};

    fn judge(default: Action, rules: &[(Action, &str)], deny: &[&str]) -> PolicyJudge {
        let egress = rules.iter().map(|(a, t)| EgressRule { action: *a as i32, target: t.to_string() }).collect();
        let p = EgressPolicy { default_action: default as i32, egress };
        let config = NetConfig { deny: deny.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        PolicyJudge::new(&p, &config).expect("valid policy")
    }

    #[test]
    fn the_real_policy_decides() {
        let j = judge(
            Action::Deny,
            &[(Action::Allow, "*.allowed.test"), (Action::Allow, "10.1.0.0/16"), (Action::Allow, "203.0.113.5")],
            &["203.0.113.99"],
        );
        let public = Ipv4Addr::new(203, 0, 113, 10);
        assert!(j.decide_name("a.allowed.test") && !j.decide_name("allowed.test"));
        assert!(j.judge(public, &["a.allowed.test"], false).allow);
        assert!(!j.judge(public, &["a.allowed.test"], false).by_address_rule, "a domain rule does not open QUIC");
        assert!(!j.judge(public, &[], false).allow, "default deny");
        assert!(!j.judge(public, &["a.allowed.test"], true).allow, "host addresses never");
        assert!(!j.judge(Ipv4Addr::LOCALHOST, &["a.allowed.test"], false).allow);
        assert!(!j.judge(Ipv4Addr::new(10, 9, 0, 1), &["a.allowed.test"], false).allow, "no rebinding");
        let v = j.judge(Ipv4Addr::new(10, 1, 2, 3), &[], false);
        assert!(v.allow && v.by_address_rule);
        assert!(j.judge(Ipv4Addr::new(203, 0, 113, 5), &[], false).by_address_rule);
        assert!(!j.judge(Ipv4Addr::new(203, 0, 113, 99), &["a.allowed.test"], false).allow, "operator deny list");
        assert!(PolicyJudge::new(
            &EgressPolicy::default(),
            &NetConfig { deny: vec!["x".into()], ..Default::default() }
        )
        .is_err());
    }
}

//! The decision for one new flow: may the sandbox reach `dst`?
//!
//! In order: the hard-deny table (and the host's own addresses and the
//! operator's extra deny list) refuses; then the rules in list order, first
//! match wins (an IP/CIDR rule matches `dst`, a domain rule matches a name
//! DNS bound to `dst` for this sandbox); then the default action. A private
//! destination is only opened by an IP/CIDR allow rule: domain allow rules
//! are passed over for it and the default action does not apply to it.
//!
//! This differs from OpenSandbox, which checks every IP deny before any IP
//! allow; here the list order decides for IPs as it does for names.
use std::net::IpAddr;

use super::cidr::Cidr;
use super::hard_deny::{classify, Class};
use super::rule::{Action, Target};
use super::Policy;

/// The verdict and why (for netd's log and counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    pub allow: bool,
    pub reason: &'static str,
}

impl Judgement {
    fn new(action: Action, reason: &'static str) -> Judgement {
        Judgement { allow: action == Action::Allow, reason }
    }

    fn deny(reason: &'static str) -> Judgement {
        Judgement { allow: false, reason }
    }
}

/// Whether a new flow to `dst` may go, given the names DNS bound to `dst`
/// (for this sandbox, unexpired) and whether `dst` is one of the host's own
/// addresses.
pub fn judge(p: &Policy, extra_deny: &[Cidr], dst: IpAddr, names: &[&str], is_host: bool) -> Judgement {
    let private = match classify(dst) {
        Class::HardDeny(range) => return Judgement::deny(range),
        Class::Private => true,
        Class::Public => false,
    };
    if is_host {
        return Judgement::deny("one of the host's addresses");
    }
    if extra_deny.iter().any(|c| c.contains(dst)) {
        return Judgement::deny("in the operator's deny list");
    }
    for rule in &p.egress {
        match &rule.target {
            Target::Ip(_) if rule.target.matches_ip(dst) => return Judgement::new(rule.action, "IP rule"),
            Target::Cidr(_) if rule.target.matches_ip(dst) => return Judgement::new(rule.action, "CIDR rule"),
            Target::Domain { .. } if names.iter().any(|n| rule.target.matches_name(n)) => match rule.action {
                Action::Deny => return Judgement::deny("domain rule"),
                Action::Allow if !private => return Judgement::new(Action::Allow, "domain rule"),
                // A name pointing into a private range (rebinding) does not open it.
                Action::Allow => continue,
            },
            _ => continue,
        }
    }
    if private {
        return Judgement::deny("private range: only an IP/CIDR allow rule opens it");
    }
    Judgement::new(p.default_action, "default action")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::rule::Rule;

    fn policy(default: Action, rules: &[(&str, &str)]) -> Policy {
        Policy {
            default_action: default,
            egress: rules.iter().map(|(a, t)| Rule::parse(a, t).expect("valid rule")).collect(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn allowed(p: &Policy, dst: &str, names: &[&str]) -> bool {
        judge(p, &[], ip(dst), names, false).allow
    }

    #[test]
    fn hard_deny_beats_explicit_allow() {
        let p = policy(Action::Allow, &[("allow", "0.0.0.0/0"), ("allow", "127.0.0.1"), ("allow", "169.254.169.254")]);
        for dst in ["127.0.0.1", "169.254.169.254", "224.0.0.251", "255.255.255.255", "0.0.0.0", "240.1.1.1"] {
            assert!(!allowed(&p, dst, &[]), "{dst}");
        }
        assert!(!allowed(&policy(Action::Allow, &[("allow", "::/0")]), "::1", &[]));
    }

    #[test]
    fn host_addresses_and_extra_deny_are_refused() {
        let p = policy(Action::Allow, &[("allow", "192.0.2.1"), ("allow", "203.0.113.0/24")]);
        assert!(!judge(&p, &[], ip("192.0.2.1"), &[], true).allow);
        let extra = [Cidr::parse("203.0.113.0/28").expect("cidr")];
        let j = judge(&p, &extra, ip("203.0.113.5"), &[], false);
        assert!(!j.allow);
        assert_eq!(j.reason, "in the operator's deny list");
        assert!(judge(&p, &extra, ip("203.0.113.20"), &[], false).allow);
    }

    #[test]
    fn private_ranges_need_an_ip_or_cidr_allow() {
        let open = policy(Action::Allow, &[]);
        assert!(!allowed(&open, "10.0.0.5", &[]), "default allow does not open private");
        assert!(!allowed(&open, "100.64.1.1", &[]));
        assert!(!allowed(&open, "fd00::5", &[]));
        let by_name = policy(Action::Deny, &[("allow", "rebind.test")]);
        assert!(!allowed(&by_name, "10.0.0.5", &["rebind.test"]), "a domain rule never opens private");
        let by_cidr = policy(Action::Deny, &[("allow", "10.0.0.0/8")]);
        assert!(allowed(&by_cidr, "10.0.0.5", &[]));
        let by_ip = policy(Action::Deny, &[("allow", "192.168.1.1")]);
        assert!(allowed(&by_ip, "192.168.1.1", &[]));
        assert!(!allowed(&by_ip, "192.168.1.2", &[]));
        let name_then_cidr = policy(Action::Deny, &[("allow", "internal.test"), ("allow", "10.0.0.0/8")]);
        assert!(allowed(&name_then_cidr, "10.0.0.5", &["internal.test"]), "passes the domain allow, takes the CIDR");
        let deny_name_first = policy(Action::Deny, &[("deny", "internal.test"), ("allow", "10.0.0.0/8")]);
        assert!(!allowed(&deny_name_first, "10.0.0.5", &["internal.test"]));
    }

    #[test]
    fn first_match_in_list_order() {
        let ip_first = policy(Action::Deny, &[("allow", "203.0.113.10"), ("deny", "203.0.113.0/24")]);
        assert!(allowed(&ip_first, "203.0.113.10", &[]));
        assert!(!allowed(&ip_first, "203.0.113.11", &[]));
        let cidr_first = policy(Action::Allow, &[("deny", "203.0.113.0/24"), ("allow", "203.0.113.10")]);
        assert!(!allowed(&cidr_first, "203.0.113.10", &[]));
        let name_first = policy(Action::Allow, &[("deny", "denied.test"), ("allow", "203.0.113.0/24")]);
        assert!(!allowed(&name_first, "203.0.113.20", &["denied.test"]));
        assert!(allowed(&name_first, "203.0.113.20", &["other.test"]));
    }

    #[test]
    fn domain_rules_match_bound_names() {
        let p = policy(Action::Deny, &[("allow", "allowed.test"), ("allow", "*.wild.test")]);
        assert!(allowed(&p, "203.0.113.10", &["allowed.test"]));
        assert!(allowed(&p, "203.0.113.10", &["x.test", "a.wild.test"]), "any bound name may match");
        assert!(!allowed(&p, "203.0.113.10", &["wild.test"]), "wildcard does not match the apex");
        assert!(!allowed(&p, "203.0.113.10", &[]), "no name bound: default");
    }

    #[test]
    fn default_action_applies_to_public_destinations() {
        assert!(allowed(&policy(Action::Allow, &[]), "203.0.113.10", &[]));
        let j = judge(&policy(Action::Deny, &[]), &[], ip("203.0.113.10"), &[], false);
        assert_eq!(j, Judgement { allow: false, reason: "default action" });
    }

    #[test]
    fn mapped_v6_cannot_sidestep_v4_rules() {
        let p = policy(Action::Allow, &[("deny", "203.0.113.0/24")]);
        assert!(!allowed(&p, "::ffff:203.0.113.10", &[]));
        assert!(!allowed(&p, "::ffff:10.0.0.1", &[]));
    }
}

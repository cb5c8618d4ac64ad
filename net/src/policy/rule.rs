//! One egress rule: its action and its target, parsed and normalised.
//!
//! Normalisation follows OpenSandbox: the action is trimmed and lower-cased
//! (empty means deny); the target is trimmed and read as an IP address, else
//! as a CIDR, else as a domain, lower-cased, without a trailing dot. Only a
//! leading `*.` wildcard exists. Unlike OpenSandbox, a malformed domain (a
//! `*` elsewhere, an empty label, a space) or something that looks like an
//! address but is not one (`300.1.1.1`, `10.0.0.0/33`) is an error instead of
//! a domain rule that can never match.
use std::fmt;
use std::net::IpAddr;

use super::cidr::Cidr;
use super::error::RuleError;

/// Longest domain name (RFC 1035, without the trailing dot).
const MAX_NAME_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
}

impl Action {
    /// `allow` or `deny`, any case, surrounding space ignored; empty is deny.
    pub fn parse(s: &str) -> Result<Action, RuleError> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("deny") {
            Ok(Action::Deny)
        } else if s.eq_ignore_ascii_case("allow") {
            Ok(Action::Allow)
        } else {
            Err(RuleError::UnknownAction(s.to_string()))
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Ip(IpAddr),
    Cidr(Cidr),
    /// A lower-cased name without a trailing dot; `wildcard` for `*.name`,
    /// which matches names below `name` at any depth but not `name` itself.
    Domain {
        name: String,
        wildcard: bool,
    },
}

impl Target {
    /// Reads a target as the API sends it (see the module docs).
    pub fn parse(raw: &str) -> Result<Target, RuleError> {
        let s = raw.trim();
        if s.is_empty() {
            return Err(RuleError::EmptyTarget);
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Target::Ip(ip));
        }
        if s.contains("://") {
            return Err(RuleError::BadDomain(s.to_string(), "a URL; give the host name alone"));
        }
        if s.contains(':') && !s.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.' || b == b'/') {
            return Err(RuleError::BadDomain(s.to_string(), "not a name, an address or a CIDR (no ports or zones)"));
        }
        if s.contains('/') {
            return Cidr::parse(s).map(Target::Cidr).ok_or_else(|| RuleError::BadCidr(s.to_string()));
        }
        if s.contains(':') || looks_numeric(s) {
            return Err(RuleError::BadIp(s.to_string()));
        }
        parse_domain(s)
    }

    /// The target as stored and shown (`GET /policy`): the address, the
    /// network, or the name with its `*.`.
    pub fn canonical(&self) -> String {
        self.to_string()
    }

    /// Whether a name DNS bound to (or a sandbox asked for) is matched by
    /// this target: always false for IP and CIDR targets. `name` may carry a
    /// trailing dot and any case.
    pub fn matches_name(&self, name: &str) -> bool {
        let Target::Domain { name: pattern, wildcard } = self else {
            return false;
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if !*wildcard {
            return name.eq_ignore_ascii_case(pattern);
        }
        // `*.x.com` matches `a.x.com`, `a.b.x.com`, never `x.com`.
        name.len() > pattern.len() + 1 && {
            let split = name.len() - pattern.len();
            name.is_char_boundary(split)
                && name.as_bytes()[split - 1] == b'.'
                && name[split..].eq_ignore_ascii_case(pattern)
        }
    }

    /// Whether this IP or CIDR target covers `ip` (false for domains).
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        match self {
            Target::Ip(addr) => Cidr::host(*addr).contains(ip),
            Target::Cidr(cidr) => cidr.contains(ip),
            Target::Domain { .. } => false,
        }
    }

    pub fn is_domain(&self) -> bool {
        matches!(self, Target::Domain { .. })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Ip(ip) => write!(f, "{ip}"),
            Target::Cidr(cidr) => write!(f, "{cidr}"),
            Target::Domain { name, wildcard: true } => write!(f, "*.{name}"),
            Target::Domain { name, wildcard: false } => f.write_str(name),
        }
    }
}

/// One entry of `egress`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub action: Action,
    pub target: Target,
}

impl Rule {
    /// Parses an `{action, target}` pair as the API sends it.
    pub fn parse(action: &str, target: &str) -> Result<Rule, RuleError> {
        Ok(Rule { action: Action::parse(action)?, target: Target::parse(target)? })
    }

    /// The key PATCH and DELETE compare rules by (the canonical target).
    pub fn key(&self) -> String {
        self.target.canonical()
    }
}

/// All dots and digits: meant as an IPv4 address, but not a valid one.
fn looks_numeric(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || b == b'.') && s.bytes().any(|b| b.is_ascii_digit())
}

fn parse_domain(s: &str) -> Result<Target, RuleError> {
    let bad = |why| RuleError::BadDomain(s.to_string(), why);
    let lower = s.to_ascii_lowercase();
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    let (name, wildcard) = match lower.strip_prefix("*.") {
        Some(rest) => (rest, true),
        None => (lower, false),
    };
    if name.contains('*') {
        return Err(bad("only a leading \"*.\" wildcard is allowed"));
    }
    if name.is_empty() {
        return Err(bad("no name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad("longer than 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(bad("empty label"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(bad("a label longer than 63 characters"));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(bad("only letters, digits, '-' and '_' in a label"));
        }
    }
    Ok(Target::Domain { name: name.to_string(), wildcard })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Target {
        Target::parse(s).expect("valid target")
    }

    #[test]
    fn actions_are_trimmed_and_lower_cased() {
        assert_eq!(Action::parse(" ALLOW "), Ok(Action::Allow));
        assert_eq!(Action::parse("Deny"), Ok(Action::Deny));
        assert_eq!(Action::parse(""), Ok(Action::Deny));
        assert_eq!(Action::parse("  "), Ok(Action::Deny));
        assert_eq!(Action::parse("permit"), Err(RuleError::UnknownAction("permit".into())));
    }

    #[test]
    fn ip_then_cidr_then_domain() {
        assert_eq!(target(" 192.0.2.1 "), Target::Ip("192.0.2.1".parse().expect("ip")));
        assert_eq!(target("2001:DB8::1").to_string(), "2001:db8::1");
        assert_eq!(target("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(target("Example.COM."), Target::Domain { name: "example.com".into(), wildcard: false });
        assert_eq!(target("*.Example.com"), Target::Domain { name: "example.com".into(), wildcard: true });
        assert_eq!(target("*.Example.com").to_string(), "*.example.com");
        assert_eq!(target("localhost").to_string(), "localhost");
        assert_eq!(target("_srv.x-y.example").to_string(), "_srv.x-y.example");
    }

    #[test]
    fn malformed_targets_are_errors() {
        assert_eq!(Target::parse("  "), Err(RuleError::EmptyTarget));
        assert_eq!(Target::parse("10.0.0.0/33"), Err(RuleError::BadCidr("10.0.0.0/33".into())));
        assert_eq!(Target::parse("example.com/8"), Err(RuleError::BadCidr("example.com/8".into())));
        assert_eq!(Target::parse("300.1.1.1"), Err(RuleError::BadIp("300.1.1.1".into())));
        assert_eq!(Target::parse("010.0.0.1"), Err(RuleError::BadIp("010.0.0.1".into())));
        assert_eq!(
            Target::parse("fe80::1%eth0"),
            Err(RuleError::BadDomain("fe80::1%eth0".into(), "not a name, an address or a CIDR (no ports or zones)"))
        );
        assert_eq!(
            Target::parse("fe80::g"),
            Err(RuleError::BadDomain("fe80::g".into(), "not a name, an address or a CIDR (no ports or zones)"))
        );
        assert_eq!(Target::parse("fe80:::1"), Err(RuleError::BadIp("fe80:::1".into())));
        assert_eq!(Target::parse("2001:db8::/129"), Err(RuleError::BadCidr("2001:db8::/129".into())));
        assert!(matches!(
            Target::parse("https://x.com/a"),
            Err(RuleError::BadDomain(_, "a URL; give the host name alone"))
        ));
        assert!(matches!(Target::parse("x.com:443"), Err(RuleError::BadDomain(..))));
        for s in
            ["*", "*.", "a.*.com", "*example.com", "**.x.com", "a..b", ".x.com", "a b.com", "x.com..", "ex@mple.com"]
        {
            assert!(matches!(Target::parse(s), Err(RuleError::BadDomain(..))), "{s}: {:?}", Target::parse(s));
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(matches!(Target::parse(&long_label), Err(RuleError::BadDomain(..))));
        let long_name = vec!["abcdefghi"; 26].join(".");
        assert!(long_name.len() > 253);
        assert!(matches!(Target::parse(&long_name), Err(RuleError::BadDomain(..))));
    }

    #[test]
    fn exact_domain_matches_only_itself() {
        let t = target("example.com");
        assert!(t.matches_name("example.com"));
        assert!(t.matches_name("EXAMPLE.com."));
        assert!(!t.matches_name("a.example.com"));
        assert!(!t.matches_name("badexample.com"));
        assert!(!t.matches_name("example.co"));
    }

    #[test]
    fn wildcard_matches_any_depth_but_not_the_apex() {
        let t = target("*.example.com");
        assert!(t.matches_name("a.example.com"));
        assert!(t.matches_name("a.b.c.Example.COM."));
        assert!(!t.matches_name("example.com"));
        assert!(!t.matches_name("example.com."));
        assert!(!t.matches_name("badexample.com"));
        assert!(!t.matches_name(".example.com"));
        assert!(!t.matches_name("é.example.com.x"));
    }

    #[test]
    fn ip_targets_never_match_names_and_domains_never_match_ips() {
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        assert!(!target("192.0.2.1").matches_name("192.0.2.1"));
        assert!(target("192.0.2.1").matches_ip(ip));
        assert!(target("192.0.2.0/24").matches_ip(ip));
        assert!(!target("192.0.3.0/24").matches_ip(ip));
        assert!(!target("example.com").matches_ip(ip));
        assert!(target("192.0.2.1").matches_ip("::ffff:192.0.2.1".parse().expect("ip")));
    }
}

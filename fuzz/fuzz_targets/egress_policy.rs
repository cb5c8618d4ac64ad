//! The egress policy as the API sends it (`pvisor_net::policy`): a create's
//! `networkPolicy` or a `POST`/`PUT /policy` body, a `PATCH` list of rules, a
//! `DELETE` list of targets, then the decision for one destination.
//!
//! Invariants: a parsed policy survives the trip through its JSON form (what
//! `GET /policy` shows) and through the proto the worker hands netd, rule
//! targets are canonical (parsing the canonical form gives the same target),
//! edits keep within the rule limit, and the judge never opens a hard-denied
//! range or the host's own address, opens a private range only by an IP or
//! CIDR rule, and judges an IPv4 address as its IPv4-mapped IPv6 form.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use pvisor_net::policy::api::{delete_from_json, patch_from_json};
use pvisor_net::policy::hard_deny::{classify, Class};
use pvisor_net::policy::{judge, Policy, Target, MAX_RULES};

fn check_policy(p: &Policy) {
    assert!(p.egress.len() <= MAX_RULES);
    for r in &p.egress {
        let canonical = r.target.canonical();
        assert_eq!(Target::parse(&canonical).as_ref(), Ok(&r.target), "target {canonical:?} is not canonical");
    }
    let shown = p.to_json();
    assert_eq!(Policy::from_json(&shown).as_ref(), Ok(p), "JSON round trip of {shown}");
    let bytes = serde_json::to_vec(&shown).expect("a policy serializes");
    assert_eq!(Policy::from_json_bytes(&bytes).as_ref(), Ok(p));
    assert_eq!(Policy::from_proto(&p.to_proto()).as_ref(), Ok(p), "proto round trip");
    let _ = p.status_json(true, Some("fuzz"));
}

fn check_judge(p: &Policy, dst: Ipv4Addr) {
    let mut names: Vec<String> = Vec::new();
    for r in &p.egress {
        if let Target::Domain { name, wildcard } = &r.target {
            names.push(if *wildcard { format!("a.{name}") } else { name.clone() });
        }
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for is_host in [false, true] {
        let v = judge(p, &[], IpAddr::V4(dst), &names, is_host);
        let mapped = judge(p, &[], IpAddr::V6(dst.to_ipv6_mapped()), &names, is_host);
        assert_eq!(v.allow, mapped.allow, "{dst} and its IPv4-mapped form are judged differently");
        if is_host {
            assert!(!v.allow, "the host's own address {dst} allowed");
        }
        match classify(IpAddr::V4(dst)) {
            Class::HardDeny(_) => assert!(!v.allow, "hard-denied {dst} allowed"),
            Class::Private if v.allow => assert!(matches!(v.reason, "IP rule" | "CIDR rule"), "{dst}: {v:?}"),
            _ => {}
        }
    }
    let extra = [pvisor_net::policy::Cidr::host(IpAddr::V4(dst))];
    assert!(!judge(p, &extra, IpAddr::V4(dst), &names, false).allow, "the operator's deny list ignored");
}

fuzz_target!(|data: &[u8]| {
    // The last 4 bytes are the destination to judge.
    let (body, dst) = match data.len().checked_sub(4) {
        Some(at) => (&data[..at], Ipv4Addr::new(data[at], data[at + 1], data[at + 2], data[at + 3])),
        None => (data, Ipv4Addr::new(93, 184, 216, 34)),
    };
    let policy = Policy::from_json_bytes(body);
    if let Ok(p) = &policy {
        check_policy(p);
        check_judge(p, dst);
        let _ = p.decide_name(&String::from_utf8_lossy(body));
    }
    let base = policy.unwrap_or_else(|_| Policy::deny_all());
    if let Ok(rules) = patch_from_json(body) {
        assert!(!rules.is_empty());
        if let Ok(p) = base.patched(rules) {
            check_policy(&p);
            check_judge(&p, dst);
            // Patching is idempotent: the same rules again change nothing.
            let again = patch_from_json(body).expect("parsed once");
            assert_eq!(p.patched(again).as_ref(), Ok(&p), "PATCH is not idempotent");
        }
    }
    if let Ok(targets) = delete_from_json(body) {
        assert!(!targets.is_empty());
        let (p, removed) = base.without_targets(&targets);
        assert_eq!(p.egress.len() + removed, base.egress.len());
        let (again, none) = p.without_targets(&targets);
        assert_eq!((&again, none), (&p, 0), "DELETE is not idempotent");
        check_policy(&p);
    }
});

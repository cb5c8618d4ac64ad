//! The `/policy` edits: PATCH merge and DELETE by target (replace is just a
//! new [`Policy`]).
//!
//! PATCH puts the incoming rules first (the first of them per target wins),
//! then the old rules whose target the patch does not name; the default
//! action stays. DELETE drops the rules naming any of the given targets and
//! is idempotent. Targets compare in canonical form (lower-cased, `*.` kept,
//! addresses as Rust prints them), so `Example.COM.` names `example.com`.
use std::collections::HashSet;

use super::error::PolicyError;
use super::rule::{Rule, Target};
use super::Policy;

/// What DELETE says when no rule had any of the targets.
pub const NOTHING_DELETED: &str = "no matching targets found";

impl Policy {
    /// The policy after `PATCH /policy` with `incoming`; an empty list or a
    /// result above [`MAX_RULES`] is an error.
    pub fn patched(&self, incoming: Vec<Rule>) -> Result<Policy, PolicyError> {
        if incoming.is_empty() {
            return Err(PolicyError::EmptyPatch);
        }
        let mut seen = HashSet::new();
        let egress: Vec<Rule> =
            incoming.into_iter().chain(self.egress.iter().cloned()).filter(|r| seen.insert(r.key())).collect();
        Policy::new(self.default_action, egress)
    }

    /// The policy after `DELETE /policy` with `targets`, and how many rules
    /// went. A target that does not parse is compared trimmed and lower-cased.
    pub fn without_targets(&self, targets: &[String]) -> (Policy, usize) {
        let keys: HashSet<String> = targets
            .iter()
            .filter(|t| !t.trim().is_empty())
            .map(|t| Target::parse(t).map_or_else(|_| t.trim().to_ascii_lowercase(), |t| t.canonical()))
            .collect();
        let egress: Vec<Rule> = self.egress.iter().filter(|r| !keys.contains(&r.key())).cloned().collect();
        let removed = self.egress.len() - egress.len();
        (Policy { default_action: self.default_action, egress }, removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::rule::Action;
    use crate::policy::MAX_RULES;

    fn rules(list: &[(&str, &str)]) -> Vec<Rule> {
        list.iter().map(|(a, t)| Rule::parse(a, t).expect("valid rule")).collect()
    }

    fn shown(p: &Policy) -> Vec<String> {
        p.egress.iter().map(|r| format!("{} {}", r.action, r.target)).collect()
    }

    #[test]
    fn patch_puts_incoming_first_and_keeps_the_rest() {
        let old = Policy::new(Action::Allow, rules(&[("allow", "a.com"), ("deny", "b.com"), ("allow", "10.0.0.0/8")]))
            .expect("valid");
        let new = old.patched(rules(&[("allow", "B.com"), ("deny", "c.com"), ("deny", "b.com")])).expect("valid");
        assert_eq!(shown(&new), ["allow b.com", "deny c.com", "allow a.com", "allow 10.0.0.0/8"]);
        assert_eq!(new.default_action, Action::Allow, "default kept");
    }

    #[test]
    fn patch_errors() {
        assert_eq!(Policy::deny_all().patched(vec![]), Err(PolicyError::EmptyPatch));
        let full = Policy::new(
            Action::Deny,
            (0..MAX_RULES).map(|i| Rule::parse("allow", &format!("h{i}.test")).expect("valid")).collect(),
        )
        .expect("valid");
        assert!(full.patched(rules(&[("allow", "h0.test")])).is_ok(), "replacing a target keeps the count");
        let e = full.patched(rules(&[("allow", "new.test")])).expect_err("too many");
        assert!(e.is_too_large());
    }

    #[test]
    fn delete_by_target_is_idempotent() {
        let p = Policy::new(Action::Deny, rules(&[("allow", "*.x.com"), ("allow", "y.com"), ("deny", "2001:db8::1")]))
            .expect("valid");
        let (after, removed) = p.without_targets(&["*.X.com".into(), " Y.COM. ".into(), "2001:DB8::1".into()]);
        assert_eq!(removed, 3);
        assert!(after.egress.is_empty());
        let (again, removed) = after.without_targets(&["*.x.com".into()]);
        assert_eq!(removed, 0);
        assert_eq!(again, after);
        let (same, removed) = p.without_targets(&["x.com".into(), "".into(), "not a target".into()]);
        assert_eq!(removed, 0, "the apex does not name the wildcard");
        assert_eq!(same, p);
    }
}

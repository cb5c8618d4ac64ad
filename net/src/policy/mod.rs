//! The OpenSandbox egress policy.
//!
//! A [`Policy`] is a default action and rules in list order; the first rule
//! that matches decides. The broker parses the API's JSON into one
//! ([`api`]: errors name the rule), edits it for `/policy` ([`edit`]:
//! replace, PATCH merge, DELETE), stores it and sends it as the proto
//! ([`proto`]); netd reads it back and asks [`Policy::decide_name`] for
//! every DNS question and [`judge`] for every new flow, which applies the
//! [`hard_deny`] table first.
//!
//! * [`rule`]: one rule's action and target, normalised.
//! * [`cidr`]: networks and address matching.
pub mod api;
pub mod cidr;
pub mod edit;
pub mod error;
pub mod hard_deny;
pub mod judge;
pub mod proto;
pub mod rule;

pub use api::Mode;
pub use cidr::Cidr;
pub use error::{PolicyError, RuleError};
pub use judge::{judge, Judgement};
pub use rule::{Action, Rule, Target};

/// Most rules one policy may hold (OpenSandbox's default limit; more is 413).
pub const MAX_RULES: usize = 4096;

/// A sandbox's egress policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub default_action: Action,
    pub egress: Vec<Rule>,
}

impl Policy {
    /// No rules, everything (outside the hard-deny table) allowed:
    /// `--default-egress allow` without a `networkPolicy`.
    pub fn allow_all() -> Policy {
        Policy { default_action: Action::Allow, egress: Vec::new() }
    }

    /// No rules, everything denied (what an empty POST sets).
    pub fn deny_all() -> Policy {
        Policy { default_action: Action::Deny, egress: Vec::new() }
    }

    /// A policy from already parsed rules; more than [`MAX_RULES`] is an error.
    pub fn new(default_action: Action, egress: Vec<Rule>) -> Result<Policy, PolicyError> {
        if egress.len() > MAX_RULES {
            return Err(PolicyError::TooManyRules(egress.len()));
        }
        Ok(Policy { default_action, egress })
    }

    /// The action for a DNS question: the first domain rule matching `name`
    /// (any case, trailing dot or not), else the default.
    pub fn decide_name(&self, name: &str) -> Action {
        self.egress.iter().find(|r| r.target.matches_name(name)).map_or(self.default_action, |r| r.action)
    }

    /// `allow_all`, `deny_all` or `enforcing`, as OpenSandbox derives it:
    /// only a policy without rules is one of the first two.
    pub fn mode(&self) -> Mode {
        match (self.egress.is_empty(), self.default_action) {
            (true, Action::Allow) => Mode::AllowAll,
            (true, Action::Deny) => Mode::DenyAll,
            (false, _) => Mode::Enforcing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(default: Action, rules: &[(&str, &str)]) -> Policy {
        let egress = rules.iter().map(|(a, t)| Rule::parse(a, t).expect("valid rule")).collect();
        Policy::new(default, egress).expect("valid policy")
    }

    #[test]
    fn decide_name_takes_the_first_domain_rule() {
        let p = policy(
            Action::Deny,
            &[("deny", "bad.x.com"), ("allow", "*.x.com"), ("deny", "a.x.com"), ("allow", "x.com")],
        );
        assert_eq!(p.decide_name("bad.x.com"), Action::Deny);
        assert_eq!(p.decide_name("a.x.com"), Action::Allow, "the wildcard comes first");
        assert_eq!(p.decide_name("X.COM."), Action::Allow);
        assert_eq!(p.decide_name("y.com"), Action::Deny, "default");
        assert_eq!(policy(Action::Allow, &[("deny", "1.2.3.4")]).decide_name("1.2.3.4"), Action::Allow);
    }

    #[test]
    fn mode_as_opensandbox() {
        assert_eq!(Policy::allow_all().mode(), Mode::AllowAll);
        assert_eq!(Policy::deny_all().mode(), Mode::DenyAll);
        assert_eq!(policy(Action::Allow, &[("deny", "x.com")]).mode(), Mode::Enforcing);
        assert_eq!(policy(Action::Deny, &[("allow", "x.com")]).mode(), Mode::Enforcing);
        assert_eq!(Mode::Enforcing.as_str(), "enforcing");
    }

    #[test]
    fn too_many_rules() {
        let rule = Rule::parse("allow", "x.com").expect("valid");
        assert!(Policy::new(Action::Deny, vec![rule.clone(); MAX_RULES]).is_ok());
        let err = Policy::new(Action::Deny, vec![rule; MAX_RULES + 1]).expect_err("too many");
        assert!(err.is_too_large());
        assert_eq!(err.to_string(), "4097 egress rules, at most 4096 allowed");
    }
}

//! Conversion to and from `pvisor.net.v1.EgressPolicy`, the form the broker
//! sends to the worker and the worker to netd.
//!
//! The broker only sends normalised policies, but the receiver parses again
//! (a target string is re-read, an unknown action number is an error), so a
//! bad message is refused instead of enforced half-understood.
use pvisor_proto::net as pb;

use super::error::{PolicyError, RuleError};
use super::rule::{Action, Rule, Target};
use super::Policy;

impl Policy {
    /// Reads the proto, with the same checks as the JSON API.
    pub fn from_proto(p: &pb::EgressPolicy) -> Result<Policy, PolicyError> {
        let default_action = action_from_proto(p.default_action)
            .map_err(|_| PolicyError::DefaultAction(p.default_action.to_string()))?;
        if p.egress.len() > super::MAX_RULES {
            return Err(PolicyError::TooManyRules(p.egress.len()));
        }
        let egress = p
            .egress
            .iter()
            .enumerate()
            .map(|(index, r)| {
                let rule = (|| Ok(Rule { action: action_from_proto(r.action)?, target: Target::parse(&r.target)? }))();
                rule.map_err(|error| PolicyError::rule(index, error))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy { default_action, egress })
    }

    pub fn to_proto(&self) -> pb::EgressPolicy {
        pb::EgressPolicy {
            default_action: action_to_proto(self.default_action) as i32,
            egress: self
                .egress
                .iter()
                .map(|r| pb::EgressRule { action: action_to_proto(r.action) as i32, target: r.target.canonical() })
                .collect(),
        }
    }
}

fn action_from_proto(n: i32) -> Result<Action, RuleError> {
    match pb::Action::try_from(n) {
        Ok(pb::Action::Allow) => Ok(Action::Allow),
        Ok(pb::Action::Deny) => Ok(Action::Deny),
        Err(_) => Err(RuleError::UnknownAction(n.to_string())),
    }
}

fn action_to_proto(a: Action) -> pb::Action {
    match a {
        Action::Allow => pb::Action::Allow,
        Action::Deny => pb::Action::Deny,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let p = Policy::new(
            Action::Deny,
            vec![
                Rule::parse("allow", "*.Example.com").expect("valid"),
                Rule::parse("deny", "10.0.0.0/8").expect("valid"),
                Rule::parse("allow", "2001:db8::1").expect("valid"),
            ],
        )
        .expect("valid");
        let pb = p.to_proto();
        assert_eq!(pb.egress[0].target, "*.example.com");
        assert_eq!(pb.egress[0].action, pb::Action::Allow as i32);
        assert_eq!(Policy::from_proto(&pb), Ok(p));
    }

    #[test]
    fn bad_messages_are_refused() {
        let bad_target = pb::EgressPolicy {
            default_action: 0,
            egress: vec![
                pb::EgressRule { action: 1, target: "x.com".into() },
                pb::EgressRule { action: 1, target: "10.0.0.0/33".into() },
            ],
        };
        assert_eq!(
            Policy::from_proto(&bad_target).map_err(|e| e.to_string()),
            Err("egress[1]: bad CIDR \"10.0.0.0/33\"".to_string())
        );
        let bad_action =
            pb::EgressPolicy { default_action: 0, egress: vec![pb::EgressRule { action: 7, target: "x.com".into() }] };
        assert!(matches!(Policy::from_proto(&bad_action), Err(PolicyError::Rule { index: 0, .. })));
        let bad_default = pb::EgressPolicy { default_action: 9, egress: vec![] };
        assert_eq!(Policy::from_proto(&bad_default), Err(PolicyError::DefaultAction("9".into())));
    }
}

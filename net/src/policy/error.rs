//! What can be wrong with a policy, a rule or an edit.
//!
//! Messages name the rule by its index in the list the caller sent
//! (`egress[3]: bad CIDR "10.0.0.0/33"`), so an API error tells the user
//! which entry to fix.
use thiserror::Error;

use super::MAX_RULES;

/// One rule's problem (without its position; [`PolicyError::Rule`] adds it).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuleError {
    #[error("unknown action \"{0}\" (allow or deny)")]
    UnknownAction(String),
    #[error("empty target")]
    EmptyTarget,
    #[error("bad IP address \"{0}\"")]
    BadIp(String),
    #[error("bad CIDR \"{0}\"")]
    BadCidr(String),
    #[error("bad domain \"{0}\": {1}")]
    BadDomain(String, &'static str),
    #[error("{0}")]
    Shape(&'static str),
}

/// A policy, a PATCH list or a DELETE list that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    #[error("egress[{index}]: {error}")]
    Rule { index: usize, error: RuleError },
    #[error("defaultAction: unknown action \"{0}\" (allow or deny)")]
    DefaultAction(String),
    /// More rules than [`MAX_RULES`] (the API answers 413).
    #[error("{0} egress rules, at most {max} allowed", max = MAX_RULES)]
    TooManyRules(usize),
    #[error("no rules to patch (an empty list)")]
    EmptyPatch,
    #[error("no targets to delete (an empty list)")]
    EmptyDelete,
    /// The JSON is not shaped as the API expects (`egress` not a list, …).
    #[error("{0}")]
    Shape(String),
}

impl PolicyError {
    /// Whether the API should answer 413 (too large) rather than 400.
    pub fn is_too_large(&self) -> bool {
        matches!(self, PolicyError::TooManyRules(_))
    }

    pub(crate) fn rule(index: usize, error: RuleError) -> PolicyError {
        PolicyError::Rule { index, error }
    }
}

//! The policy as the OpenSandbox API writes it in JSON.
//!
//! `{"defaultAction":"deny","egress":[{"action":"allow","target":"x.com"}]}`
//! on create and for `POST`/`PUT /policy`; a bare list of rules for `PATCH`;
//! a list of targets for `DELETE`. Parsing walks a `serde_json::Value` by
//! hand so every error names the entry (`egress[3]: …`), and checks the rule
//! count before parsing any rule, so an oversized body fails fast.
use serde_json::{json, Map, Value};

use super::error::{PolicyError, RuleError};
use super::rule::{Action, Rule};
use super::{Policy, MAX_RULES};

/// What `GET /policy` reports as `enforcementMode`: netd checks names (DNS)
/// and every flow's address, as OpenSandbox's `dns+nft` does.
pub const ENFORCEMENT_MODE: &str = "dns+nft";

/// The policy's overall shape, as OpenSandbox names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AllowAll,
    DenyAll,
    Enforcing,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::AllowAll => "allow_all",
            Mode::DenyAll => "deny_all",
            Mode::Enforcing => "enforcing",
        }
    }
}

impl Policy {
    /// A whole policy (create's `networkPolicy`, `POST`/`PUT /policy`).
    /// `null` and `{}` are deny-all; a missing or empty `defaultAction` is deny.
    pub fn from_json(v: &Value) -> Result<Policy, PolicyError> {
        let obj = match v {
            Value::Null => return Ok(Policy::deny_all()),
            Value::Object(obj) => obj,
            _ => return Err(PolicyError::Shape("the policy must be an object {defaultAction, egress}".into())),
        };
        let default_action = match obj.get("defaultAction") {
            None | Some(Value::Null) => Action::Deny,
            Some(Value::String(s)) => Action::parse(s).map_err(|_| PolicyError::DefaultAction(s.trim().to_string()))?,
            Some(_) => return Err(PolicyError::Shape("defaultAction must be a string".into())),
        };
        let egress = match obj.get("egress") {
            None | Some(Value::Null) => Vec::new(),
            Some(list) => rules_from_json(list, "egress must be a list of rules")?,
        };
        Ok(Policy { default_action, egress })
    }

    /// A request body: empty (or only space) is deny-all, as OpenSandbox's
    /// `POST /policy` resets; otherwise JSON for [`Policy::from_json`].
    pub fn from_json_bytes(body: &[u8]) -> Result<Policy, PolicyError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Policy::deny_all());
        }
        Policy::from_json(&parse_body(body)?)
    }

    /// The policy as `GET /policy` and `GET /sandboxes/{id}` show it.
    pub fn to_json(&self) -> Value {
        let egress: Vec<Value> =
            self.egress.iter().map(|r| json!({"action": r.action.as_str(), "target": r.target.canonical()})).collect();
        json!({"defaultAction": self.default_action.as_str(), "egress": egress})
    }

    /// The body of a `/policy` answer: `{status, mode, enforcementMode}`,
    /// with the policy itself for `GET` and a `reason` when there is one.
    pub fn status_json(&self, with_policy: bool, reason: Option<&str>) -> Value {
        let mut out = Map::new();
        out.insert("status".into(), json!("ok"));
        out.insert("mode".into(), json!(self.mode().as_str()));
        out.insert("enforcementMode".into(), json!(ENFORCEMENT_MODE));
        if let Some(reason) = reason {
            out.insert("reason".into(), json!(reason));
        }
        if with_policy {
            out.insert("policy".into(), self.to_json());
        }
        Value::Object(out)
    }
}

/// A `PATCH /policy` body: a non-empty list of rules.
pub fn patch_from_json(body: &[u8]) -> Result<Vec<Rule>, PolicyError> {
    let rules = rules_from_json(&parse_body(body)?, "the body must be a list of rules [{action, target}]")?;
    if rules.is_empty() {
        return Err(PolicyError::EmptyPatch);
    }
    Ok(rules)
}

/// A `DELETE /policy` body: a non-empty list of target strings.
pub fn delete_from_json(body: &[u8]) -> Result<Vec<String>, PolicyError> {
    let shape = || PolicyError::Shape("the body must be a list of targets [\"x.com\", …]".into());
    let Value::Array(list) = parse_body(body)? else {
        return Err(shape());
    };
    if list.is_empty() {
        return Err(PolicyError::EmptyDelete);
    }
    list.into_iter().map(|v| if let Value::String(s) = v { Ok(s) } else { Err(shape()) }).collect()
}

fn parse_body(body: &[u8]) -> Result<Value, PolicyError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(PolicyError::Shape("empty body".into()));
    }
    serde_json::from_slice(body).map_err(|e| PolicyError::Shape(format!("invalid JSON: {e}")))
}

fn rules_from_json(v: &Value, shape: &str) -> Result<Vec<Rule>, PolicyError> {
    let Value::Array(list) = v else {
        return Err(PolicyError::Shape(shape.to_string()));
    };
    if list.len() > MAX_RULES {
        return Err(PolicyError::TooManyRules(list.len()));
    }
    list.iter().enumerate().map(|(index, r)| rule_from_json(r).map_err(|e| PolicyError::rule(index, e))).collect()
}

fn rule_from_json(v: &Value) -> Result<Rule, RuleError> {
    let Value::Object(obj) = v else {
        return Err(RuleError::Shape("a rule must be an object {action, target}"));
    };
    let action = match obj.get("action") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err(RuleError::Shape("action must be a string")),
    };
    let target = match obj.get("target") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => return Err(RuleError::Shape("target must be a string")),
    };
    Rule::parse(action, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Policy, String> {
        Policy::from_json(&v).map_err(|e| e.to_string())
    }

    #[test]
    fn the_sdk_shape() {
        let p = parse(json!({"defaultAction": " Deny ", "egress": [
            {"action": "ALLOW", "target": "Pkgs.Example.org"},
            {"action": "", "target": "10.0.0.0/8"},
            {"target": "*.x.com"},
        ]}))
        .expect("valid");
        assert_eq!(p.default_action, Action::Deny);
        assert_eq!(
            p.to_json(),
            json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "pkgs.example.org"},
                {"action": "deny", "target": "10.0.0.0/8"},
                {"action": "deny", "target": "*.x.com"},
            ]})
        );
    }

    #[test]
    fn empty_forms_are_deny_all() {
        for v in [json!(null), json!({}), json!({"defaultAction": null, "egress": null}), json!({"defaultAction": ""})]
        {
            assert_eq!(Policy::from_json(&v), Ok(Policy::deny_all()), "{v}");
        }
        assert_eq!(Policy::from_json_bytes(b"  \n"), Ok(Policy::deny_all()));
        assert_eq!(Policy::from_json_bytes(b"{\"defaultAction\":\"allow\"}"), Ok(Policy::allow_all()));
    }

    #[test]
    fn errors_name_the_rule() {
        let err = |v| parse(v).expect_err("invalid");
        assert_eq!(
            err(json!({"egress": [{"action": "allow", "target": "a.com"}, {"action": "allow", "target": "b.com"},
                {"action": "allow", "target": "c.com"}, {"action": "allow", "target": "10.0.0.0/33"}]})),
            "egress[3]: bad CIDR \"10.0.0.0/33\""
        );
        assert_eq!(
            err(json!({"egress": [{"action": "permit", "target": "a.com"}]})),
            "egress[0]: unknown action \"permit\" (allow or deny)"
        );
        assert_eq!(err(json!({"egress": [{"action": "allow", "target": " "}]})), "egress[0]: empty target");
        assert_eq!(err(json!({"egress": [{"action": "allow"}]})), "egress[0]: empty target");
        assert_eq!(err(json!({"egress": ["a.com"]})), "egress[0]: a rule must be an object {action, target}");
        assert_eq!(err(json!({"egress": [{"action": 1, "target": "a.com"}]})), "egress[0]: action must be a string");
        assert_eq!(err(json!({"defaultAction": "maybe"})), "defaultAction: unknown action \"maybe\" (allow or deny)");
        assert_eq!(err(json!({"egress": {"action": "allow"}})), "egress must be a list of rules");
        assert_eq!(err(json!([])), "the policy must be an object {defaultAction, egress}");
        assert!(Policy::from_json_bytes(b"{nope").expect_err("bad json").to_string().starts_with("invalid JSON"));
    }

    #[test]
    fn too_many_rules_is_too_large() {
        let rules: Vec<Value> =
            (0..=MAX_RULES).map(|i| json!({"action": "allow", "target": format!("h{i}.test")})).collect();
        let e = Policy::from_json(&json!({"egress": rules})).expect_err("too many");
        assert!(e.is_too_large());
        let rules: Vec<Value> =
            (0..MAX_RULES).map(|i| json!({"action": "allow", "target": format!("h{i}.test")})).collect();
        assert_eq!(Policy::from_json(&json!({"egress": rules})).map(|p| p.egress.len()), Ok(MAX_RULES));
    }

    #[test]
    fn patch_and_delete_bodies() {
        let rules = patch_from_json(br#"[{"action":"allow","target":"X.com"}]"#).expect("valid");
        assert_eq!(rules, vec![Rule::parse("allow", "x.com").expect("valid")]);
        assert_eq!(patch_from_json(b"[]"), Err(PolicyError::EmptyPatch));
        assert!(matches!(patch_from_json(b""), Err(PolicyError::Shape(_))));
        assert!(matches!(patch_from_json(br#"{"egress":[]}"#), Err(PolicyError::Shape(_))));
        assert_eq!(
            patch_from_json(br#"[{"action":"allow","target":"a.com"},{"action":"x","target":"b.com"}]"#)
                .map_err(|e| e.to_string()),
            Err("egress[1]: unknown action \"x\" (allow or deny)".to_string())
        );
        assert_eq!(
            delete_from_json(br#"["*.x.com"," Y.com "]"#),
            Ok(vec!["*.x.com".to_string(), " Y.com ".to_string()])
        );
        assert_eq!(delete_from_json(b"[]"), Err(PolicyError::EmptyDelete));
        assert!(matches!(delete_from_json(b"[1]"), Err(PolicyError::Shape(_))));
    }

    #[test]
    fn status_bodies() {
        let p = Policy::allow_all();
        assert_eq!(
            p.status_json(true, None),
            json!({"status": "ok", "mode": "allow_all", "enforcementMode": "dns+nft",
                   "policy": {"defaultAction": "allow", "egress": []}})
        );
        assert_eq!(
            Policy::deny_all().status_json(false, Some("no matching targets found")),
            json!({"status": "ok", "mode": "deny_all", "enforcementMode": "dns+nft", "reason": "no matching targets found"})
        );
    }
}

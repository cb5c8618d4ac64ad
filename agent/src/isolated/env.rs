//! A session's environment: what sandbox commands get (image env, HOME/USER,
//! the env file), passed through the session's policy (`env_passthrough`).
//!
//! * no policy: the strict profile drops the blacklist (credentials by
//!   their usual names), the balanced one passes everything;
//! * `deny` with keys: everything but those keys; without keys: the blacklist;
//! * `allow`: only the keys (nothing else, `PATH` included: the shells have
//!   their own default).
use pvisor_proto::agent::{EnvMode, EnvPassthrough, IsolationProfile};
use std::collections::BTreeMap;

/// Names the strict profile keeps out of a session (case-insensitive; `*`
/// at either end is a wildcard).
pub const BLACKLIST: [&str; 9] =
    ["*_API_KEY", "*_TOKEN", "*_SECRET", "*_PASSWORD", "AWS_*", "ALI_*", "ALIYUN_*", "K8S_*", "KUBE_*"];

/// Whether `name` matches `pattern` (see [`BLACKLIST`]).
fn matches(name: &str, pattern: &str) -> bool {
    let (name, pattern) = (name.to_ascii_uppercase(), pattern.to_ascii_uppercase());
    match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
        (Some(rest), _) if rest.ends_with('*') => name.contains(&rest[..rest.len() - 1]),
        (Some(suffix), _) => name.ends_with(suffix),
        (None, Some(prefix)) => name.starts_with(prefix),
        (None, None) => name == pattern,
    }
}

pub fn blacklisted(name: &str) -> bool {
    BLACKLIST.iter().any(|p| matches(name, p))
}

/// Applies the policy to `env` (the sandbox commands' environment).
pub fn apply(profile: IsolationProfile, policy: Option<&EnvPassthrough>, env: &mut BTreeMap<String, String>) {
    match policy {
        None if profile == IsolationProfile::Balanced => {}
        None => env.retain(|k, _| !blacklisted(k)),
        Some(p) if p.mode() == EnvMode::Allow => env.retain(|k, _| p.keys.contains(k)),
        Some(p) if p.keys.is_empty() => env.retain(|k, _| !blacklisted(k)),
        Some(p) => env.retain(|k, _| !p.keys.contains(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        ["PATH", "HOME", "OPENAI_API_KEY", "GH_TOKEN", "aws_region", "KUBECONFIG", "MY_SECRET", "TOKENIZER"]
            .iter()
            .map(|k| (k.to_string(), "v".to_string()))
            .collect()
    }

    fn keys(e: &BTreeMap<String, String>) -> Vec<&str> {
        e.keys().map(String::as_str).collect()
    }

    #[test]
    fn strict_default_drops_the_blacklist() {
        let mut e = env();
        apply(IsolationProfile::Strict, None, &mut e);
        assert_eq!(keys(&e), ["HOME", "KUBECONFIG", "PATH", "TOKENIZER"]);
    }

    #[test]
    fn balanced_default_passes_everything() {
        let mut e = env();
        apply(IsolationProfile::Balanced, None, &mut e);
        assert_eq!(e, env());
    }

    #[test]
    fn deny_and_allow() {
        let deny =
            |k: &[&str]| EnvPassthrough { mode: EnvMode::Deny as i32, keys: k.iter().map(|s| s.to_string()).collect() };
        let mut e = env();
        apply(IsolationProfile::Balanced, Some(&deny(&["HOME", "GH_TOKEN"])), &mut e);
        assert!(!e.contains_key("HOME") && !e.contains_key("GH_TOKEN") && e.contains_key("OPENAI_API_KEY"));
        let mut e = env();
        apply(IsolationProfile::Balanced, Some(&deny(&[])), &mut e);
        assert_eq!(keys(&e), ["HOME", "KUBECONFIG", "PATH", "TOKENIZER"], "no keys: the blacklist");
        let mut e = env();
        let allow = EnvPassthrough { mode: EnvMode::Allow as i32, keys: vec!["GH_TOKEN".into(), "ABSENT".into()] };
        apply(IsolationProfile::Strict, Some(&allow), &mut e);
        assert_eq!(keys(&e), ["GH_TOKEN"]);
    }

    #[test]
    fn patterns() {
        assert!(matches("openai_api_key", "*_API_KEY"));
        assert!(!matches("API_KEY", "*_API_KEY"));
        assert!(matches("AWS_REGION", "AWS_*"));
        assert!(!matches("XAWS_REGION", "AWS_*"));
        assert!(matches("MYTOKENX", "*TOKEN*"));
        assert!(matches("exact", "EXACT"));
    }
}

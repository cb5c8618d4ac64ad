//! A sandbox's lifecycle hooks (OpenSandbox's create `lifecycle`: `preStart`
//! and `periodic`), as the create gave them with the defaults filled in. The
//! agent runs them ([`to_agent`](Lifecycle::to_agent)); the record keeps them
//! (a vm snapshot's restore configures its agent with the same), and the
//! create waits for the pre-start hook ([`Lifecycle::pre_start_budget`]),
//! whose failure is its answer ([`pre_start_failed`]).
use crate::api::error::ApiError;
use axum::http::StatusCode;
use pvisor_proto::agent as pb;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Lifecycle hooks of a sandbox. Commands are argv, executed directly (no
/// shell unless they name one), as the sandbox's commands are: the image's
/// env, env file, workdir and user. `preStart` runs once the sandbox is up,
/// before its periodic hooks and its entrypoint start, and the create answers
/// after it; its failure is the create's answer (400 `PRESTART_FAILED`, or
/// `PRESTART_TIMEOUT` past its timeout) and nothing of the sandbox is left.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct Lifecycle {
    /// Runs once the sandbox is up, before its periodic hooks and its
    /// entrypoint start; the create answers after it. A failure is the
    /// create's answer (400 `PRESTART_FAILED`, `PRESTART_TIMEOUT` past its
    /// timeout) and nothing of the sandbox is left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_start: Option<Hook>,
    /// Scheduled inside the sandbox for its life, from when the pre-start hook
    /// succeeded. A run that fails or times out is logged (the worker's log,
    /// diagnostics scope `runtime`) and the sandbox stays as it is; a firing
    /// while the hook's previous run still goes is skipped. At most 32.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub periodic: Vec<PeriodicHook>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct Hook {
    /// Command and arguments; the first must not be blank.
    #[schema(required = true)]
    pub command: Vec<String>,
    /// Seconds the hook may run before it is killed: 1 to 10800 (preStart),
    /// 1 to 300 (periodic); 60 when omitted.
    pub timeout_seconds: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct PeriodicHook {
    /// Unique among the sandbox's periodic hooks (surrounding blanks dropped).
    #[schema(required = true)]
    pub name: String,
    /// Five-field cron (`*/5 * * * *`), a descriptor (`@hourly`, `@daily`, ...)
    /// or `@every <duration>` (whole seconds, at least 1: `@every 30s`), in UTC.
    #[schema(required = true)]
    pub schedule: String,
    /// Command and arguments; the first must not be blank.
    #[schema(required = true)]
    pub command: Vec<String>,
    /// 1 to 300; 60 when omitted.
    pub timeout_seconds: u32,
}

impl Hook {
    fn to_agent(&self) -> pb::Hook {
        pb::Hook { command: self.command.clone(), timeout_secs: self.timeout_seconds }
    }
}

impl Lifecycle {
    pub fn is_empty(&self) -> bool {
        self.pre_start.is_none() && self.periodic.is_empty()
    }

    /// The agent's form (`AgentConfig.lifecycle`); None when there are no hooks.
    pub fn to_agent(&self) -> Option<pb::Lifecycle> {
        (!self.is_empty()).then(|| pb::Lifecycle {
            pre_start: self.pre_start.as_ref().map(Hook::to_agent),
            periodic: self
                .periodic
                .iter()
                .map(|p| pb::PeriodicHook {
                    name: p.name.clone(),
                    schedule: p.schedule.clone(),
                    hook: Some(pb::Hook { command: p.command.clone(), timeout_secs: p.timeout_seconds }),
                })
                .collect(),
        })
    }

    /// How much longer than a plain one a create may take: the pre-start
    /// hook's timeout (zero without one).
    pub fn pre_start_budget(&self) -> Duration {
        self.pre_start.as_ref().map_or(Duration::ZERO, |h| Duration::from_secs(u64::from(h.timeout_seconds)))
    }
}

/// Lines of a failed pre-start hook's output its create's error shows.
const OUTPUT_LINES: usize = 10;

/// The create's answer when its pre-start hook failed (`message`: the
/// agent's account of it, which names the hook and its command): a 400, as
/// the hook is the request's; `PRESTART_TIMEOUT` when it ran past its
/// timeout, else `PRESTART_FAILED`. (422 and 504 would say more, but the
/// official SDK reads the body of a create's error only for 400, 401, 403,
/// 409, 429 and 500: its users would get neither code nor message.)
pub fn pre_start_failed(failure: &pb::HookFailure, message: &str) -> ApiError {
    let lines: Vec<&str> = failure.output.lines().collect();
    let tail = lines[lines.len().saturating_sub(OUTPUT_LINES)..].join("\n");
    let message = match tail.is_empty() {
        true => format!("{message}; the sandbox was removed"),
        false => format!("{message}; the sandbox was removed; the hook's output ended with:\n{tail}"),
    };
    let code = if failure.timed_out { "PRESTART_TIMEOUT" } else { "PRESTART_FAILED" };
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks() -> Lifecycle {
        Lifecycle {
            pre_start: Some(Hook { command: vec!["sh".into(), "-c".into(), "true".into()], timeout_seconds: 90 }),
            periodic: vec![PeriodicHook {
                name: "sync".into(),
                schedule: "@every 5s".into(),
                command: vec!["sync".into()],
                timeout_seconds: 60,
            }],
        }
    }

    #[test]
    fn the_record_round_trips_and_omits_what_is_absent() {
        let l = hooks();
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["preStart"]["timeoutSeconds"], 90);
        assert_eq!(json["periodic"][0]["schedule"], "@every 5s");
        assert_eq!(serde_json::from_value::<Lifecycle>(json).unwrap(), l);
        assert_eq!(serde_json::to_value(Lifecycle::default()).unwrap(), serde_json::json!({}));
    }

    #[test]
    fn the_agent_gets_every_hook_and_the_create_the_pre_start_budget() {
        let a = hooks().to_agent().unwrap();
        assert_eq!(a.pre_start.unwrap().timeout_secs, 90);
        assert_eq!(a.periodic[0].hook.as_ref().unwrap().command, ["sync"]);
        assert_eq!(hooks().pre_start_budget(), Duration::from_secs(90));
        assert_eq!(Lifecycle::default().to_agent(), None, "no hooks, no lifecycle for the agent");
        assert_eq!(Lifecycle::default().pre_start_budget(), Duration::ZERO);
    }

    #[test]
    fn a_failed_or_timed_out_pre_start_is_a_400_with_its_code_and_output() {
        let out: String = (1..=15).map(|i| format!("line {i}\n")).collect();
        let f = pb::HookFailure { hook: "preStart".into(), exit_code: 3, output: out, ..Default::default() };
        let e = pre_start_failed(&f, "lifecycle.preStart [\"x\"] exited with status 3");
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "PRESTART_FAILED"));
        assert!(e.message.starts_with("lifecycle.preStart [\"x\"] exited with status 3; the sandbox was removed"));
        assert!(e
            .message
            .ends_with("line 6\nline 7\nline 8\nline 9\nline 10\nline 11\nline 12\nline 13\nline 14\nline 15"));
        assert!(!e.message.contains("line 5\n"), "{}", e.message);
        let t = pb::HookFailure { timed_out: true, exit_code: 137, ..f };
        let e = pre_start_failed(&t, "lifecycle.preStart did not finish");
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "PRESTART_TIMEOUT"));
    }
}

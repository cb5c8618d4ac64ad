//! A create's `lifecycle` (OpenSandbox OSEP-0020), checked before any state:
//! `preStart` and `periodic` with the reference server's rules (a command
//! whose first element is not blank; `timeoutSeconds` 1-10800 for preStart,
//! 1-300 for periodic hooks, 60 when omitted; periodic names non-blank and
//! unique, blanks around names and schedules dropped; schedules in robfig
//! cron's standard grammar, [`pvisor_schedule`]), plus bounds of this
//! server's own (sizes, at most 32 periodic hooks, a schedule that fires).
//! Every refusal is a 400 naming the field.
use crate::sandbox::hooks::{Hook, Lifecycle, PeriodicHook};
use serde_json::{Map, Value};

/// When a hook names no timeout.
pub const DEFAULT_TIMEOUT_SECS: u32 = 60;
/// Longest `preStart.timeoutSeconds` (3 hours, as the reference).
pub const PRE_START_MAX_TIMEOUT_SECS: u32 = 10_800;
/// Longest `periodic[].timeoutSeconds`.
pub const PERIODIC_MAX_TIMEOUT_SECS: u32 = 300;
/// Most periodic hooks a sandbox may have.
pub const MAX_PERIODIC: usize = 32;
/// Most arguments of a hook's command, and most bytes of them all.
const MAX_ARGS: usize = 1024;
const MAX_COMMAND_BYTES: usize = 64 << 10;
/// Longest name and schedule.
const MAX_NAME_BYTES: usize = 128;
const MAX_SCHEDULE_BYTES: usize = 256;

/// The hooks of the OpenSandbox design this server does not run.
const OTHER_HOOKS: [&str; 3] = ["prePause", "postResume", "preTerminate"];

/// Why a create's `lifecycle` was refused (always a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}: the command must have a first element that is not blank")]
    CommandEmpty(String),
    #[error("{path}: {value} is outside 1-{max} seconds")]
    TimeoutOutOfRange { path: String, value: String, max: u32 },
    #[error("{0}: a periodic hook's name must not be blank")]
    NameBlank(String),
    #[error("{path}: {name:?} names another periodic hook already")]
    NameDuplicate { path: String, name: String },
    #[error("{path}: {reason}")]
    Schedule { path: String, reason: String },
    #[error(
        "lifecycle cannot be given to a restore of a vm snapshot: its machine's agent runs on with the source's hooks"
    )]
    VmRestore,
}

impl HookError {
    pub fn code(&self) -> &'static str {
        match self {
            HookError::Invalid(_) => "LIFECYCLE_INVALID",
            HookError::Unsupported(_) | HookError::VmRestore => "LIFECYCLE_UNSUPPORTED",
            HookError::CommandEmpty(_) => "LIFECYCLE_COMMAND_EMPTY",
            HookError::TimeoutOutOfRange { .. } => "LIFECYCLE_TIMEOUT_OUT_OF_RANGE",
            HookError::NameBlank(_) => "LIFECYCLE_NAME_INVALID",
            HookError::NameDuplicate { .. } => "LIFECYCLE_NAME_DUPLICATE",
            HookError::Schedule { .. } => "LIFECYCLE_SCHEDULE_INVALID",
        }
    }
}

impl From<HookError> for super::error::ApiError {
    fn from(e: HookError) -> Self {
        super::error::ApiError::new(axum::http::StatusCode::BAD_REQUEST, e.code(), e.to_string())
    }
}

type Result<T> = std::result::Result<T, HookError>;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| HookError::Invalid(format!("{path} must be an object, not {}", kind(v))))
}

/// Refuses fields of `obj` that are not in `known` (an absent or null one is fine).
fn only(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<()> {
    match obj.iter().find(|(k, v)| !v.is_null() && !known.contains(&k.as_str())) {
        Some((k, _)) => Err(HookError::Invalid(format!("{path}.{k} is not a field here ({})", known.join(", ")))),
        None => Ok(()),
    }
}

fn string(obj: &Map<String, Value>, path: &str, key: &str) -> Result<String> {
    match obj.get(key) {
        None | Some(Value::Null) => Err(HookError::Invalid(format!("{path}.{key} is required"))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(HookError::Invalid(format!("{path}.{key} must be a string, not {}", kind(v)))),
    }
}

fn command(obj: &Map<String, Value>, path: &str) -> Result<Vec<String>> {
    let path = format!("{path}.command");
    let items = match obj.get("command") {
        None | Some(Value::Null) => return Err(HookError::Invalid(format!("{path} is required"))),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(HookError::Invalid(format!("{path} must be an array of strings, not {}", kind(v)))),
    };
    let mut argv = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) if s.contains('\0') => {
                return Err(HookError::Invalid(format!("{path}[{i}] contains a NUL byte")));
            }
            Value::String(s) => argv.push(s.clone()),
            v => return Err(HookError::Invalid(format!("{path}[{i}] must be a string, not {}", kind(v)))),
        }
    }
    if argv.first().is_none_or(|a| a.trim().is_empty()) {
        return Err(HookError::CommandEmpty(path));
    }
    if argv.len() > MAX_ARGS || argv.iter().map(String::len).sum::<usize>() > MAX_COMMAND_BYTES {
        return Err(HookError::Invalid(format!(
            "{path} is too long (at most {MAX_ARGS} arguments and {} KiB)",
            MAX_COMMAND_BYTES >> 10
        )));
    }
    Ok(argv)
}

fn timeout(obj: &Map<String, Value>, path: &str, max: u32) -> Result<u32> {
    let path = format!("{path}.timeoutSeconds");
    match obj.get("timeoutSeconds") {
        None | Some(Value::Null) => Ok(DEFAULT_TIMEOUT_SECS),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(t) if (1..=i64::from(max)).contains(&t) => Ok(t as u32),
            _ => Err(HookError::TimeoutOutOfRange { path, value: n.to_string(), max }),
        },
        Some(v) => Err(HookError::Invalid(format!("{path} must be a whole number of seconds, not {}", kind(v)))),
    }
}

fn pre_start(v: &Value) -> Result<Hook> {
    let path = "lifecycle.preStart";
    let obj = object(v, path)?;
    only(obj, path, &["command", "timeoutSeconds"])?;
    Ok(Hook { command: command(obj, path)?, timeout_seconds: timeout(obj, path, PRE_START_MAX_TIMEOUT_SECS)? })
}

fn periodic_hook(v: &Value, path: &str) -> Result<PeriodicHook> {
    let obj = object(v, path)?;
    only(obj, path, &["name", "schedule", "command", "timeoutSeconds"])?;
    let name = string(obj, path, "name")?.trim().to_string();
    if name.is_empty() {
        return Err(HookError::NameBlank(format!("{path}.name")));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(HookError::Invalid(format!("{path}.name is longer than {MAX_NAME_BYTES} bytes")));
    }
    let schedule = string(obj, path, "schedule")?.trim().to_string();
    let spath = format!("{path}.schedule");
    if schedule.len() > MAX_SCHEDULE_BYTES {
        return Err(HookError::Schedule { path: spath, reason: format!("longer than {MAX_SCHEDULE_BYTES} bytes") });
    }
    pvisor_schedule::Schedule::parse(&schedule)
        .map_err(|e| HookError::Schedule { path: spath, reason: e.to_string() })?;
    Ok(PeriodicHook {
        name,
        schedule,
        command: command(obj, path)?,
        timeout_seconds: timeout(obj, path, PERIODIC_MAX_TIMEOUT_SECS)?,
    })
}

fn periodic(v: &Value) -> Result<Vec<PeriodicHook>> {
    let path = "lifecycle.periodic";
    let Value::Array(items) = v else {
        return Err(HookError::Invalid(format!("{path} must be an array, not {}", kind(v))));
    };
    if items.len() > MAX_PERIODIC {
        return Err(HookError::Invalid(format!("{path} has {} hooks; at most {MAX_PERIODIC}", items.len())));
    }
    let mut hooks: Vec<PeriodicHook> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let hook = periodic_hook(item, &path)?;
        if hooks.iter().any(|h| h.name == hook.name) {
            return Err(HookError::NameDuplicate { path: format!("{path}.name"), name: hook.name });
        }
        hooks.push(hook);
    }
    Ok(hooks)
}

/// The hooks of a create's `lifecycle` (None: absent, null or without any).
pub fn parse(v: Option<&Value>) -> Result<Option<Lifecycle>> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let obj = object(v, "lifecycle")?;
    if let Some((k, _)) = obj.iter().find(|(k, v)| !v.is_null() && !matches!(k.as_str(), "preStart" | "periodic")) {
        return Err(HookError::Unsupported(match OTHER_HOOKS.contains(&k.as_str()) {
            true => format!("lifecycle.{k}: this server runs only preStart and periodic hooks"),
            false => format!("lifecycle.{k} is not a hook (preStart, periodic)"),
        }));
    }
    let lifecycle = Lifecycle {
        pre_start: obj.get("preStart").filter(|v| !v.is_null()).map(pre_start).transpose()?,
        periodic: obj.get("periodic").filter(|v| !v.is_null()).map(periodic).transpose()?.unwrap_or_default(),
    };
    Ok((!lifecycle.is_empty()).then_some(lifecycle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value) -> Option<Lifecycle> {
        parse(Some(&v)).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    fn code(v: Value) -> (&'static str, String) {
        let e = parse(Some(&v)).expect_err(&v.to_string());
        (e.code(), e.to_string())
    }

    fn periodic_with(hook: Value) -> Value {
        json!({"periodic": [hook]})
    }

    #[test]
    fn what_the_sdk_sends_is_taken_with_defaults_and_trimmed() {
        let l = ok(json!({
            "preStart": {"command": ["sh", "-c", "echo hi > /tmp/f"]},
            "periodic": [
                {"name": " sync ", "schedule": " @every 30s ", "command": ["sync"], "timeoutSeconds": 300},
                {"name": "nightly", "schedule": "0 3 * * *", "command": ["backup"], "timeoutSeconds": null},
            ],
        }))
        .unwrap();
        let pre = l.pre_start.unwrap();
        assert_eq!((pre.command.len(), pre.timeout_seconds), (3, DEFAULT_TIMEOUT_SECS));
        assert_eq!((l.periodic[0].name.as_str(), l.periodic[0].schedule.as_str()), ("sync", "@every 30s"));
        assert_eq!(l.periodic[0].timeout_seconds, 300);
        assert_eq!(l.periodic[1].timeout_seconds, DEFAULT_TIMEOUT_SECS);
        let long = ok(json!({"preStart": {"command": ["x"], "timeoutSeconds": 10_800}})).unwrap();
        assert_eq!(long.pre_start.unwrap().timeout_seconds, 10_800, "three hours for preStart");
    }

    #[test]
    fn nothing_to_run_is_no_lifecycle() {
        assert_eq!(parse(None), Ok(None));
        assert_eq!(parse(Some(&Value::Null)), Ok(None));
        assert_eq!(ok(json!({})), None);
        assert_eq!(ok(json!({"preStart": null, "periodic": []})), None);
    }

    #[test]
    fn shapes_and_types_are_checked() {
        for bad in [
            json!("hooks"),
            json!({"preStart": ["sh"]}),
            json!({"preStart": {"command": "sh -c true"}}),
            json!({"preStart": {"command": ["sh", 1]}}),
            json!({"preStart": {"command": ["sh", "a\u{0}b"]}}),
            json!({"preStart": {}}),
            json!({"preStart": {"command": ["sh"], "failurePolicy": "Abort"}}),
            json!({"preStart": {"command": ["sh"], "timeoutSeconds": "60"}}),
            json!({"periodic": {"name": "x"}}),
            json!({"periodic": [{"schedule": "@hourly", "command": ["x"]}]}),
            json!({"periodic": [{"name": "x", "command": ["x"]}]}),
            json!({"periodic": [{"name": 5, "schedule": "@hourly", "command": ["x"]}]}),
            json!({"preStart": {"command": vec!["a"; MAX_ARGS + 1]}}),
            json!({"periodic": (0..=MAX_PERIODIC).map(|i| json!({"name": i.to_string(), "schedule": "@hourly", "command": ["x"]})).collect::<Vec<_>>()}),
        ] {
            assert_eq!(code(bad.clone()).0, "LIFECYCLE_INVALID", "{bad}");
        }
        let (_, msg) = code(json!({"periodic": [{"schedule": "@hourly", "command": ["x"]}]}));
        assert_eq!(msg, "lifecycle.periodic[0].name is required");
    }

    #[test]
    fn hooks_other_than_pre_start_and_periodic_are_unsupported() {
        let (c, msg) = code(json!({"preTerminate": {"command": ["x"]}}));
        assert_eq!(c, "LIFECYCLE_UNSUPPORTED");
        assert!(msg.contains("only preStart and periodic"), "{msg}");
        assert_eq!(code(json!({"preStrat": {"command": ["x"]}})).0, "LIFECYCLE_UNSUPPORTED");
    }

    #[test]
    fn commands_must_name_something() {
        for cmd in [json!([]), json!([""]), json!(["  ", "x"])] {
            let (c, msg) = code(json!({"preStart": {"command": cmd}}));
            assert_eq!(c, "LIFECYCLE_COMMAND_EMPTY");
            assert!(msg.starts_with("lifecycle.preStart.command:"), "{msg}");
        }
        let (c, msg) = code(periodic_with(json!({"name": "a", "schedule": "@hourly", "command": []})));
        assert_eq!(c, "LIFECYCLE_COMMAND_EMPTY");
        assert!(msg.starts_with("lifecycle.periodic[0].command:"), "{msg}");
    }

    #[test]
    fn timeouts_have_bounds_per_hook() {
        for t in [json!(0), json!(-1), json!(10_801), json!(1.5), json!(1e9)] {
            let (c, msg) = code(json!({"preStart": {"command": ["x"], "timeoutSeconds": t}}));
            assert_eq!(c, "LIFECYCLE_TIMEOUT_OUT_OF_RANGE", "{t}");
            assert!(msg.contains("outside 1-10800 seconds"), "{msg}");
        }
        let (c, msg) =
            code(periodic_with(json!({"name": "a", "schedule": "@hourly", "command": ["x"], "timeoutSeconds": 301})));
        assert_eq!(c, "LIFECYCLE_TIMEOUT_OUT_OF_RANGE");
        assert_eq!(msg, "lifecycle.periodic[0].timeoutSeconds: 301 is outside 1-300 seconds");
    }

    #[test]
    fn names_are_required_and_unique() {
        let hook = |n: &str| json!({"name": n, "schedule": "@hourly", "command": ["x"]});
        assert_eq!(code(periodic_with(hook("  "))).0, "LIFECYCLE_NAME_INVALID");
        let (c, msg) = code(json!({"periodic": [hook("sync"), hook(" sync")]}));
        assert_eq!(c, "LIFECYCLE_NAME_DUPLICATE");
        assert_eq!(msg, "lifecycle.periodic[1].name: \"sync\" names another periodic hook already");
        assert_eq!(code(periodic_with(hook(&"n".repeat(129)))).0, "LIFECYCLE_INVALID");
    }

    #[test]
    fn schedules_are_checked() {
        let hook = |s: &str| periodic_with(json!({"name": "a", "schedule": s, "command": ["x"]}));
        for good in ["*/5 * * * *", "@hourly", "@every 1s", "@every 1h30m", "0 3 * * mon-fri", "TZ=UTC 0 3 * * *"] {
            assert!(ok(hook(good)).is_some(), "{good}");
        }
        for bad in [
            "",
            "  ",
            "@every 500ms",
            "@every 0s",
            "* * *",
            "61 * * * *",
            "@reboot",
            "0 0 30 2 *",
            "TZ=Europe/Paris 0 3 * * *",
        ] {
            let (c, msg) = code(hook(bad));
            assert_eq!(c, "LIFECYCLE_SCHEDULE_INVALID", "{bad:?}: {msg}");
            assert!(msg.starts_with("lifecycle.periodic[0].schedule: "), "{msg}");
        }
        assert_eq!(code(hook(&format!("@every {}s", "1".repeat(300)))).0, "LIFECYCLE_SCHEDULE_INVALID");
    }
}

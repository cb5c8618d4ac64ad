//! `POST /v1/isolated/session`'s body (SDK 1.1.1's `CreateIsolatedSessionRequest`):
//! parsed, checked (every problem a 400 before the sandbox is asked) and
//! resolved into the agent's `IsolatedSessionSpec` with every default
//! filled in; and the creation parameters a session echoes back.
use crate::api::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use pvisor_proto::agent::{
    EnvMode, EnvPassthrough, IsolatedBind, IsolatedMount, IsolatedSessionSpec, IsolationProfile, MountMode,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Most overlays (the legacy workspace included) per session, as the spec says.
pub const MAX_OVERLAYS: usize = 16;
/// Idle timeout when the request names none (the OSEP's default).
pub const DEFAULT_IDLE_TIMEOUT: u32 = 1800;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceBody {
    path: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlayBody {
    path: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    persist: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindBody {
    source: String,
    #[serde(default)]
    dest: Option<String>,
    #[serde(default)]
    readonly: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvBody {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    keys: Option<Vec<String>>,
}

/// The request as sent; unknown fields are refused (a misspelt option must
/// not silently build a less isolated session).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    workspace: Option<WorkspaceBody>,
    #[serde(default)]
    overlays: Option<Vec<OverlayBody>>,
    #[serde(default)]
    extra_writable: Option<Vec<String>>,
    #[serde(default)]
    binds: Option<Vec<BindBody>>,
    #[serde(default)]
    share_net: Option<bool>,
    #[serde(default)]
    env_passthrough: Option<EnvBody>,
    #[serde(default)]
    uid: Option<i64>,
    #[serde(default)]
    gid: Option<i64>,
    #[serde(default)]
    uid_mode: Option<String>,
    #[serde(default)]
    idle_timeout_seconds: Option<i64>,
}

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// An absolute path without trailing slash, empty, `.` or `..` segments.
fn clean_path(what: &str, p: &str) -> ApiResult<String> {
    let ok = p == "/"
        || (p.starts_with('/')
            && !p.ends_with('/')
            && !p.contains('\0')
            && p[1..].split('/').all(|seg| !seg.is_empty() && seg != "." && seg != ".."));
    if !ok {
        return Err(bad(format!("{what} {p:?} must be an absolute path without trailing slash, '.' or '..' segments")));
    }
    Ok(p.to_string())
}

fn mode_of(what: &str, m: &str) -> ApiResult<MountMode> {
    match m {
        "overlay" => Ok(MountMode::Overlay),
        "rw" => Ok(MountMode::Rw),
        "ro" => Ok(MountMode::Ro),
        other => Err(bad(format!("{what} mode {other:?} is not one of \"rw\", \"overlay\", \"ro\""))),
    }
}

fn id_of(what: &str, v: i64) -> ApiResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|n| *n != u32::MAX)
        .ok_or_else(|| bad(format!("{what} must be an integer between 0 and 4294967294, got {v}")))
}

/// Checks `b` and resolves it into the agent's spec.
pub fn resolve(b: CreateBody) -> ApiResult<IsolatedSessionSpec> {
    let profile = match b.profile.as_deref().unwrap_or("strict") {
        "strict" => IsolationProfile::Strict,
        "balanced" => IsolationProfile::Balanced,
        other => return Err(bad(format!("profile {other:?} is not one of \"strict\", \"balanced\""))),
    };
    if b.workspace.is_none() && b.overlays.is_none() {
        return Err(bad("one of workspace or overlays is required".into()));
    }
    let from_workspace = b.workspace.is_some();
    let mut overlays = Vec::new();
    if let Some(w) = b.workspace {
        // The legacy workspace's default mode is the profile's.
        let mode = match (w.mode.as_deref(), profile) {
            (Some(m), _) => mode_of("workspace", m)?,
            (None, IsolationProfile::Strict) => MountMode::Overlay,
            (None, IsolationProfile::Balanced) => MountMode::Rw,
        };
        overlays.push(IsolatedMount {
            path: clean_path("workspace.path", &w.path)?,
            mode: mode as i32,
            persist: mode == MountMode::Overlay,
        });
    }
    for o in b.overlays.unwrap_or_default() {
        let mode = o.mode.as_deref().map_or(Ok(MountMode::Overlay), |m| mode_of("overlay", m))?;
        if o.persist.is_some() && mode != MountMode::Overlay {
            return Err(bad(format!("overlay {:?}: persist applies to mode \"overlay\" only", o.path)));
        }
        overlays.push(IsolatedMount {
            path: clean_path("overlay path", &o.path)?,
            mode: mode as i32,
            persist: o.persist.unwrap_or(true) && mode == MountMode::Overlay,
        });
    }
    if overlays.is_empty() || overlays.len() > MAX_OVERLAYS {
        return Err(bad(format!("a session takes 1 to {MAX_OVERLAYS} overlays (workspace included)")));
    }
    let extra_writable = b
        .extra_writable
        .unwrap_or_default()
        .iter()
        .map(|p| clean_path("extra_writable path", p))
        .collect::<ApiResult<Vec<_>>>()?;
    let binds = b
        .binds
        .unwrap_or_default()
        .into_iter()
        .map(|x| {
            let source = clean_path("bind source", &x.source)?;
            let dest = clean_path("bind dest", x.dest.as_deref().unwrap_or(&x.source))?;
            Ok(IsolatedBind { source, dest, readonly: x.readonly.unwrap_or(false) })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    // Every mount point once: two mounts at one path would hide one another.
    let mut seen = std::collections::HashSet::new();
    let dests = overlays.iter().map(|m| m.path.as_str()).chain(binds.iter().map(|x| x.dest.as_str()));
    for d in dests.chain(extra_writable.iter().map(String::as_str)) {
        if !seen.insert(d) {
            return Err(bad(format!(
                "{d:?} is mounted twice (overlays, binds and extra_writable must not share a path)"
            )));
        }
    }
    if binds.iter().map(|x| x.dest.as_str()).chain(extra_writable.iter().map(String::as_str)).any(|d| d == "/") {
        return Err(bad("a bind cannot cover / (an overlay of \"/\" with mode \"rw\" makes the root writable)".into()));
    }
    // A session has a /proc and a /dev of its own; the sandbox's are not its to mount.
    let all = overlays.iter().map(|m| m.path.as_str()).chain(extra_writable.iter().map(String::as_str));
    let all = all.chain(binds.iter().flat_map(|x| [x.source.as_str(), x.dest.as_str()]));
    for p in all {
        if ["/proc", "/dev"].iter().any(|top| p == *top || p.starts_with(&format!("{top}/"))) {
            return Err(bad(format!(
                "{p:?}: a session has its own /proc and /dev; they cannot be mounted from the sandbox"
            )));
        }
    }
    let env = match b.env_passthrough {
        None => None,
        Some(e) => {
            let mode = match e.mode.as_deref().unwrap_or("deny") {
                "deny" => EnvMode::Deny,
                "allow" => EnvMode::Allow,
                other => return Err(bad(format!("env_passthrough.mode {other:?} is not one of \"deny\", \"allow\""))),
            };
            let keys = e.keys.unwrap_or_default();
            if let Some(k) = keys.iter().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
                return Err(bad(format!("env_passthrough key {k:?} is not a variable name")));
            }
            Some(EnvPassthrough { mode: mode as i32, keys })
        }
    };
    match b.uid_mode.as_deref().unwrap_or("setpriv") {
        "setpriv" => {}
        "userns" => {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "NOT_SUPPORTED",
                "uid_mode \"userns\" is not supported by this server (see /v1/isolated/capabilities); \"setpriv\" is",
            ))
        }
        other => return Err(bad(format!("uid_mode {other:?} is not one of \"setpriv\", \"userns\""))),
    }
    let uid = b.uid.map(|v| id_of("uid", v)).transpose()?;
    let gid = b.gid.map(|v| id_of("gid", v)).transpose()?;
    if gid.is_some() && uid.is_none() {
        return Err(bad("gid requires uid".into()));
    }
    let idle = match b.idle_timeout_seconds {
        None => DEFAULT_IDLE_TIMEOUT,
        Some(t) => u32::try_from(t).map_err(|_| bad(format!("idle_timeout_seconds must be 0 or more, got {t}")))?,
    };
    Ok(IsolatedSessionSpec {
        profile: profile as i32,
        overlays,
        from_workspace,
        extra_writable,
        binds,
        share_net: b.share_net.unwrap_or(true),
        env,
        uid,
        gid,
        idle_timeout_seconds: idle,
    })
}

fn mode_name(m: MountMode) -> &'static str {
    match m {
        MountMode::Overlay => "overlay",
        MountMode::Rw => "rw",
        MountMode::Ro => "ro",
    }
}

fn overlay_json(m: &IsolatedMount) -> Value {
    let mut v = json!({"path": m.path, "mode": mode_name(m.mode())});
    if m.mode() == MountMode::Overlay {
        v["persist"] = Value::Bool(m.persist);
    }
    v
}

/// The creation parameters a session echoes (`IsolatedSessionInfo`,
/// `SessionState`): the effective ones, defaults resolved; `uid`/`gid` are
/// the ids its processes run as.
pub fn echo(spec: &IsolatedSessionSpec, uid: u32, gid: u32) -> Map<String, Value> {
    let mut m = Map::new();
    let profile = if spec.profile() == IsolationProfile::Balanced { "balanced" } else { "strict" };
    m.insert("profile".into(), json!(profile));
    if spec.from_workspace && spec.overlays.len() == 1 {
        let w = &spec.overlays[0];
        m.insert("workspace".into(), json!({"path": w.path, "mode": mode_name(w.mode())}));
    }
    m.insert("overlays".into(), Value::Array(spec.overlays.iter().map(overlay_json).collect()));
    m.insert("extra_writable".into(), json!(spec.extra_writable));
    let binds: Vec<Value> =
        spec.binds.iter().map(|b| json!({"source": b.source, "dest": b.dest, "readonly": b.readonly})).collect();
    m.insert("binds".into(), Value::Array(binds));
    m.insert("share_net".into(), json!(spec.share_net));
    if let Some(e) = &spec.env {
        let mode = if e.mode() == EnvMode::Allow { "allow" } else { "deny" };
        m.insert("env_passthrough".into(), json!({"mode": mode, "keys": e.keys}));
    }
    m.insert("uid".into(), json!(uid));
    m.insert("gid".into(), json!(gid));
    m.insert("uid_mode".into(), json!("setpriv"));
    m.insert("idle_timeout_seconds".into(), json!(spec.idle_timeout_seconds));
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::parse_json;

    fn spec(body: &str) -> ApiResult<IsolatedSessionSpec> {
        resolve(parse_json(body.as_bytes())?)
    }

    fn err(body: &str) -> ApiError {
        spec(body).expect_err(body)
    }

    #[test]
    fn the_legacy_workspace_takes_the_profiles_default_mode() {
        let s = spec(r#"{"workspace":{"path":"/workspace"}}"#).unwrap();
        assert_eq!((s.overlays[0].mode(), s.overlays[0].persist), (MountMode::Overlay, true));
        assert!(s.from_workspace && s.share_net);
        assert_eq!(
            (s.profile(), s.idle_timeout_seconds, s.uid),
            (IsolationProfile::Strict, DEFAULT_IDLE_TIMEOUT, None)
        );
        let s = spec(r#"{"profile":"balanced","workspace":{"path":"/w"}}"#).unwrap();
        assert_eq!(s.overlays[0].mode(), MountMode::Rw);
    }

    #[test]
    fn workspace_comes_first_and_overlays_default_to_persistent_overlays() {
        let s = spec(
            r#"{"workspace":{"path":"/w","mode":"ro"},"overlays":[{"path":"/a"},{"path":"/b","persist":false},{"path":"/c","mode":"rw"}]}"#,
        )
        .unwrap();
        let got: Vec<_> = s.overlays.iter().map(|m| (m.path.as_str(), m.mode(), m.persist)).collect();
        assert_eq!(
            got,
            [
                ("/w", MountMode::Ro, false),
                ("/a", MountMode::Overlay, true),
                ("/b", MountMode::Overlay, false),
                ("/c", MountMode::Rw, false)
            ]
        );
    }

    #[test]
    fn bad_options_are_400s() {
        for body in [
            r#"{}"#,
            r#"{"overlays":[]}"#,
            r#"{"workspace":{"path":"relative"}}"#,
            r#"{"workspace":{"path":"/a/"}}"#,
            r#"{"workspace":{"path":"/a/../b"}}"#,
            r#"{"workspace":{"path":"/a//b"}}"#,
            r#"{"workspace":{"path":"/w","mode":"rwx"}}"#,
            r#"{"overlays":[{"path":"/w","mode":"rw","persist":true}]}"#,
            r#"{"overlays":[{"path":"/w"},{"path":"/w"}]}"#,
            r#"{"workspace":{"path":"/w"},"binds":[{"source":"/x","dest":"/w"}]}"#,
            r#"{"workspace":{"path":"/w"},"binds":[{"source":"/x","dest":"/"}]}"#,
            r#"{"workspace":{"path":"/w"},"extra_writable":["/"]}"#,
            r#"{"workspace":{"path":"/w"},"profile":"paranoid"}"#,
            r#"{"workspace":{"path":"/w"},"env_passthrough":{"mode":"maybe","keys":[]}}"#,
            r#"{"workspace":{"path":"/w"},"env_passthrough":{"mode":"allow","keys":["A=B"]}}"#,
            r#"{"workspace":{"path":"/w"},"uid":-1}"#,
            r#"{"workspace":{"path":"/w"},"uid":4294967295}"#,
            r#"{"workspace":{"path":"/w"},"gid":5}"#,
            r#"{"workspace":{"path":"/w"},"uid_mode":"sudo"}"#,
            r#"{"workspace":{"path":"/w"},"idle_timeout_seconds":-5}"#,
            r#"{"workspace":{"path":"/w"},"shared_net":false}"#,
            r#"{"workspace":{"path":"/proc"}}"#,
            r#"{"workspace":{"path":"/w"},"binds":[{"source":"/dev/shm","dest":"/mnt/shm"}]}"#,
            r#"{"workspace":{"path":"/w"},"extra_writable":["/dev"]}"#,
        ] {
            assert_eq!(err(body).status, StatusCode::BAD_REQUEST, "{body}");
        }
        let many: Vec<String> = (0..=MAX_OVERLAYS).map(|i| format!(r#"{{"path":"/w{i}"}}"#)).collect();
        assert_eq!(err(&format!(r#"{{"overlays":[{}]}}"#, many.join(","))).status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn userns_is_not_supported() {
        let e = err(r#"{"workspace":{"path":"/w"},"uid_mode":"userns"}"#);
        assert_eq!((e.status, e.code), (StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED"));
    }

    #[test]
    fn echo_shows_the_effective_parameters() {
        let s = spec(
            r#"{"workspace":{"path":"/w"},"binds":[{"source":"/data"}],"extra_writable":["/cache"],"env_passthrough":{"mode":"allow","keys":["K"]},"uid":1000,"idle_timeout_seconds":0}"#,
        )
        .unwrap();
        let e = Value::Object(echo(&s, 1000, 1000));
        assert_eq!(e["workspace"], json!({"path": "/w", "mode": "overlay"}));
        assert_eq!(e["overlays"], json!([{"path": "/w", "mode": "overlay", "persist": true}]));
        assert_eq!(e["binds"], json!([{"source": "/data", "dest": "/data", "readonly": false}]));
        assert_eq!(e["env_passthrough"], json!({"mode": "allow", "keys": ["K"]}));
        assert_eq!((e["uid"].clone(), e["idle_timeout_seconds"].clone()), (json!(1000), json!(0)));
        let s = spec(r#"{"overlays":[{"path":"/a","mode":"ro"}]}"#).unwrap();
        let e = echo(&s, 0, 0);
        assert!(!e.contains_key("workspace") && !e.contains_key("env_passthrough"));
        assert_eq!(e["overlays"], json!([{"path": "/a", "mode": "ro"}]));
    }
}

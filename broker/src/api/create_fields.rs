//! The fields of a create that pvisor answers explicitly instead of dropping:
//! `platform` (only this host's), `resourceRequests` (checked like the
//! limits and shown back), `secureAccess` (every pvisor endpoint is behind a
//! per-sandbox token already), `extensions` (`poolRef`, renew-on-access, the
//! `pvisor.io/` keys; other keys are opaque and shown back) and any top-level
//! field the API does not define.
use super::limits::{self, Bounds, LimitError};
use crate::sandbox::requested::Platform;
use pvisor_worker::config::Limits;
use std::collections::BTreeMap;

/// The `extensions` key naming a pool.
pub const POOL_REF: &str = "poolRef";
/// OSEP-0009 renew-on-access, which this server does not do.
pub const RENEW_ON_ACCESS: &str = "access.renew.extend.seconds";
/// pvisor's own `extensions` keys.
const PVISOR_PREFIX: &str = "pvisor.io/";
const PVISOR_KEYS: [&str; 1] = [crate::sandbox::backend::EXTENSION];

/// The top-level fields of OpenSandbox's `CreateSandboxRequest` (SDK 1.1.1).
const KNOWN_FIELDS: [&str; 16] = [
    "image",
    "snapshotId",
    "templateId",
    "platform",
    "timeout",
    "resourceLimits",
    "resourceRequests",
    "env",
    "metadata",
    "lifecycle",
    "entrypoint",
    "networkPolicy",
    "credentialProxy",
    "secureAccess",
    "volumes",
    "extensions",
];

/// Why a create was refused over one of these fields (always a 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FieldError {
    #[error("platform {os}/{arch} cannot run on this server: its sandboxes are linux/{host}")]
    PlatformUnsupported { os: String, arch: String, host: &'static str },
    #[error("{}", .0.to_string().replacen("resourceLimits", "resourceRequests", 1))]
    Request(LimitError),
    #[error("resourceRequests.{key}: {request:?} is more than the sandbox's limit ({limit})")]
    RequestAboveLimit { key: String, request: String, limit: String },
    #[error("extensions.poolRef: no pool {0:?} on this server ({1})")]
    PoolNotFound(String, String),
    #[error("extensions.poolRef cannot be used together with {0}")]
    PoolConflict(&'static str),
    #[error("extensions.{RENEW_ON_ACCESS}: renew-on-access is not supported by this server; renew with POST /sandboxes/{{id}}/renew-expiration")]
    RenewOnAccess,
    #[error("extensions.{0}: unknown pvisor extension (known: {known})", known = PVISOR_KEYS.join(", "))]
    UnknownPvisorKey(String),
    #[error("{0} is not a field of a create request this server knows; remove it or leave it null")]
    UnknownField(String),
}

impl FieldError {
    /// The API error code.
    pub fn code(&self) -> &'static str {
        match self {
            FieldError::PlatformUnsupported { .. } => "PLATFORM_UNSUPPORTED",
            FieldError::Request(e) => e.code(),
            FieldError::RequestAboveLimit { .. } => "RESOURCE_REQUEST_ABOVE_LIMIT",
            FieldError::PoolNotFound(..) => "POOL_NOT_FOUND",
            FieldError::PoolConflict(_) => "INVALID_PARAMETER",
            FieldError::RenewOnAccess => "EXTENSION_UNSUPPORTED",
            FieldError::UnknownPvisorKey(_) => "EXTENSION_UNKNOWN",
            FieldError::UnknownField(_) => "UNKNOWN_FIELD",
        }
    }
}

impl From<FieldError> for super::error::ApiError {
    fn from(e: FieldError) -> Self {
        super::error::ApiError::new(axum::http::StatusCode::BAD_REQUEST, e.code(), e.to_string())
    }
}

/// The API's name of this host's architecture (Go's, as OCI and the SDK spell it).
pub fn host_arch() -> &'static str {
    arch_name(std::env::consts::ARCH).unwrap_or(std::env::consts::ARCH)
}

/// `amd64`/`x86_64`/`x86-64` → `amd64`, `arm64`/`aarch64` → `arm64`.
fn arch_name(arch: &str) -> Option<&'static str> {
    match arch.trim().to_ascii_lowercase().as_str() {
        "amd64" | "x86_64" | "x86-64" => Some("amd64"),
        "arm64" | "aarch64" => Some("arm64"),
        _ => None,
    }
}

/// The platform a create asks for, if this host runs it ("must fail
/// explicitly" otherwise): linux on the host's own architecture.
pub fn check_platform(p: &Platform) -> Result<Platform, FieldError> {
    let host = host_arch();
    let os_ok = p.os.trim().eq_ignore_ascii_case("linux");
    match arch_name(&p.arch) {
        Some(a) if os_ok && a == host => Ok(Platform { os: "linux".into(), arch: host.into() }),
        _ => Err(FieldError::PlatformUnsupported { os: p.os.clone(), arch: p.arch.clone(), host }),
    }
}

/// Checks `resourceRequests` as the limits are checked (known keys, strict
/// quantities, the host's bounds), and that no request exceeds its limit
/// (`limits`: the sandbox's, the server's defaults included).
pub fn check_requests(req: &BTreeMap<String, String>, limits: &Limits, bounds: &Bounds) -> Result<(), FieldError> {
    let asked = limits::from_request(Some(req), *limits, bounds).map_err(FieldError::Request)?;
    for (key, value) in req {
        let (r, l) = match key.as_str() {
            "cpu" => (asked.cpu_millis, limits.cpu_millis),
            "memory" => (asked.memory_bytes, limits.memory_bytes),
            "pids" => (asked.pids, limits.pids),
            // 0: the server bounds no disk.
            limits::EPHEMERAL_STORAGE if limits.disk_bytes == 0 => continue,
            limits::EPHEMERAL_STORAGE => (asked.disk_bytes, limits.disk_bytes),
            _ => continue,
        };
        if r > l {
            let limit = match key.as_str() {
                "cpu" => format!("{l}m"),
                "pids" => l.to_string(),
                _ => format!("{l} bytes"),
            };
            return Err(FieldError::RequestAboveLimit { key: key.clone(), request: value.clone(), limit });
        }
    }
    Ok(())
}

/// The pool a create names, if it may be served by it: only the warm workers'
/// (`default`, when `--warm-workers` is above 0), and not for a restore.
pub fn check_pool(
    extensions: Option<&BTreeMap<String, String>>,
    warm_workers: usize,
    snapshot: bool,
) -> Result<Option<String>, FieldError> {
    let Some(name) = extensions.and_then(|e| e.get(POOL_REF)).map(|s| s.trim()).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let warm = crate::sandbox::pool::WARM_POOL;
    if name != warm {
        let have = match warm_workers {
            0 => "it has no pool: --warm-workers is 0".to_string(),
            _ => format!("its only pool is {warm:?}, the warm workers"),
        };
        return Err(FieldError::PoolNotFound(name.into(), have));
    }
    if warm_workers == 0 {
        return Err(FieldError::PoolNotFound(name.into(), "it has no pool: --warm-workers is 0".into()));
    }
    if snapshot {
        return Err(FieldError::PoolConflict("snapshotId"));
    }
    Ok(Some(name.into()))
}

/// The `extensions` keys no create may give here: renew-on-access, and a
/// `pvisor.io/` key pvisor does not know (a typo would otherwise be dropped).
pub fn check_extensions(extensions: Option<&BTreeMap<String, String>>) -> Result<(), FieldError> {
    for key in extensions.into_iter().flat_map(|e| e.keys()) {
        if key == RENEW_ON_ACCESS {
            return Err(FieldError::RenewOnAccess);
        }
        if key.starts_with(PVISOR_PREFIX) && !PVISOR_KEYS.contains(&key.as_str()) {
            return Err(FieldError::UnknownPvisorKey(key.clone()));
        }
    }
    Ok(())
}

/// A top-level field the API does not define is refused, unless it holds an
/// empty value (null, false, "", [], {}), which a newer SDK may send by default.
pub fn check_unknown_fields(body: &serde_json::Map<String, serde_json::Value>) -> Result<(), FieldError> {
    check_fields(body, &KNOWN_FIELDS)
}

/// [`check_unknown_fields`] for another body and its fields.
pub fn check_fields(body: &serde_json::Map<String, serde_json::Value>, known: &[&str]) -> Result<(), FieldError> {
    use serde_json::Value;
    for (k, v) in body {
        let empty = match v {
            Value::Null | Value::Bool(false) => true,
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if !empty && !known.contains(&k.as_str()) {
            return Err(FieldError::UnknownField(k.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds { max_memory: 24 << 30, max_disk: Ok(100 << 30) };

    fn m(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn platform(os: &str, arch: &str) -> Platform {
        Platform { os: os.into(), arch: arch.into() }
    }

    #[test]
    fn the_hosts_platform_is_accepted_in_every_spelling() {
        let (go, uname) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", "x86_64"),
            "aarch64" => ("arm64", "aarch64"),
            other => panic!("untested architecture {other}"),
        };
        for arch in [go, uname, &go.to_uppercase()] {
            let p = check_platform(&platform("linux", arch)).expect(arch);
            assert_eq!(p, platform("linux", go), "shown back as the API spells it");
        }
        assert!(check_platform(&platform("Linux", go)).is_ok());
    }

    #[test]
    fn another_platform_fails_explicitly() {
        let other = if host_arch() == "amd64" { "arm64" } else { "amd64" };
        for p in [platform("linux", other), platform("windows", host_arch()), platform("linux", "riscv64")] {
            let e = check_platform(&p).unwrap_err();
            assert_eq!(e.code(), "PLATFORM_UNSUPPORTED");
            assert!(e.to_string().contains(&format!("{}/{}", p.os, p.arch)), "{e}");
            assert!(e.to_string().contains(&format!("linux/{}", host_arch())), "{e}");
        }
    }

    #[test]
    fn requests_are_checked_like_limits() {
        let limits = Limits { cpu_millis: 2000, memory_bytes: 2 << 30, pids: 1024, disk_bytes: 0 };
        assert_eq!(check_requests(&m(&[("cpu", "500m"), ("memory", "1Gi")]), &limits, &B), Ok(()));
        assert_eq!(check_requests(&m(&[("cpu", "2"), ("memory", "2Gi"), ("pids", "1024")]), &limits, &B), Ok(()));
        let e = check_requests(&m(&[("gpu", "1")]), &limits, &B).unwrap_err();
        assert_eq!(e.code(), "RESOURCE_LIMIT_UNKNOWN");
        assert!(e.to_string().starts_with("resourceRequests:"), "{e}");
        let e = check_requests(&m(&[("cpu", "lots")]), &limits, &B).unwrap_err();
        assert_eq!(e.code(), "RESOURCE_LIMIT_INVALID");
        assert!(e.to_string().starts_with("resourceRequests.cpu:"), "{e}");
        let e = check_requests(&m(&[("memory", "100Ti")]), &limits, &B).unwrap_err();
        assert_eq!(e.code(), "RESOURCE_LIMIT_OUT_OF_RANGE");
    }

    #[test]
    fn a_request_above_its_limit_is_refused() {
        let limits = Limits { cpu_millis: 1000, memory_bytes: 512 << 20, pids: 256, disk_bytes: 1 << 30 };
        for (k, v) in [("cpu", "1500m"), ("memory", "1Gi"), ("pids", "300"), ("ephemeral-storage", "2Gi")] {
            let e = check_requests(&m(&[(k, v)]), &limits, &B).unwrap_err();
            assert_eq!(e.code(), "RESOURCE_REQUEST_ABOVE_LIMIT", "{k}");
            assert!(e.to_string().contains(&format!("resourceRequests.{k}")), "{e}");
        }
        // No disk bound: any disk request within the host's bounds is below it.
        let unbounded = Limits { disk_bytes: 0, ..limits };
        assert_eq!(check_requests(&m(&[("ephemeral-storage", "50Gi")]), &unbounded, &B), Ok(()));
    }

    #[test]
    fn pool_ref_names_the_warm_pool_or_is_refused_by_name() {
        let ext = |v: &str| m(&[(POOL_REF, v)]);
        assert_eq!(check_pool(None, 2, false), Ok(None));
        assert_eq!(check_pool(Some(&ext("  ")), 2, false), Ok(None), "a blank poolRef names no pool");
        assert_eq!(check_pool(Some(&ext("default")), 2, false), Ok(Some("default".into())));
        let e = check_pool(Some(&ext("gpu-pool")), 2, false).unwrap_err();
        assert_eq!(e.code(), "POOL_NOT_FOUND");
        assert!(e.to_string().contains("\"gpu-pool\""), "{e}");
        let e = check_pool(Some(&ext("default")), 0, false).unwrap_err();
        assert_eq!(e.code(), "POOL_NOT_FOUND");
        assert!(e.to_string().contains("--warm-workers"), "{e}");
        assert_eq!(check_pool(Some(&ext("default")), 2, true), Err(FieldError::PoolConflict("snapshotId")));
    }

    #[test]
    fn extensions_pvisor_does_not_serve_are_refused() {
        assert_eq!(check_extensions(None), Ok(()));
        assert_eq!(check_extensions(Some(&m(&[("pvisor.io/backend", "ns"), ("team.x/y", "z")]))), Ok(()));
        assert_eq!(check_extensions(Some(&m(&[(RENEW_ON_ACCESS, "600")]))), Err(FieldError::RenewOnAccess));
        let e = check_extensions(Some(&m(&[("pvisor.io/backnd", "vm")]))).unwrap_err();
        assert_eq!(e.code(), "EXTENSION_UNKNOWN");
    }

    #[test]
    fn unknown_fields_are_refused_unless_empty() {
        let body = |j: serde_json::Value| j.as_object().cloned().unwrap();
        let sdk = serde_json::json!({"image": {"uri": "busybox"}, "timeout": null, "secureAccess": false,
            "resourceLimits": {"cpu": "1"}, "entrypoint": ["sleep", "1"]});
        assert_eq!(check_unknown_fields(&body(sdk)), Ok(()));
        let defaults = serde_json::json!({"newFlag": false, "newList": [], "newMap": {}, "newText": "", "x": null});
        assert_eq!(check_unknown_fields(&body(defaults)), Ok(()));
        let e = check_unknown_fields(&body(serde_json::json!({"gpus": 2}))).unwrap_err();
        assert_eq!(e, FieldError::UnknownField("gpus".into()));
    }
}

//! The `volumes` of a create request, parsed and checked without touching
//! anything: every refusal is a 400 with its `VOLUME::` code, before any
//! state exists (the reference server's validation, api-surface.md §2).
use super::error::VolumeError;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// One entry of `volumes` as the SDK sends it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    name: String,
    mount_path: String,
    #[serde(default)]
    read_only: Option<bool>,
    #[serde(default)]
    sub_path: Option<String>,
    #[serde(default)]
    host: Option<Value>,
    #[serde(default)]
    pvc: Option<Value>,
    #[serde(default)]
    ossfs: Option<Value>,
    /// Anything else that is an object is taken for a backend pvisor does not know.
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
struct HostWire {
    path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PvcWire {
    claim_name: String,
    /// The SDK's default is true.
    #[serde(default)]
    create_if_not_exists: Option<bool>,
    #[serde(default)]
    delete_on_sandbox_termination: Option<bool>,
    /// Kubernetes' provisioning hints: a named volume here is a directory
    /// under the data dir, with no class, size bound or access mode, so only
    /// null (the SDK's default) is accepted.
    #[serde(default)]
    storage_class: Option<Value>,
    #[serde(default)]
    storage: Option<Value>,
    #[serde(default)]
    access_modes: Option<Value>,
}

/// Where a checked volume's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A host path under an allowed prefix: `prefix` is the operator's
    /// (canonical) prefix, `rel` the path beneath it (`subPath` included;
    /// empty for the prefix itself).
    Host { prefix: PathBuf, rel: PathBuf },
    /// A named volume (`pvc`), `sub` beneath its data (empty: all of it).
    Named { claim: String, create_if_missing: bool, delete_on_termination: bool, sub: PathBuf },
}

/// A volume that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub name: String,
    /// Absolute, normalized (no `.`, `..` or empty components).
    pub mount_path: String,
    pub read_only: bool,
    pub source: Source,
}

/// `--allow-host-path`: a prefix as the operator gave it and its canonical form.
#[derive(Debug, Clone)]
pub struct AllowedPrefix {
    pub given: PathBuf,
    pub canonical: PathBuf,
}

impl AllowedPrefix {
    /// Canonicalizes an operator's prefix (it must exist: it is the root
    /// every host volume is resolved beneath).
    pub fn new(given: &Path) -> Result<Self, String> {
        if !given.is_absolute() {
            return Err(format!("--allow-host-path {}: not an absolute path", given.display()));
        }
        let canonical =
            std::fs::canonicalize(given).map_err(|e| format!("--allow-host-path {}: {e}", given.display()))?;
        if !canonical.is_dir() {
            return Err(format!("--allow-host-path {}: not a directory", given.display()));
        }
        Ok(AllowedPrefix { given: given.to_path_buf(), canonical })
    }
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && b.iter().all(inner) && edge(&b[0]) && edge(&b[b.len() - 1])
}

/// A DNS subdomain (dot-separated labels), as Kubernetes names claims.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A relative `subPath`: no absolute path, no `..`; `.` and empty parts dropped.
fn sub_path(s: Option<&str>) -> Result<PathBuf, VolumeError> {
    let Some(s) = s else { return Ok(PathBuf::new()) };
    if s.starts_with('/') || s.contains('\0') || s.split('/').any(|c| c == "..") {
        return Err(VolumeError::InvalidSubPath(s.to_string()));
    }
    Ok(s.split('/').filter(|c| !c.is_empty() && *c != ".").collect())
}

fn mount_path(s: &str) -> Result<String, VolumeError> {
    let bad = || VolumeError::InvalidMountPath(s.to_string());
    if !s.starts_with('/') || s.contains('\0') {
        return Err(bad());
    }
    let parts: Vec<&str> = s.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    // `..` could only mean something confusing; `/` would hide the sandbox's root.
    if parts.is_empty() || parts.contains(&"..") {
        return Err(bad());
    }
    Ok(format!("/{}", parts.join("/")))
}

fn host_path(s: &str) -> Result<(), VolumeError> {
    let bad = s.is_empty()
        || !s.starts_with('/')
        || s.contains('\0')
        || s.contains("/..")
        || s.contains("//")
        || s.contains("/./")
        || s.ends_with("/.")
        || (s.len() > 1 && s.ends_with('/'));
    match bad {
        true => Err(VolumeError::InvalidHostPath(s.to_string())),
        false => Ok(()),
    }
}

/// The longest allowed prefix `path` is (component-wise) under, and the rest.
fn beneath<'a>(path: &Path, allowed: &'a [AllowedPrefix]) -> Option<(&'a AllowedPrefix, PathBuf)> {
    allowed
        .iter()
        .filter_map(|p| {
            let from = |root: &Path| path.strip_prefix(root).ok().map(Path::to_path_buf);
            from(&p.given).or_else(|| from(&p.canonical)).map(|rel| (p, rel))
        })
        .max_by_key(|(p, _)| p.given.as_os_str().len())
}

fn check_one(w: Wire, allowed: &[AllowedPrefix]) -> Result<Checked, VolumeError> {
    let mount_path = mount_path(&w.mount_path)?;
    let sub = sub_path(w.sub_path.as_deref())?;
    let unknown: Vec<&String> = w.other.iter().filter(|(_, v)| v.is_object()).map(|(k, _)| k).collect();
    let present = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let count = [present(&w.host), present(&w.pvc), present(&w.ossfs)].iter().filter(|p| **p).count() + unknown.len();
    if count != 1 {
        return Err(VolumeError::InvalidBackend { name: w.name, count });
    }
    if present(&w.ossfs) {
        return Err(VolumeError::UnsupportedBackend { name: w.name, backend: "ossfs".into() });
    }
    if let Some(k) = unknown.first() {
        return Err(VolumeError::UnsupportedBackend { name: w.name, backend: (*k).clone() });
    }
    let source = if let Some(h) = w.host.filter(|v| !v.is_null()) {
        let h: HostWire =
            serde_json::from_value(h).map_err(|e| VolumeError::Malformed(format!("{}: host: {e}", w.name)))?;
        host_path(&h.path)?;
        let full = Path::new(&h.path).join(&sub);
        let (prefix, rel) = beneath(&full, allowed).ok_or_else(|| VolumeError::HostPathNotAllowed(h.path.clone()))?;
        Source::Host { prefix: prefix.canonical.clone(), rel }
    } else {
        let p = w.pvc.unwrap_or(Value::Null);
        let p: PvcWire =
            serde_json::from_value(p).map_err(|e| VolumeError::Malformed(format!("{}: pvc: {e}", w.name)))?;
        if !is_dns_subdomain(&p.claim_name) {
            return Err(VolumeError::InvalidPvcName(p.claim_name));
        }
        let hints = [("storageClass", &p.storage_class), ("storage", &p.storage), ("accessModes", &p.access_modes)];
        if let Some((option, _)) = hints.iter().find(|(_, v)| v.as_ref().is_some_and(|v| !v.is_null())) {
            return Err(VolumeError::UnsupportedOption { name: w.name, option });
        }
        Source::Named {
            claim: p.claim_name,
            create_if_missing: p.create_if_not_exists.unwrap_or(true),
            delete_on_termination: p.delete_on_sandbox_termination.unwrap_or(false),
            sub,
        }
    };
    Ok(Checked { name: w.name, mount_path, read_only: w.read_only.unwrap_or(false), source })
}

/// Checks a request's `volumes` (absent or null: none).
pub fn check(volumes: Option<&[Value]>, allowed: &[AllowedPrefix]) -> Result<Vec<Checked>, VolumeError> {
    let Some(list) = volumes else { return Ok(Vec::new()) };
    let mut wires = Vec::with_capacity(list.len());
    for v in list {
        let w: Wire = serde_json::from_value(v.clone()).map_err(|e| VolumeError::Malformed(e.to_string()))?;
        wires.push(w);
    }
    // Names first, over the whole list (as the reference does).
    let mut seen = HashSet::new();
    for w in &wires {
        if w.name.len() > 63 || !is_dns_label(&w.name) {
            return Err(VolumeError::InvalidName(w.name.clone()));
        }
        if !seen.insert(w.name.as_str()) {
            return Err(VolumeError::DuplicateName(w.name.clone()));
        }
    }
    let checked = wires.into_iter().map(|w| check_one(w, allowed)).collect::<Result<Vec<_>, _>>()?;
    let mut mounts = HashSet::new();
    for c in &checked {
        if !mounts.insert(c.mount_path.as_str()) {
            return Err(VolumeError::InvalidMountPath(format!("{} (mounted twice)", c.mount_path)));
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prefixes() -> Vec<AllowedPrefix> {
        vec![AllowedPrefix { given: "/srv/data".into(), canonical: "/srv/data".into() }]
    }

    fn code(v: Value) -> &'static str {
        let list = v.as_array().cloned().unwrap_or_else(|| vec![v]);
        check(Some(&list), &prefixes()).map(|_| "OK").unwrap_or_else(|e| e.code())
    }

    fn host(name: &str, path: &str) -> Value {
        json!({"name": name, "mountPath": "/mnt/x", "readOnly": false, "host": {"path": path}})
    }

    #[test]
    fn accepts_host_and_pvc() {
        let pvc = json!({"name":"p","mountPath":"/mnt/p/","readOnly":true,"subPath":"a/./b","pvc":{"claimName":"v1",
            "createIfNotExists":true,"deleteOnSandboxTermination":false,"storageClass":null,"storage":null,"accessModes":null}});
        let list = vec![host("w", "/srv/data/x"), pvc];
        let c = check(Some(&list), &prefixes()).expect("valid");
        assert_eq!(c[0].source, Source::Host { prefix: "/srv/data".into(), rel: "x".into() });
        assert_eq!(c[1].mount_path, "/mnt/p");
        assert!(c[1].read_only);
        assert_eq!(
            c[1].source,
            Source::Named {
                claim: "v1".into(),
                create_if_missing: true,
                delete_on_termination: false,
                sub: "a/b".into()
            }
        );
    }

    #[test]
    fn prefix_itself_and_subpath_beneath() {
        let v = json!({"name":"w","mountPath":"/m","host":{"path":"/srv/data"},"subPath":"s/t"});
        let c = check(Some(&[v]), &prefixes()).expect("valid");
        assert_eq!(c[0].source, Source::Host { prefix: "/srv/data".into(), rel: "s/t".into() });
    }

    #[test]
    fn names() {
        assert_eq!(code(json!([host("a", "/srv/data"), host("a", "/srv/data/b")])), "VOLUME::DUPLICATE_NAME");
        assert_eq!(code(host("Bad", "/srv/data")), "VOLUME::INVALID_NAME");
        assert_eq!(code(host("-a", "/srv/data")), "VOLUME::INVALID_NAME");
        assert_eq!(code(host("a_b", "/srv/data")), "VOLUME::INVALID_NAME");
        assert_eq!(code(host(&"a".repeat(64), "/srv/data")), "VOLUME::INVALID_NAME");
        assert_eq!(code(host(&"a".repeat(63), "/srv/data")), "OK");
    }

    #[test]
    fn mount_paths() {
        let with = |m: &str| json!({"name":"a","mountPath": m,"host":{"path":"/srv/data"}});
        assert_eq!(code(with("relative")), "VOLUME::INVALID_MOUNT_PATH");
        assert_eq!(code(with("/")), "VOLUME::INVALID_MOUNT_PATH");
        assert_eq!(code(with("/a/../b")), "VOLUME::INVALID_MOUNT_PATH");
        let twice = json!([with("/m"), {"name":"b","mountPath":"/m/","host":{"path":"/srv/data"}}]);
        assert_eq!(code(twice), "VOLUME::INVALID_MOUNT_PATH");
    }

    #[test]
    fn sub_paths() {
        let with = |s: &str| json!({"name":"a","mountPath":"/m","subPath": s,"pvc":{"claimName":"v"}});
        assert_eq!(code(with("/abs")), "VOLUME::INVALID_SUB_PATH");
        assert_eq!(code(with("a/../../b")), "VOLUME::INVALID_SUB_PATH");
        assert_eq!(code(with("..")), "VOLUME::INVALID_SUB_PATH");
        assert_eq!(code(with("a..b/c")), "OK");
    }

    #[test]
    fn backends() {
        assert_eq!(code(json!({"name":"a","mountPath":"/m"})), "VOLUME::INVALID_BACKEND");
        assert_eq!(
            code(json!({"name":"a","mountPath":"/m","host":{"path":"/srv/data"},"pvc":{"claimName":"v"}})),
            "VOLUME::INVALID_BACKEND"
        );
        assert_eq!(code(json!({"name":"a","mountPath":"/m","host":null,"pvc":{"claimName":"v"}})), "OK");
        let oss = json!({"bucket":"b","endpoint":"e","accessKeyId":"k","accessKeySecret":"s","version":"2.0"});
        assert_eq!(code(json!({"name":"a","mountPath":"/m","ossfs": oss})), "VOLUME::UNSUPPORTED_BACKEND");
        assert_eq!(code(json!({"name":"a","mountPath":"/m","nfs":{"server":"x"}})), "VOLUME::UNSUPPORTED_BACKEND");
    }

    #[test]
    fn host_paths() {
        for p in ["rel", "/srv/data/../etc", "/srv//data", "/srv/data/", "/srv/./data", "/srv/data/."] {
            assert_eq!(code(host("a", p)), "VOLUME::INVALID_HOST_PATH", "{p}");
        }
        assert_eq!(code(host("a", "/srv/database")), "VOLUME::HOST_PATH_NOT_ALLOWED");
        assert_eq!(code(host("a", "/etc")), "VOLUME::HOST_PATH_NOT_ALLOWED");
        assert_eq!(code(host("a", "/srv/data/x..y")), "OK");
    }

    #[test]
    fn empty_allowlist_denies_everything() {
        let v = [host("a", "/srv/data")];
        assert_eq!(check(Some(&v), &[]).map(|_| ()).unwrap_err().code(), "VOLUME::HOST_PATH_NOT_ALLOWED");
        assert!(check(None, &[]).expect("none").is_empty());
    }

    #[test]
    fn pvc_names() {
        let with = |c: &str| json!({"name":"a","mountPath":"/m","pvc":{"claimName": c}});
        assert_eq!(code(with("Bad")), "VOLUME::INVALID_PVC_NAME");
        assert_eq!(code(with("a..b")), "VOLUME::INVALID_PVC_NAME");
        assert_eq!(code(with(&"a".repeat(254))), "VOLUME::INVALID_PVC_NAME");
        assert_eq!(code(with("data.v1")), "OK");
    }

    #[test]
    fn pvc_provisioning_hints_are_refused_unless_null() {
        let with = |k: &str, v: Value| json!({"name":"a","mountPath":"/m","pvc":{"claimName": "c", k: v}});
        for k in ["storageClass", "storage", "accessModes"] {
            assert_eq!(code(with(k, Value::Null)), "OK", "{k}: null is the SDK's default");
        }
        assert_eq!(code(with("storageClass", json!("fast"))), "VOLUME::UNSUPPORTED_OPTION");
        assert_eq!(code(with("storage", json!("1Gi"))), "VOLUME::UNSUPPORTED_OPTION");
        assert_eq!(code(with("accessModes", json!(["ReadWriteOnce"]))), "VOLUME::UNSUPPORTED_OPTION");
        let list = json!([with("storage", json!("1Gi"))]);
        let e = check(Some(list.as_array().unwrap()), &prefixes()).unwrap_err();
        assert!(e.to_string().contains("pvc.storage"), "{e}");
    }
}

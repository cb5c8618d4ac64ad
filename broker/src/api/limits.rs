//! A create's `resourceLimits` (Kubernetes-style quantities), parsed
//! strictly and bounded.
//!
//! Keys: `cpu` (cores: `"1"`, `"0.5"`, `"500m"`), `memory` (bytes with
//! `Ki`/`Mi`/`Gi`/`Ti` or `k`/`M`/`G`/`T`), `pids` (a count) and
//! `ephemeral-storage` (Kubernetes' name for a container's writable layer and
//! scratch space: the sandbox's disk bound). Any other key (`gpu` included:
//! no sandbox here can have one) is a 400, as is a quantity that is not a
//! plain decimal number with a known suffix (no exponents: `"1e30Ti"`), or
//! that lies outside [`Bounds`]: a limit the server cannot honour must not
//! turn into "unlimited" or a 500.
use pvisor_worker::config::Limits;
use std::collections::BTreeMap;

/// The disk bound's key.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

pub const MIN_CPU_MILLIS: u64 = 10;
/// 256 cores: far above any host this runs on, low enough that the cgroup
/// quota arithmetic cannot overflow.
pub const MAX_CPU_MILLIS: u64 = 256_000;
pub const MIN_MEMORY: u64 = 16 << 20;
pub const MIN_PIDS: u64 = 16;
pub const MAX_PIDS: u64 = 65_536;
/// Smallest disk bound: an image's first writes (package caches) need room.
pub const MIN_DISK: u64 = 16 << 20;

/// What this server can grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The host's RAM: more cannot be honoured.
    pub max_memory: u64,
    /// The largest disk bound, or why this server cannot bound a sandbox's
    /// disk (an unprivileged broker, say: `ephemeral-storage` is refused).
    pub max_disk: Result<u64, String>,
}

impl Bounds {
    /// Bounds for this host: its RAM (from `/proc/meminfo`, else unbounded).
    pub fn for_host(max_disk: Result<u64, String>) -> Bounds {
        Bounds { max_memory: host_memory().unwrap_or(u64::MAX), max_disk }
    }
}

/// `MemTotal` of the host, in bytes.
pub fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Why a `resourceLimits` map was refused (always a 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("resourceLimits: unknown key {0:?} (known: cpu, memory, pids, ephemeral-storage)")]
    UnknownKey(String),
    #[error("resourceLimits.{key}: {value:?} is not a valid quantity")]
    Invalid { key: &'static str, value: String },
    #[error("resourceLimits.{key}: {value:?} is out of range ({range})")]
    OutOfRange { key: &'static str, value: String, range: String },
    #[error("resourceLimits.ephemeral-storage: this server cannot bound a sandbox's disk ({0})")]
    DiskUnsupported(String),
}

impl LimitError {
    /// The API error code.
    pub fn code(&self) -> &'static str {
        match self {
            LimitError::UnknownKey(_) => "RESOURCE_LIMIT_UNKNOWN",
            LimitError::Invalid { .. } => "RESOURCE_LIMIT_INVALID",
            LimitError::OutOfRange { .. } => "RESOURCE_LIMIT_OUT_OF_RANGE",
            LimitError::DiskUnsupported(_) => "DISK_LIMIT_UNSUPPORTED",
        }
    }
}

impl From<LimitError> for super::error::ApiError {
    fn from(e: LimitError) -> Self {
        super::error::ApiError::new(axum::http::StatusCode::BAD_REQUEST, e.code(), e.to_string())
    }
}

/// A non-negative decimal `"12"`, `"0.5"` as (integer, fraction digits,
/// fraction scale); no sign, exponent or other character.
fn decimal(s: &str) -> Option<(u128, u128, u128)> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || int.len() > 30 || frac.len() > 18 {
        return None;
    }
    if s.ends_with('.') {
        return None;
    }
    let int: u128 = int.parse().ok()?;
    let scale = 10u128.pow(frac.len() as u32);
    let frac: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    Some((int, frac, scale))
}

/// `value × mult` rounded down, or `None` past `u64`.
fn scaled(s: &str, mult: u128) -> Option<u64> {
    let (int, frac, scale) = decimal(s)?;
    let v = int.checked_mul(mult)?.checked_add(frac.checked_mul(mult)? / scale)?;
    u64::try_from(v).ok()
}

fn out_of_range(key: &'static str, value: &str, range: String) -> LimitError {
    LimitError::OutOfRange { key, value: value.into(), range }
}

fn check(
    key: &'static str,
    value: &str,
    v: u64,
    min: u64,
    max: u64,
    show: fn(u64) -> String,
) -> Result<u64, LimitError> {
    if (min..=max).contains(&v) {
        return Ok(v);
    }
    Err(out_of_range(key, value, format!("{} to {}", show(min), show(max))))
}

fn show_bytes(b: u64) -> String {
    match b {
        u64::MAX => "unbounded".into(),
        b if b % (1 << 30) == 0 => format!("{}Gi", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}Mi", b >> 20),
        b => format!("{b} bytes"),
    }
}

fn show_cpu(m: u64) -> String {
    format!("{m}m")
}

/// `"1"`, `"0.5"`, `"500m"` → thousandths of a core.
pub fn parse_cpu(s: &str) -> Result<u64, LimitError> {
    let t = s.trim();
    let invalid = || LimitError::Invalid { key: "cpu", value: s.into() };
    let millis = match t.strip_suffix('m') {
        Some(m) => scaled(m, 1),
        None => scaled(t, 1000),
    };
    // A number too large for u64 is out of range, not malformed.
    let millis = match millis {
        Some(v) => v,
        None if decimal(t.trim_end_matches('m')).is_some() => u64::MAX,
        None => return Err(invalid()),
    };
    check("cpu", s, millis, MIN_CPU_MILLIS, MAX_CPU_MILLIS, show_cpu)
}

/// Byte suffixes, longest first so `Mi` is not read as `M`.
const UNITS: [(&str, u128); 9] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("k", 1000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("", 1),
];

/// `"512Mi"`, `"2Gi"`, `"1G"`, `"1048576"` → bytes (`u64::MAX` when larger).
pub fn parse_bytes(key: &'static str, s: &str) -> Result<u64, LimitError> {
    let t = s.trim();
    for (suffix, mult) in UNITS {
        let Some(num) = t.strip_suffix(suffix) else { continue };
        if decimal(num).is_none() {
            continue;
        }
        return Ok(scaled(num, mult).unwrap_or(u64::MAX));
    }
    Err(LimitError::Invalid { key, value: s.into() })
}

/// A memory limit within `16Mi..=max`.
pub fn parse_memory(s: &str, max: u64) -> Result<u64, LimitError> {
    check("memory", s, parse_bytes("memory", s)?, MIN_MEMORY, max, show_bytes)
}

/// Memory per allowed process when `pids` is not given.
const BYTES_PER_PID: u64 = 256 << 10;
const MIN_DEFAULT_PIDS: u64 = 256;
const MAX_DEFAULT_PIDS: u64 = 4096;

/// Default process limit for a memory limit: one process per 256 KiB,
/// between 256 and 4096. Far more processes than memory can hold turns a
/// fork bomb into a memory thrash that starves the sandbox's own agent;
/// within this bound the bomb stops at the pids limit instead.
pub fn default_pids(memory_bytes: u64) -> u64 {
    (memory_bytes / BYTES_PER_PID).clamp(MIN_DEFAULT_PIDS, MAX_DEFAULT_PIDS)
}

/// Applies request limits over the defaults (`pids` scales with memory
/// unless given; the disk bound is the server's unless given).
pub fn from_request(
    req: Option<&BTreeMap<String, String>>,
    defaults: Limits,
    bounds: &Bounds,
) -> Result<Limits, LimitError> {
    let mut l = defaults;
    let mut pids = None;
    for (k, v) in req.into_iter().flatten() {
        match k.as_str() {
            "cpu" => l.cpu_millis = parse_cpu(v)?,
            "memory" => l.memory_bytes = parse_memory(v, bounds.max_memory)?,
            "pids" => {
                let n = match v.trim().parse::<u64>() {
                    Ok(n) => n,
                    Err(_) if decimal(v.trim()).is_some_and(|(_, f, _)| f == 0) => u64::MAX,
                    Err(_) => return Err(LimitError::Invalid { key: "pids", value: v.clone() }),
                };
                pids = Some(check("pids", v, n, MIN_PIDS, MAX_PIDS, |n| n.to_string())?);
            }
            EPHEMERAL_STORAGE => {
                let bytes = parse_bytes(EPHEMERAL_STORAGE, v)?;
                let max = match &bounds.max_disk {
                    Ok(max) => *max,
                    Err(why) => {
                        return Err(LimitError::DiskUnsupported(format!("{why}; see `pvisor serve --disk-limit`")))
                    }
                };
                l.disk_bytes = check(EPHEMERAL_STORAGE, v, bytes, MIN_DISK, max, show_bytes)?;
            }
            _ => return Err(LimitError::UnknownKey(k.clone())),
        }
    }
    l.pids = pids.unwrap_or_else(|| default_pids(l.memory_bytes));
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds { max_memory: 24 << 30, max_disk: Ok(100 << 30) };

    fn m(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn code(v: &[(&str, &str)], b: &Bounds) -> &'static str {
        from_request(Some(&m(v)), Limits::default(), b).unwrap_err().code()
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu("1").unwrap(), 1000);
        assert_eq!(parse_cpu("0.5").unwrap(), 500);
        assert_eq!(parse_cpu("250m").unwrap(), 250);
        assert_eq!(parse_cpu(" 2 ").unwrap(), 2000);
        assert!(parse_cpu("abc").is_err());
        assert!(parse_cpu("-1").is_err());
        assert!(parse_cpu("1e3").is_err());
        assert!(parse_cpu("1.").is_err());
        assert!(parse_cpu("m").is_err());
        assert_eq!(parse_memory("512Mi", u64::MAX).unwrap(), 512 << 20);
        assert_eq!(parse_memory("2Gi", u64::MAX).unwrap(), 2 << 30);
        assert_eq!(parse_memory("1.5Gi", u64::MAX).unwrap(), 3 << 29);
        assert_eq!(parse_memory("1G", u64::MAX).unwrap(), 1_000_000_000);
        assert_eq!(parse_memory("134217728", u64::MAX).unwrap(), 128 << 20);
        assert!(parse_memory("12Zi", u64::MAX).is_err());
        assert!(parse_memory("1Ki", u64::MAX).is_err(), "below minimum");
        assert!(parse_memory("Mi", u64::MAX).is_err());
        assert!(parse_memory("NaN", u64::MAX).is_err());
        assert!(parse_memory("inf", u64::MAX).is_err());
    }

    #[test]
    fn huge_values_are_out_of_range_not_unlimited() {
        assert_eq!(code(&[("memory", "1e30Ti")], &B), "RESOURCE_LIMIT_INVALID");
        assert_eq!(code(&[("memory", "99999999999999999999999Ti")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("memory", "25Gi")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE", "more than the host has");
        assert_eq!(code(&[("cpu", "100000")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("cpu", "99999999999999999999999999")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("cpu", "5m")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("pids", "99999999999999999999999")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("pids", "1000000")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("pids", "3")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("pids", "many")], &B), "RESOURCE_LIMIT_INVALID");
        assert_eq!(code(&[("ephemeral-storage", "200Gi")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
        assert_eq!(code(&[("ephemeral-storage", "1Mi")], &B), "RESOURCE_LIMIT_OUT_OF_RANGE");
    }

    #[test]
    fn unknown_keys_are_refused_and_the_sdk_default_is_fine() {
        assert_eq!(code(&[("gpu", "1")], &B), "RESOURCE_LIMIT_UNKNOWN");
        assert_eq!(code(&[("cpu", "1"), ("nvidia.com/gpu", "1")], &B), "RESOURCE_LIMIT_UNKNOWN");
        let l = from_request(Some(&m(&[("cpu", "1"), ("memory", "2Gi")])), Limits::default(), &B).unwrap();
        assert_eq!((l.cpu_millis, l.memory_bytes), (1000, 2 << 30));
    }

    #[test]
    fn disk_bound_from_the_request_or_the_server() {
        let d = Limits { disk_bytes: 10 << 30, ..Limits::default() };
        assert_eq!(from_request(None, d, &B).unwrap().disk_bytes, 10 << 30);
        let l = from_request(Some(&m(&[("ephemeral-storage", "512Mi")])), d, &B).unwrap();
        assert_eq!(l.disk_bytes, 512 << 20);
        let unprivileged = Bounds { max_disk: Err("an unprivileged broker cannot".into()), ..B };
        assert_eq!(code(&[("ephemeral-storage", "1Gi")], &unprivileged), "DISK_LIMIT_UNSUPPORTED");
    }

    #[test]
    fn pids_scale_with_memory_unless_given() {
        let d = Limits::default();
        let pids = |v: &[(&str, &str)]| from_request(Some(&m(v)), d, &B).unwrap().pids;
        assert_eq!(pids(&[("memory", "256Mi")]), 1024);
        assert_eq!(pids(&[("memory", "512Mi")]), 2048);
        assert_eq!(pids(&[("memory", "2Gi")]), 4096);
        assert_eq!(pids(&[("memory", "32Mi")]), 256);
        assert_eq!(pids(&[("memory", "2Gi"), ("pids", "100")]), 100);
        assert_eq!(from_request(None, d, &B).unwrap().pids, 2048, "default 512 MiB");
    }
}

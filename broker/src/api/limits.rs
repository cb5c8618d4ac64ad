//! Parsing `resourceLimits` quantities (Kubernetes style).
use pvisor_worker::config::Limits;
use std::collections::BTreeMap;

/// `"1"`, `"0.5"`, `"500m"` → thousandths of a core.
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let millis = if let Some(m) = s.strip_suffix('m') {
        m.parse::<u64>().map_err(|_| format!("invalid cpu quantity {s:?}"))?
    } else {
        let v: f64 = s.parse().map_err(|_| format!("invalid cpu quantity {s:?}"))?;
        if !v.is_finite() || v < 0.0 {
            return Err(format!("invalid cpu quantity {s:?}"));
        }
        (v * 1000.0).round() as u64
    };
    if millis < 10 {
        return Err(format!("cpu {s:?} is below the minimum of 10m"));
    }
    Ok(millis)
}

/// `"512Mi"`, `"2Gi"`, `"1G"`, `"1048576"` → bytes.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let units: [(&str, u64); 10] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("", 1),
    ];
    for (suffix, mult) in units {
        if let Some(num) = s.strip_suffix(suffix) {
            if num.is_empty() {
                continue;
            }
            let v: f64 = num.parse().map_err(|_| format!("invalid memory quantity {s:?}"))?;
            if !v.is_finite() || v < 0.0 {
                return Err(format!("invalid memory quantity {s:?}"));
            }
            let bytes = (v * mult as f64) as u64;
            if bytes < 16 << 20 {
                return Err(format!("memory {s:?} is below the minimum of 16Mi"));
            }
            return Ok(bytes);
        }
    }
    Err(format!("invalid memory quantity {s:?}"))
}

/// Memory per allowed process when `pids` is not given.
const BYTES_PER_PID: u64 = 256 << 10;
const MIN_PIDS: u64 = 256;
const MAX_DEFAULT_PIDS: u64 = 4096;

/// Default process limit for a memory limit: one process per 256 KiB,
/// between 256 and 4096. Far more processes than memory can hold turns a
/// fork bomb into a memory thrash that starves the sandbox's own agent;
/// within this bound the bomb stops at the pids limit instead.
pub fn default_pids(memory_bytes: u64) -> u64 {
    (memory_bytes / BYTES_PER_PID).clamp(MIN_PIDS, MAX_DEFAULT_PIDS)
}

/// Applies request limits over the defaults (`pids` scales with memory
/// unless given).
pub fn from_request(req: Option<&BTreeMap<String, String>>, defaults: Limits) -> Result<Limits, String> {
    let mut l = defaults;
    let mut pids = None;
    if let Some(m) = req {
        if let Some(c) = m.get("cpu") {
            l.cpu_millis = parse_cpu(c)?;
        }
        if let Some(mem) = m.get("memory") {
            l.memory_bytes = parse_memory(mem)?;
        }
        if let Some(p) = m.get("pids") {
            let n: u64 = p.parse().map_err(|_| format!("invalid pids limit {p:?}"))?;
            if n < 16 {
                return Err(format!("pids limit {n} is below the minimum of 16"));
            }
            pids = Some(n);
        }
    }
    l.pids = pids.unwrap_or_else(|| default_pids(l.memory_bytes));
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu("1").unwrap(), 1000);
        assert_eq!(parse_cpu("0.5").unwrap(), 500);
        assert_eq!(parse_cpu("250m").unwrap(), 250);
        assert!(parse_cpu("abc").is_err());
        assert!(parse_cpu("-1").is_err());
        assert_eq!(parse_memory("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_memory("2Gi").unwrap(), 2 << 30);
        assert_eq!(parse_memory("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_memory("134217728").unwrap(), 128 << 20);
        assert!(parse_memory("12Zi").is_err());
        assert!(parse_memory("1Ki").is_err(), "below minimum");
    }

    #[test]
    fn pids_scale_with_memory_unless_given() {
        let d = Limits::default();
        let m = |v: &[(&str, &str)]| v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        assert_eq!(from_request(Some(&m(&[("memory", "256Mi")])), d).unwrap().pids, 1024);
        assert_eq!(from_request(Some(&m(&[("memory", "512Mi")])), d).unwrap().pids, 2048);
        assert_eq!(from_request(Some(&m(&[("memory", "2Gi")])), d).unwrap().pids, 4096);
        assert_eq!(from_request(Some(&m(&[("memory", "32Mi")])), d).unwrap().pids, 256);
        assert_eq!(from_request(Some(&m(&[("memory", "2Gi"), ("pids", "100")])), d).unwrap().pids, 100);
        assert_eq!(from_request(None, d).unwrap().pids, 2048, "default 512 MiB");
        assert!(from_request(Some(&m(&[("pids", "3")])), d).is_err());
    }
}

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

/// Applies request limits over the defaults.
pub fn from_request(req: Option<&BTreeMap<String, String>>, defaults: Limits) -> Result<Limits, String> {
    let mut l = defaults;
    if let Some(m) = req {
        if let Some(c) = m.get("cpu") {
            l.cpu_millis = parse_cpu(c)?;
        }
        if let Some(mem) = m.get("memory") {
            l.memory_bytes = parse_memory(mem)?;
        }
        if let Some(p) = m.get("pids") {
            l.pids = p.parse().map_err(|_| format!("invalid pids limit {p:?}"))?;
        }
    }
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
}

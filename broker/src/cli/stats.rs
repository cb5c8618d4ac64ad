//! `pvisor stats [--no-stream] [--json]`: CPU, memory, processes and network
//! of every sandbox, like `docker stats`. CPU % is the CPU time used between
//! two samples of `/pvisor/stats` over the wall time between them (100 % is
//! one core). Streams a table a second until interrupted; `--no-stream`
//! prints one (after a first, one-second interval).
use super::client::Client;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

const INTERVAL: Duration = Duration::from_secs(1);

/// One row: the later sample, with CPU % from the earlier one of the same sandbox.
fn rows(before: &[Value], after: &[Value]) -> Vec<Value> {
    let prev: HashMap<&str, &Value> = before.iter().filter_map(|s| Some((s["id"].as_str()?, s))).collect();
    after
        .iter()
        .map(|s| {
            let cpu = prev.get(s["id"].as_str().unwrap_or("")).and_then(|p| {
                let used = s["cpuSeconds"].as_f64()? - p["cpuSeconds"].as_f64()?;
                let wall = (s["timestampMs"].as_i64()? - p["timestampMs"].as_i64()?) as f64 / 1000.0;
                (wall > 0.0).then(|| (used / wall * 100.0).max(0.0))
            });
            let mut row = s.clone();
            row["cpuPercent"] = json!(cpu);
            row
        })
        .collect()
}

/// `1.5MiB`-style sizes.
fn size(v: &Value) -> String {
    let Some(b) = v.as_u64() else { return "-".into() };
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut x, mut u) = (b as f64, 0);
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{x:.1}{}", units[u])
    }
}

fn table(rows: &[Value]) -> String {
    let mut out =
        format!("{:<36} {:<8} {:>7} {:>10} {:>21} {:>5}\n", "ID", "STATE", "CPU %", "MEM", "NET I/O (rx / tx)", "PIDS");
    for r in rows {
        let cpu = r["cpuPercent"].as_f64().map(|c| format!("{c:.2}%")).unwrap_or_else(|| "-".into());
        let net = format!("{} / {}", size(&r["netRxBytes"]), size(&r["netTxBytes"]));
        let pids = r["pids"].as_u64().map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<36} {:<8} {:>7} {:>10} {:>21} {:>5}\n",
            r["id"].as_str().unwrap_or(""),
            r["state"].as_str().unwrap_or(""),
            cpu,
            size(&r["memoryBytes"]),
            net,
            pids
        ));
    }
    out
}

async fn sample(c: &Client) -> Result<Vec<Value>, String> {
    let v = c.get_json("/pvisor/stats").await?;
    v.as_array().cloned().ok_or_else(|| "the server's stats are not a list".to_string())
}

pub async fn stats(c: &Client, no_stream: bool, json_out: bool) -> Result<(), String> {
    let mut before = sample(c).await?;
    let clear = !no_stream && !json_out && std::io::stdout().is_terminal();
    loop {
        tokio::time::sleep(INTERVAL).await;
        let after = sample(c).await?;
        let rows = rows(&before, &after);
        let text = if json_out {
            format!("{}\n", Value::Array(rows))
        } else {
            let home = if clear { "\x1b[2J\x1b[H" } else { "" };
            format!("{home}{}", table(&rows))
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|_| out.flush()).map_err(|e| format!("stdout: {e}"))?;
        if no_stream {
            return Ok(());
        }
        before = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_comes_from_two_samples_of_the_same_sandbox() {
        let a = vec![json!({"id": "x", "cpuSeconds": 1.0, "timestampMs": 1000})];
        let b = vec![
            json!({"id": "x", "cpuSeconds": 1.5, "timestampMs": 2000, "memoryBytes": 3u64 << 20}),
            json!({"id": "new", "cpuSeconds": 0.1, "timestampMs": 2000}),
        ];
        let r = rows(&a, &b);
        assert_eq!(r[0]["cpuPercent"].as_f64(), Some(50.0));
        assert!(r[1]["cpuPercent"].is_null());
        let t = table(&r);
        assert!(t.contains("50.00%") && t.contains("3.0MiB"), "{t}");
        assert_eq!(size(&json!(512)), "512B");
    }
}

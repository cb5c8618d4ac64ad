//! `pvisor memory-merge`: kernel same-page merging as the server sees it
//! (`GET /pvisor/memory-merge`).
use super::client::Client;

const MIB: f64 = 1024.0 * 1024.0;

pub async fn show(c: &Client, json: bool) -> Result<(), String> {
    let v = c.get_json("/pvisor/memory-merge").await?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let h = &v["host"];
    let n = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    let page = n(&v["page_size"]).max(1);
    let control = match v["control"]["control"].as_str() {
        Some("pvisor") => "settings by pvisor".to_string(),
        Some("host") => "host's settings".to_string(),
        Some("off") => format!("OFF: {}", v["control"]["reason"].as_str().unwrap_or("")),
        _ => "not managed (server runs without --memory-merge)".to_string(),
    };
    println!(
        "memory merge: {}; ksmd run={} pages_to_scan={} sleep_millisecs={} ({control})",
        if v["enabled"].as_bool() == Some(true) { "on" } else { "off" },
        n(&h["run"]),
        n(&h["pages_to_scan"]),
        n(&h["sleep_millisecs"]),
    );
    println!(
        "host: {} pages shared, {} sharing (saved {:.1} MiB), {} full scans",
        n(&h["pages_shared"]),
        n(&h["pages_sharing"]),
        (n(&h["pages_sharing"]) * page) as f64 / MIB,
        n(&h["full_scans"]),
    );
    println!("{:<38} {:>14} {:>12} {:>12}", "SANDBOX", "MERGING PAGES", "MERGING MiB", "CHARGED MiB");
    for s in v["sandboxes"].as_array().into_iter().flatten() {
        println!(
            "{:<38} {:>14} {:>12.1} {:>12.1}",
            s["id"].as_str().unwrap_or(""),
            n(&s["merging_pages"]),
            n(&s["merging_bytes"]) as f64 / MIB,
            n(&s["mem_used_bytes"]) as f64 / MIB,
        );
    }
    Ok(())
}

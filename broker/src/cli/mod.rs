//! CLI commands that talk to a running daemon over HTTP.
pub mod client;
pub mod completions;
pub mod doctor;
pub mod endpoint;
pub mod exec;
pub mod image;
pub mod logs;
pub mod memory_merge;
pub mod pty;
pub mod snapshot;
pub mod stats;
pub mod volume;

use client::Client;

/// `pvisor ps [--json]`: the sandboxes with their backend, worker pid and
/// cgroup (`/pvisor/sandboxes`).
pub async fn ps(c: &Client, json: bool) -> Result<(), String> {
    let v = c.get_json("/pvisor/sandboxes").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{:<36} {:<24} {:<10} {:<7} {:<8} {:<25} CGROUP", "ID", "IMAGE", "STATE", "BACKEND", "PID", "CREATED");
    for s in v.as_array().into_iter().flatten() {
        let pid = s["workerPid"].as_u64().map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<36} {:<24} {:<10} {:<7} {:<8} {:<25} {}",
            s["id"].as_str().unwrap_or(""),
            s["image"].as_str().unwrap_or(""),
            s["state"].as_str().unwrap_or(""),
            s["backend"].as_str().unwrap_or(""),
            pid,
            s["createdAt"].as_str().unwrap_or(""),
            s["cgroup"].as_str().unwrap_or("-"),
        );
    }
    Ok(())
}

/// `pvisor rm ID...`
pub async fn rm(c: &Client, ids: &[String]) -> Result<(), String> {
    for id in ids {
        c.delete(&format!("/v1/sandboxes/{id}")).await?;
        println!("{id}");
    }
    Ok(())
}

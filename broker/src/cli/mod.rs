//! CLI commands that talk to a running daemon over HTTP.
pub mod client;
pub mod exec;
pub mod image;

use client::Client;
use serde_json::Value;

/// `pvisor ps`
pub async fn ps(c: &Client) -> Result<(), String> {
    let v = c.get_json("/v1/sandboxes?pageSize=200").await?;
    println!("{:<38} {:<28} {:<8} {:<25} EXPIRES", "ID", "IMAGE", "STATE", "CREATED");
    for s in v["items"].as_array().into_iter().flatten() {
        println!(
            "{:<38} {:<28} {:<8} {:<25} {}",
            s["id"].as_str().unwrap_or(""),
            s["image"]["uri"].as_str().unwrap_or(""),
            s["status"]["state"].as_str().unwrap_or(""),
            s["createdAt"].as_str().unwrap_or(""),
            s["expiresAt"].as_str().unwrap_or("never"),
        );
    }
    Ok(())
}

/// `pvisor image ls`
pub async fn image_ls(c: &Client) -> Result<(), String> {
    let v = c.get_json("/pvisor/images").await?;
    println!("{:<40} {:<20} {:>10}", "NAME", "ID", "SIZE");
    for i in v.as_array().into_iter().flatten() {
        let id = i["id"].as_str().unwrap_or("").trim_start_matches("sha256:");
        let size = i["size_bytes"].as_u64().unwrap_or(0);
        let names: Vec<&str> = i["names"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let names = if names.is_empty() { vec!["<none>"] } else { names };
        for n in names {
            println!("{:<40} {:<20} {:>9.1}M", n, &id[..12.min(id.len())], size as f64 / 1e6);
        }
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

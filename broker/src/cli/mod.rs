//! CLI commands that talk to a running daemon over HTTP.
pub mod client;
pub mod doctor;
pub mod exec;
pub mod image;
pub mod memory_merge;
pub mod snapshot;
pub mod volume;

use client::Client;

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

/// `pvisor rm ID...`
pub async fn rm(c: &Client, ids: &[String]) -> Result<(), String> {
    for id in ids {
        c.delete(&format!("/v1/sandboxes/{id}")).await?;
        println!("{id}");
    }
    Ok(())
}

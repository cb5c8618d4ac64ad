//! `pvisor snapshot ls|rm`: the daemon's snapshots (it owns their records).
use super::client::Client;

/// `pvisor snapshot ls [--sandbox ID] [--json]`: every snapshot, newest first.
pub async fn ls(c: &Client, sandbox: Option<&str>, json: bool) -> Result<(), String> {
    let mut items = Vec::new();
    let mut page = 1;
    loop {
        let mut path = format!("/v1/snapshots?pageSize=200&page={page}");
        if let Some(s) = sandbox {
            path.push_str(&format!(
                "&sandboxId={}",
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
        let v = c.get_json(&path).await?;
        items.extend(v["items"].as_array().cloned().unwrap_or_default());
        if !v["pagination"]["hasNextPage"].as_bool().unwrap_or(false) {
            break;
        }
        page += 1;
    }
    if json {
        println!("{}", serde_json::Value::Array(items));
        return Ok(());
    }
    println!("{:<38} {:<38} {:<9} {:<20} {:<25} REASON", "ID", "SANDBOX", "STATE", "NAME", "CREATED");
    for s in &items {
        println!(
            "{:<38} {:<38} {:<9} {:<20} {:<25} {}",
            s["id"].as_str().unwrap_or(""),
            s["sandboxId"].as_str().unwrap_or(""),
            s["status"]["state"].as_str().unwrap_or(""),
            s["name"].as_str().unwrap_or("-"),
            s["createdAt"].as_str().unwrap_or(""),
            s["status"]["reason"].as_str().unwrap_or(""),
        );
    }
    Ok(())
}

/// `pvisor snapshot rm ID...`
pub async fn rm(c: &Client, ids: &[String]) -> Result<(), String> {
    for id in ids {
        c.delete(&format!("/v1/snapshots/{id}")).await?;
        println!("{id}");
    }
    Ok(())
}

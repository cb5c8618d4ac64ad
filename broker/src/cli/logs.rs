//! `pvisor logs [-f] ID`: the entrypoint's output, which the sandbox's agent
//! keeps (bounded) as the background command `entrypoint`; read through the
//! execd logs route with its tail cursor. `-f` polls for more until the
//! entrypoint has ended and everything is printed, or the sandbox is gone.
use super::client::Client;
use super::endpoint::Endpoint;
use std::io::Write;
use std::time::Duration;

/// The agent's command id of the entrypoint.
const ENTRYPOINT: &str = "entrypoint";
const POLL: Duration = Duration::from_millis(300);

/// Prints the output from `cursor` on; returns the next cursor.
async fn print_from(c: &Client, ep: &Endpoint, cursor: u64) -> Result<u64, String> {
    let (headers, body) =
        c.checked_with("GET", &ep.url(&format!("/command/{ENTRYPOINT}/logs?cursor={cursor}")), &ep.headers()).await?;
    let mut out = std::io::stdout().lock();
    out.write_all(&body).and_then(|_| out.flush()).map_err(|e| format!("stdout: {e}"))?;
    let next = headers.get("execd-commands-tail-cursor").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    Ok(next.unwrap_or(cursor))
}

async fn entrypoint_running(c: &Client, ep: &Endpoint) -> Result<bool, String> {
    let (_, body) = c.checked_with("GET", &ep.url(&format!("/command/status/{ENTRYPOINT}")), &ep.headers()).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    Ok(v["running"].as_bool().unwrap_or(false))
}

pub async fn logs(c: &Client, id: &str, follow: bool) -> Result<(), String> {
    let ep = Endpoint::of(c, id).await?;
    let mut cursor = print_from(c, &ep, 0).await?;
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(POLL).await;
        // Checked before the read, so output written just before the end is printed.
        let running = match entrypoint_running(c, &ep).await {
            Ok(r) => r,
            Err(_) => return Ok(()), // the sandbox is gone (or no longer running)
        };
        match print_from(c, &ep, cursor).await {
            Ok(next) => cursor = next,
            Err(_) => return Ok(()),
        }
        if !running {
            return Ok(());
        }
    }
}

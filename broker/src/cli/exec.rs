//! `pvisor exec ID -- CMD...`: runs a command through the data plane and
//! relays its output; exits with the command's exit code.
use super::client::Client;
use super::endpoint::Endpoint;
use http_body_util::BodyExt;
use serde_json::Value;
use std::io::Write;

pub async fn exec(c: &Client, id: &str, argv: &[String]) -> Result<i32, String> {
    let ep = Endpoint::of(c, id).await?;
    let mut hdrs = ep.headers();
    hdrs.push(("accept", "text/event-stream"));
    let body = serde_json::json!({ "argv": argv });
    let mut r = c.send("POST", &ep.url("/command"), &hdrs, Some(body)).await?;
    if r.status >= 400 {
        let b = r.body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        return Err(format!("{}: {}", r.status, String::from_utf8_lossy(&b)));
    }
    let mut buf = Vec::new();
    let mut code = None;
    while let Some(frame) = r.body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.extend_from_slice(data);
        while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..pos + 2).collect();
            let text = String::from_utf8_lossy(&ev);
            let json = text.trim().strip_prefix("data:").unwrap_or(text.trim()).trim();
            let Ok(v) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            match v["type"].as_str() {
                Some("stdout") => println!("{}", v["text"].as_str().unwrap_or("")),
                Some("stderr") => eprintln!("{}", v["text"].as_str().unwrap_or("")),
                Some("execution_complete") => code = Some(0),
                Some("error") => {
                    let e = &v["error"];
                    code = Some(e["evalue"].as_str().and_then(|s| s.parse().ok()).unwrap_or(1));
                    if e["ename"] != "CommandExecError" {
                        eprintln!("pvisor: {}", e["traceback"][0].as_str().unwrap_or(""));
                    }
                }
                _ => {}
            }
        }
    }
    std::io::stdout().flush().ok();
    code.ok_or_else(|| "the command stream ended without an exit status".to_string())
}

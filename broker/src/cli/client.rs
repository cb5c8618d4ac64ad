//! A minimal HTTP client for the CLI.
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub struct Client {
    base: String,
    api_key: Option<String>,
    http: HyperClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

pub struct Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: hyper::body::Incoming,
}

impl Client {
    pub fn new(server: &str) -> Self {
        let base = if server.starts_with("http://") {
            server.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", server.trim_end_matches('/'))
        };
        Client {
            base,
            api_key: std::env::var("PVISOR_API_KEY").ok().filter(|k| !k.is_empty()),
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends a request to `url` (absolute) or a path on the server.
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<Resp, String> {
        let url = if url.starts_with("http://") { url.to_string() } else { format!("{}{url}", self.base) };
        let mut b = http::Request::builder().method(method).uri(&url);
        if let Some(k) = &self.api_key {
            b = b.header("OPEN-SANDBOX-API-KEY", k);
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let body = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Full::new(Bytes::from(v.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let req = b.body(body).map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| format!("{url}: {e} (is `pvisor serve` running?)"))?;
        let (head, body) = resp.into_parts();
        Ok(Resp { status: head.status.as_u16(), headers: head.headers, body })
    }

    /// `GET path` upgraded to `protocol` (a 101); an error status becomes
    /// its `{code, message}` as text.
    pub async fn upgrade(&self, path: &str, protocol: &str) -> Result<hyper::upgrade::Upgraded, String> {
        let url = format!("{}{path}", self.base);
        let mut b = http::Request::builder()
            .method("GET")
            .uri(&url)
            .header("connection", "upgrade")
            .header("upgrade", protocol);
        if let Some(k) = &self.api_key {
            b = b.header("OPEN-SANDBOX-API-KEY", k);
        }
        let req = b.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
        let resp = self.http.request(req).await.map_err(|e| format!("{url}: {e} (is `pvisor serve` running?)"))?;
        if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(format!(
                "{status} {}: {}",
                v["code"].as_str().unwrap_or(""),
                v["message"].as_str().unwrap_or("")
            ));
        }
        hyper::upgrade::on(resp).await.map_err(|e| format!("{url}: upgrade: {e}"))
    }

    async fn checked(&self, method: &str, path: &str) -> Result<Bytes, String> {
        self.checked_with(method, path, &[]).await.map(|(_, body)| body)
    }

    /// Sends a request without a body; an error status becomes its
    /// `{code, message}` as text. Returns the headers and body.
    pub async fn checked_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(http::HeaderMap, Bytes), String> {
        let r = self.send(method, path, headers, None).await?;
        let status = r.status;
        let body = r.body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        if status >= 400 {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return Err(format!(
                "{status} {}: {}",
                v["code"].as_str().unwrap_or(""),
                v["message"].as_str().unwrap_or("")
            ));
        }
        Ok((r.headers, body))
    }

    pub async fn get_json(&self, path: &str) -> Result<Value, String> {
        let body = self.checked("GET", path).await?;
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    }

    pub async fn delete(&self, path: &str) -> Result<(), String> {
        self.checked("DELETE", path).await.map(|_| ())
    }
}

//! A sandbox's execd endpoint (`/v1/sandboxes/{id}/endpoints/44772`): where
//! the CLI's data-plane calls go, with the sandbox's token headers.
use super::client::Client;

/// execd's port in the OpenSandbox protocol.
const EXECD_PORT: u16 = 44772;

pub struct Endpoint {
    base: String,
    headers: Vec<(String, String)>,
}

impl Endpoint {
    pub async fn of(c: &Client, id: &str) -> Result<Endpoint, String> {
        let ep = c.get_json(&format!("/v1/sandboxes/{id}/endpoints/{EXECD_PORT}")).await?;
        let endpoint = ep["endpoint"].as_str().ok_or("endpoint missing in the server's answer")?;
        let headers = ep["headers"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
            .unwrap_or_default();
        Ok(Endpoint { base: format!("http://{}", endpoint.trim_end_matches('/')), headers })
    }

    /// The absolute URL of `path` (starting with `/`) on the endpoint.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The token headers, borrowed for [`Client::send`].
    pub fn headers(&self) -> Vec<(&str, &str)> {
        self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }
}

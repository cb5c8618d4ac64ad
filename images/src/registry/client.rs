//! The registry HTTP API v2 for one repository: scheme selection (https,
//! falling back to plain http where allowed), authentication on demand
//! (a `401` triggers the Basic or Bearer flow and one retry), manifest
//! requests and blob downloads (redirects followed).

use std::time::Duration;

use ureq::http::Response;
use ureq::{Agent, Body, BodyReader, ResponseExt};

use super::auth::{self, Challenge, Credentials};
use super::error::RegistryError;
use super::http;
use super::manifest::{ACCEPT, MAX_MANIFEST};
use super::reference::ImageRef;

/// Per-read timeout of the https attempt when plain http may follow.
const HTTPS_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A manifest as served, not yet verified.
pub(crate) struct ManifestResponse {
    pub bytes: Vec<u8>,
    /// `Content-Type` without parameters.
    pub content_type: String,
    /// The registry's `Docker-Content-Digest`, if sent.
    pub digest_header: Option<String>,
}

/// A blob download in progress.
pub(crate) struct BlobResponse {
    pub reader: BodyReader<'static>,
    /// The URL the content comes from (after redirects).
    pub url: String,
    pub content_length: Option<u64>,
}

/// A connection to one repository of one registry.
pub(crate) struct Client {
    agent: Agent,
    image: ImageRef,
    /// `https://host[:port]` or `http://host[:port]`.
    base: String,
    credentials: Option<Credentials>,
    /// The `Authorization` header value in use.
    authorization: Option<String>,
    http_allowed: bool,
}

impl Client {
    /// Finds the registry (https first; plain http when `insecure_http` or
    /// the registry is on loopback and https does not work) and sets up
    /// authentication from its `/v2/` answer.
    pub fn connect(
        image: &ImageRef,
        credentials: Option<Credentials>,
        insecure_http: bool,
    ) -> Result<Client, RegistryError> {
        let http_allowed = insecure_http || image.is_loopback();
        let use_proxy = !image.is_loopback();
        let mut client = Client {
            agent: http::agent(http_allowed, use_proxy, http::READ_TIMEOUT),
            image: image.clone(),
            base: format!("https://{}", image.registry),
            credentials,
            authorization: None,
            http_allowed,
        };
        let https_url = format!("{}/v2/", client.base);
        // Where plain http may follow, a server that never answers the TLS
        // handshake must not hold the pull up for long.
        let probe =
            if http_allowed { http::agent(http_allowed, use_proxy, HTTPS_PROBE_TIMEOUT) } else { client.agent.clone() };
        let https_err = match probe.get(&https_url).call() {
            Ok(resp) => return client.after_ping(resp, &https_url).map(|()| client),
            Err(e) => http::transport_error(&https_url, e),
        };
        if !http_allowed {
            return Err(https_err);
        }
        client.base = format!("http://{}", image.registry);
        let http_url = format!("{}/v2/", client.base);
        match client.agent.get(&http_url).call() {
            Ok(resp) if resp.status().is_success() || resp.status().as_u16() == 401 => {
                tracing::debug!(registry = %image.registry, "using plain http");
                client.after_ping(resp, &http_url).map(|()| client)
            }
            // Something answers plain http, but not a registry: the https failure says more.
            Ok(_) => Err(https_err),
            Err(e) => Err(RegistryError::network(&http_url, format!("{e} (https failed too: {https_err})"))),
        }
    }

    /// Handles the answer to `GET /v2/`.
    fn after_ping(&mut self, resp: Response<Body>, url: &str) -> Result<(), RegistryError> {
        let status = resp.status().as_u16();
        match status {
            401 => self.authenticate(resp),
            500.. => Err(RegistryError::Http { url: url.to_owned(), status, message: http::error_message(resp) }),
            // 200, or an odd answer: the API requests will tell.
            _ => Ok(()),
        }
    }

    /// Sets up authorization from a `401` answer's challenges.
    fn authenticate(&mut self, resp: Response<Body>) -> Result<(), RegistryError> {
        let challenges: Vec<Challenge> = resp
            .headers()
            .get_all("www-authenticate")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(auth::parse_challenges)
            .collect();
        let message = http::error_message(resp);
        if let Some(bearer) = challenges.iter().find(|c| c.scheme == "bearer") {
            let mut scopes = vec![self.image.pull_scope()];
            if let Some(s) = bearer.params.get("scope").filter(|s| !scopes.contains(s)) {
                scopes.push(s.clone());
            }
            let token = auth::fetch_token(
                &self.agent,
                bearer,
                &scopes,
                self.credentials.as_ref(),
                &self.image.registry,
                self.http_allowed,
            )?;
            return self.set_authorization(format!("Bearer {token}"), &message);
        }
        if challenges.iter().any(|c| c.scheme == "basic") {
            let Some(header) = self.credentials.as_ref().map(Credentials::basic_header) else {
                return Err(self.unauthorized(&message));
            };
            return self.set_authorization(header, &message);
        }
        let schemes: Vec<&str> = challenges.iter().map(|c| c.scheme.as_str()).collect();
        Err(self.unauthorized(&format!("{message}; no supported authentication scheme offered ({schemes:?})")))
    }

    fn set_authorization(&mut self, value: String, message: &str) -> Result<(), RegistryError> {
        if self.authorization.as_deref() == Some(value.as_str()) {
            // Asked again for what was just sent: it is not good enough.
            return Err(self.unauthorized(message));
        }
        self.authorization = Some(value);
        Ok(())
    }

    fn unauthorized(&self, message: &str) -> RegistryError {
        let who = match &self.credentials {
            Some(c) => format!("as user {:?}", c.username),
            None => "no credentials given".to_owned(),
        };
        RegistryError::Unauthorized { registry: self.image.registry.clone(), message: format!("{message} ({who})") }
    }

    /// GET with the current authorization; a `401` re-authenticates once.
    fn get(&mut self, url: &str, accept: Option<&str>) -> Result<Response<Body>, RegistryError> {
        let mut retried = false;
        loop {
            let mut req = self.agent.get(url);
            if let Some(a) = accept {
                req = req.header("Accept", a);
            }
            if let Some(auth) = &self.authorization {
                req = req.header("Authorization", auth);
            }
            let resp = req.call().map_err(|e| http::transport_error(url, e))?;
            if resp.status().as_u16() != 401 {
                return Ok(resp);
            }
            if retried {
                return Err(self.unauthorized(&http::error_message(resp)));
            }
            retried = true;
            self.authenticate(resp)?;
        }
    }

    /// `registry/repo:tag` or `registry/repo@digest`, for errors.
    fn describe(&self, reference: &str) -> String {
        let sep = if reference.starts_with("sha256:") { '@' } else { ':' };
        format!("{}/{}{sep}{reference}", self.image.registry, self.image.repository)
    }

    /// Passes 2xx answers; maps the others to errors.
    fn check_status(&self, resp: Response<Body>, url: &str, reference: &str) -> Result<Response<Body>, RegistryError> {
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(resp),
            404 => Err(RegistryError::NotFound {
                registry: self.image.registry.clone(),
                reference: self.describe(reference),
                message: http::error_message(resp),
            }),
            403 => Err(self.unauthorized(&http::error_message(resp))),
            _ => Err(RegistryError::Http { url: url.to_owned(), status, message: http::error_message(resp) }),
        }
    }

    /// `GET /v2/<name>/manifests/<reference>` (tag or digest), at most
    /// [`MAX_MANIFEST`] bytes.
    pub fn manifest(&mut self, reference: &str) -> Result<ManifestResponse, RegistryError> {
        let url = format!("{}/v2/{}/manifests/{reference}", self.base, self.image.repository);
        let resp = self.get(&url, Some(ACCEPT))?;
        let resp = self.check_status(resp, &url, reference)?;
        let content_type = http::content_type(&resp);
        let digest_header = http::header(&resp, "docker-content-digest");
        let mut body = resp.into_body();
        let what = format!("manifest {}", self.describe(reference));
        let bytes = http::read_limited(&mut body, &url, &what, MAX_MANIFEST)?;
        Ok(ManifestResponse { bytes, content_type, digest_header })
    }

    /// `GET /v2/<name>/blobs/<digest>`, following redirects; the body is
    /// streamed by the caller.
    pub fn blob(&mut self, digest: &str) -> Result<BlobResponse, RegistryError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.image.repository);
        let resp = self.get(&url, None)?;
        let resp = self.check_status(resp, &url, digest)?;
        let final_url = resp.get_uri().to_string();
        let content_length = resp.body().content_length();
        Ok(BlobResponse { reader: resp.into_body().into_reader(), url: final_url, content_length })
    }
}

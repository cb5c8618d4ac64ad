//! Pulling from a real registry: Debian's `docker-registry` (distribution
//! 2.x) on 127.0.0.1, filled with `skopeo copy`, and for the Bearer flow a
//! small token server and an authenticating reverse proxy written here.
//!
//! Needs `/usr/bin/docker-registry`, `skopeo` and `htpasswd`
//! (`apt-get install -y docker-registry skopeo apache2-utils`) and the test
//! images (`$PVISOR_TEST_IMAGES`, default `/var/cache/pvisor/test-images`);
//! skips when the registry or the images are absent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use base64::Engine as _;
use pvisor_images::registry::{fetch, Fetched, PullEvent, PullOptions, RegistryError};
use serde_json::json;
use sha2::{Digest, Sha256};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const DEFAULT_TEST_IMAGES: &str = "/var/cache/pvisor/test-images";
const MT_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const MT_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Size of `/bin/busybox` in the test image.
const BUSYBOX_BIN_MIN: usize = 1 << 20;

// ---- prerequisites -----------------------------------------------------------

/// The busybox docker-archive, or None (after saying why) to skip.
fn prerequisites() -> Option<PathBuf> {
    if !Path::new(REGISTRY_BIN).exists() {
        pvisor_testkit::skip(format!(
            "{REGISTRY_BIN} is absent (apt-get install -y docker-registry skopeo apache2-utils)"
        ));
        return None;
    }
    let dir = std::env::var_os("PVISOR_TEST_IMAGES").map_or_else(|| PathBuf::from(DEFAULT_TEST_IMAGES), PathBuf::from);
    let busybox = dir.join("busybox.tar");
    if !busybox.is_file() {
        pvisor_testkit::skip(format!(
            "{} is absent (images/testdata/build-test-images.sh builds it)",
            busybox.display()
        ));
        return None;
    }
    Some(busybox)
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

// ---- the registry ---------------------------------------------------------------

/// A `docker-registry` process with its own storage; killed on drop.
struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`
    addr: String,
    dir: tempfile::TempDir,
}

/// A manifest as stored in the registry.
#[derive(Clone, Debug)]
struct ManifestInfo {
    digest: String,
    size: u64,
    media_type: String,
    layers: Vec<String>,
}

impl Registry {
    /// Starts a registry; `htpasswd` (file contents) turns on Basic auth.
    fn start(htpasswd: Option<&str>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let auth = match htpasswd {
            Some(entries) => {
                let file = dir.path().join("htpasswd");
                std::fs::write(&file, entries).unwrap();
                format!("auth:\n  htpasswd:\n    realm: pvisor-test\n    path: {}\n", file.display())
            }
            None => String::new(),
        };
        let log_path = dir.path().join("registry.log");
        for _ in 0..5 {
            let port = free_port();
            let config = format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: pvisor-test\n{auth}",
                dir.path().join("data").display()
            );
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log = std::fs::File::create(&log_path).unwrap();
            let mut child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("starting docker-registry");
            let addr = format!("127.0.0.1:{port}");
            if wait_ready(&mut child, &addr) {
                return Registry { child, addr, dir };
            }
            // Port taken meanwhile, or a slow start: try another one.
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start: {}", std::fs::read_to_string(&log_path).unwrap_or_default());
    }

    /// `skopeo copy docker-archive:ARCHIVE docker://ADDR/TARGET`.
    fn push(&self, archive: &Path, target: &str, creds: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some(c) = creds {
            cmd.arg("--dest-creds").arg(c);
        }
        cmd.arg(format!("docker-archive:{}", archive.display())).arg(format!("docker://{}/{target}", self.addr));
        let out = cmd.output().expect("running skopeo (apt-get install -y skopeo)");
        assert!(out.status.success(), "skopeo copy to {target} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Reads a manifest straight from the registry (no auth).
    fn manifest(&self, repo: &str, reference: &str) -> ManifestInfo {
        let url = format!("http://{}/v2/{repo}/manifests/{reference}", self.addr);
        let accept = [MT_DOCKER_MANIFEST, MT_OCI_MANIFEST, MT_DOCKER_LIST, MT_OCI_INDEX].join(", ");
        let mut resp = ureq::get(&url).header("Accept", accept).call().expect("GET manifest");
        let media_type = resp.headers().get("content-type").unwrap().to_str().unwrap().to_owned();
        let body = resp.body_mut().read_to_vec().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let layers = doc["layers"]
            .as_array()
            .map(|l| l.iter().map(|d| d["digest"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        ManifestInfo { digest: sha256(&body), size: body.len() as u64, media_type, layers }
    }

    /// PUTs a manifest list / index under `tag`; returns its digest.
    fn put_manifest(&self, repo: &str, tag: &str, media_type: &str, body: &[u8]) -> String {
        let url = format!("http://{}/v2/{repo}/manifests/{tag}", self.addr);
        ureq::put(&url).header("Content-Type", media_type).send(body).expect("PUT manifest");
        sha256(body)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the registry accepts connections; false if it exited or took too long.
fn wait_ready(child: &mut Child, addr: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if TcpStream::connect(addr).is_ok() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A registry holding busybox as `busybox:latest`.
fn registry_with_busybox(busybox: &Path) -> Registry {
    let reg = Registry::start(None);
    reg.push(busybox, "busybox:latest", None);
    reg
}

/// A one-layer docker-archive whose `/arch` file holds `arch`.
fn tiny_archive(dir: &Path, arch: &str) -> PathBuf {
    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }
    let layer = tar_of(&[("arch", arch.as_bytes())]);
    let config = serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(
        &json!([{"Config": "config.json", "RepoTags": [format!("tiny:{arch}")], "Layers": ["layer.tar"]}]),
    )
    .unwrap();
    let path = dir.join(format!("tiny-{arch}.tar"));
    std::fs::write(&path, tar_of(&[("manifest.json", &manifest), ("config.json", &config), ("layer.tar", &layer)]))
        .unwrap();
    path
}

// ---- pulling and importing ----------------------------------------------------------

/// Runs [`fetch`] into `tmp`, collecting the progress events.
fn pull(reference: &str, tmp: &Path, opts: &PullOptions) -> (Result<Fetched, RegistryError>, Vec<PullEvent>) {
    let mut events = Vec::new();
    let result = fetch(reference, tmp, opts, &mut |e| events.push(e));
    (result, events)
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// What the importer made of a pulled layout.
struct Imported {
    id: String,
    names: Vec<String>,
    /// Contents of the probed file in the image.
    probe: Vec<u8>,
}

/// Imports a pulled layout into a fresh image pool with the crate's
/// importer. The only place these tests use the image store's API.
fn import(layout: &Path, probe: &str) -> Imported {
    let root = tempfile::tempdir().unwrap();
    let pool = pvisor_images::Pool::open_with(root.path(), pvisor_images::Options::default()).expect("opening a pool");
    let records = pool.import(layout).expect("the importer takes the pulled layout");
    assert_eq!(records.len(), 1, "one image per pull");
    let view = pool.view(&records[0]).expect("viewing the image");
    let probe = view.read_path(probe).unwrap_or_else(|e| panic!("{probe} in the pulled image: {e}"));
    Imported { id: records[0].id.clone(), names: records[0].names.clone(), probe }
}

// ---- the Bearer-token test servers --------------------------------------------------

/// A request head as the test servers read it.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Reads a request head; None for anything that is not HTTP (such as the
/// client's https attempt), which is then simply dropped.
fn read_request(stream: &TcpStream) -> Option<Request> {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut r = BufReader::new(stream);
    match r.fill_buf().ok()?.first() {
        Some(b) if b.is_ascii_uppercase() => {}
        _ => return None,
    }
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    Some(Request { method, target, headers })
}

fn respond(mut stream: &TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body));
}

/// A thread accepting connections on 127.0.0.1, one thread per connection;
/// stopped on drop.
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn spawn(handler: impl Fn(TcpStream) + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(handler);
        let thread = thread::spawn({
            let stop = stop.clone();
            move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(s) = conn {
                        let h = handler.clone();
                        thread::spawn(move || h(s));
                    }
                }
            }
        });
        Server { addr, stop, thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The token service's settings and what it saw.
#[derive(Default)]
struct TokenService {
    /// Basic credentials the service insists on, if any.
    require: Option<(String, String)>,
    /// Answer `access_token` instead of `token`.
    access_token: bool,
    issued: Mutex<Vec<String>>,
    queries: Mutex<Vec<String>>,
}

/// `GET /token?service=..&scope=..` → `{"token": "tok-N"}`.
fn token_server(svc: Arc<TokenService>) -> Server {
    Server::spawn(move |s| {
        let Some(req) = read_request(&s) else { return };
        let Some(query) = req.target.strip_prefix("/token?") else {
            return respond(&s, "404 Not Found", &[], b"");
        };
        svc.queries.lock().unwrap().push(query.to_owned());
        if let Some((u, p)) = &svc.require {
            let want = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}")));
            if req.header("authorization") != Some(want.as_str()) {
                let body = br#"{"details":"incorrect username or password"}"#;
                return respond(&s, "401 Unauthorized", &[("Content-Type", "application/json".into())], body);
            }
        }
        let token = {
            let mut issued = svc.issued.lock().unwrap();
            let t = format!("tok-{}", issued.len() + 1);
            issued.push(t.clone());
            t
        };
        let body = if svc.access_token {
            json!({"access_token": token, "expires_in": 300})
        } else {
            json!({"token": token, "expires_in": 300})
        };
        respond(&s, "200 OK", &[("Content-Type", "application/json".into())], body.to_string().as_bytes());
    })
}

/// The authenticating proxy's settings and what it saw.
struct Proxy {
    registry: String,
    realm: String,
    tokens: Arc<TokenService>,
    /// Answer blob requests with a redirect to `/cdn/...` (served without auth).
    redirect_blobs: bool,
    /// Flip the last body byte of responses to requests whose path contains this.
    corrupt: Option<String>,
    challenged: AtomicUsize,
    cdn_hits: AtomicUsize,
    /// An `Authorization` header reached `/cdn/` (it must not follow redirects).
    auth_leaked: AtomicBool,
}

impl Proxy {
    fn new(registry: &Registry, token: &Server, tokens: Arc<TokenService>) -> Proxy {
        Proxy {
            registry: registry.addr.clone(),
            realm: format!("http://{}/token", token.addr),
            tokens,
            redirect_blobs: false,
            corrupt: None,
            challenged: AtomicUsize::new(0),
            cdn_hits: AtomicUsize::new(0),
            auth_leaked: AtomicBool::new(false),
        }
    }

    fn handle(&self, s: TcpStream) {
        let Some(req) = read_request(&s) else { return };
        if let Some(rest) = req.target.strip_prefix("/cdn") {
            self.cdn_hits.fetch_add(1, Ordering::SeqCst);
            if req.header("authorization").is_some() {
                self.auth_leaked.store(true, Ordering::SeqCst);
            }
            return self.forward(&s, &req, rest);
        }
        let token = req.header("authorization").and_then(|a| a.strip_prefix("Bearer "));
        if !token.is_some_and(|t| self.tokens.issued.lock().unwrap().iter().any(|i| i == t)) {
            self.challenged.fetch_add(1, Ordering::SeqCst);
            let challenge = format!(r#"Bearer realm="{}",service="test",scope="repository:busybox:pull""#, self.realm);
            let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#;
            return respond(
                &s,
                "401 Unauthorized",
                &[("WWW-Authenticate", challenge), ("Content-Type", "application/json".into())],
                body,
            );
        }
        if self.redirect_blobs && req.target.contains("/blobs/") {
            let location = format!("http://{}/cdn{}", s.local_addr().unwrap(), req.target);
            return respond(&s, "307 Temporary Redirect", &[("Location", location)], b"");
        }
        self.forward(&s, &req, &req.target)
    }

    /// Relays one request to the registry (without credentials).
    fn forward(&self, mut s: &TcpStream, req: &Request, target: &str) {
        let Ok(mut up) = TcpStream::connect(&self.registry) else { return };
        let mut head = format!("{} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", req.method, self.registry);
        if let Some(accept) = req.header("accept") {
            head.push_str(&format!("Accept: {accept}\r\n"));
        }
        head.push_str("\r\n");
        let mut resp = Vec::new();
        if up.write_all(head.as_bytes()).and_then(|()| up.read_to_end(&mut resp)).is_err() {
            return;
        }
        if self.corrupt.as_deref().is_some_and(|part| target.contains(part)) {
            let body_start = resp.windows(4).position(|w| w == b"\r\n\r\n").map_or(resp.len(), |i| i + 4);
            if resp.len() > body_start {
                *resp.last_mut().unwrap() ^= 0xff;
            }
        }
        let _ = s.write_all(&resp);
    }
}

/// A registry with busybox behind the Bearer-authenticating proxy.
struct BearerSetup {
    registry: Registry,
    tokens: Arc<TokenService>,
    proxy: Arc<Proxy>,
    _token_server: Server,
    proxy_server: Server,
}

impl BearerSetup {
    fn start(busybox: &Path, tokens: TokenService, configure: impl FnOnce(&mut Proxy, &Registry)) -> BearerSetup {
        let registry = registry_with_busybox(busybox);
        let tokens = Arc::new(tokens);
        let token_server = token_server(tokens.clone());
        let mut proxy = Proxy::new(&registry, &token_server, tokens.clone());
        configure(&mut proxy, &registry);
        let proxy = Arc::new(proxy);
        let proxy_server = Server::spawn({
            let proxy = proxy.clone();
            move |s| proxy.handle(s)
        });
        BearerSetup { registry, tokens, proxy, _token_server: token_server, proxy_server }
    }

    /// `127.0.0.1:PORT/busybox:latest` through the proxy.
    fn reference(&self, suffix: &str) -> String {
        format!("{}/busybox{suffix}", self.proxy_server.addr)
    }
}

// ---- tests ------------------------------------------------------------------------------

#[test]
fn pull_by_tag_and_by_digest_then_import() {
    let Some(busybox) = prerequisites() else { return };
    let reg = registry_with_busybox(&busybox);
    let stored = reg.manifest("busybox", "latest");
    let tmp = tempfile::tempdir().unwrap();

    let reference = format!("{}/busybox:latest", reg.addr);
    let (fetched, events) = pull(&reference, tmp.path(), &PullOptions::default());
    let fetched = fetched.unwrap_or_else(|e| panic!("pull {reference}: {e}\nregistry log:\n{}", reg.log()));
    assert_eq!(fetched.name, reference);
    assert_eq!(fetched.manifest_digest, stored.digest);
    assert_eq!(fetched.path.parent(), Some(tmp.path()));
    assert_eq!(files_in(tmp.path()).len(), 1);

    // Progress: the manifest first, then every blob to its end.
    let PullEvent::Manifest { layers, total_bytes, .. } = &events[0] else { panic!("first event: {:?}", events[0]) };
    assert_eq!(*layers, 2);
    let done: Vec<&String> = events
        .iter()
        .filter_map(|e| if let PullEvent::BlobDone { digest } = e { Some(digest) } else { None })
        .collect();
    assert_eq!(done.len(), 3, "config and two layers: {events:?}");
    for layer in &stored.layers {
        assert!(done.contains(&layer), "{layer} not reported done");
    }
    let received: u64 = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Blob { done, total, .. } if done == total => Some(*total),
            _ => None,
        })
        .sum();
    assert_eq!(received, *total_bytes);

    let by_tag = import(&fetched.path, "bin/busybox");
    assert_eq!(by_tag.names, vec![reference.clone()]);
    assert!(by_tag.probe.len() > BUSYBOX_BIN_MIN);

    let pinned = format!("{}/busybox@{}", reg.addr, stored.digest);
    let (by_digest, _) = pull(&pinned, tmp.path(), &PullOptions::default());
    let by_digest = by_digest.unwrap();
    assert_eq!(by_digest.name, pinned);
    assert_eq!(by_digest.manifest_digest, stored.digest);
    assert_ne!(by_digest.path, fetched.path);
    let imported = import(&by_digest.path, "bin/busybox");
    assert_eq!(imported.id, by_tag.id);
    assert!(imported.names.is_empty(), "a digest names no tag: {:?}", imported.names);
}

#[test]
fn manifest_lists_resolve_to_the_platform() {
    let Some(busybox) = prerequisites() else { return };
    let reg = registry_with_busybox(&busybox);
    let work = tempfile::tempdir().unwrap();
    reg.push(&tiny_archive(work.path(), "arm64"), "busybox:arm64", None);
    let amd64 = reg.manifest("busybox", "latest");
    let arm64 = reg.manifest("busybox", "arm64");
    let entry = |m: &ManifestInfo, os: &str, arch: &str, variant: Option<&str>| {
        let mut platform = json!({"os": os, "architecture": arch});
        if let Some(v) = variant {
            platform["variant"] = v.into();
        }
        json!({"mediaType": m.media_type, "digest": m.digest, "size": m.size, "platform": platform})
    };
    let multi = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MT_OCI_INDEX,
        "manifests": [entry(&arm64, "linux", "arm64", Some("v8")), entry(&amd64, "linux", "amd64", None)],
    }))
    .unwrap();
    let multi_digest = reg.put_manifest("busybox", "multi", MT_OCI_INDEX, &multi);
    let arm_only = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MT_DOCKER_LIST,
        "manifests": [entry(&arm64, "linux", "arm64", Some("v8")), entry(&arm64, "linux", "s390x", None)],
    }))
    .unwrap();
    reg.put_manifest("busybox", "armonly", MT_DOCKER_LIST, &arm_only);
    let tmp = tempfile::tempdir().unwrap();

    // linux/amd64 by default, by tag or by the list's digest.
    let reference = format!("{}/busybox:multi", reg.addr);
    let fetched = pull(&reference, tmp.path(), &PullOptions::default()).0.unwrap();
    assert_eq!(fetched.manifest_digest, amd64.digest);
    let imported = import(&fetched.path, "bin/busybox");
    assert_eq!(imported.names, vec![reference]);
    assert!(imported.probe.len() > BUSYBOX_BIN_MIN);
    let pinned = pull(&format!("{}/busybox@{multi_digest}", reg.addr), tmp.path(), &PullOptions::default()).0.unwrap();
    assert_eq!(pinned.manifest_digest, amd64.digest);

    // Another platform on request.
    let opts = PullOptions { platform: ("linux".into(), "arm64".into()), ..PullOptions::default() };
    let fetched = pull(&format!("{}/busybox:multi", reg.addr), tmp.path(), &opts).0.unwrap();
    assert_eq!(fetched.manifest_digest, arm64.digest);
    assert_eq!(import(&fetched.path, "arch").probe, b"arm64");

    // No linux/amd64: a clear error naming what there is, and no file left.
    let before = files_in(tmp.path());
    let err = pull(&format!("{}/busybox:armonly", reg.addr), tmp.path(), &PullOptions::default()).0.unwrap_err();
    match &err {
        RegistryError::NoMatchingPlatform { wanted, available, .. } => {
            assert_eq!(wanted, "linux/amd64");
            assert_eq!(available, &["linux/arm64/v8".to_owned(), "linux/s390x".to_owned()]);
        }
        other => panic!("expected NoMatchingPlatform, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("linux/amd64") && msg.contains("linux/arm64/v8, linux/s390x"), "{msg}");
    assert_eq!(files_in(tmp.path()), before);
}

#[test]
fn basic_auth() {
    let Some(busybox) = prerequisites() else { return };
    let out = Command::new("htpasswd")
        .args(["-Bbn", "alice", "s3cret"])
        .output()
        .expect("running htpasswd (apt-get install -y apache2-utils)");
    assert!(out.status.success());
    let reg = Registry::start(Some(&String::from_utf8(out.stdout).unwrap()));
    reg.push(&busybox, "busybox:latest", Some("alice:s3cret"));
    let reference = format!("{}/busybox:latest", reg.addr);
    let tmp = tempfile::tempdir().unwrap();
    let creds = |user: &str, password: &str| PullOptions {
        username: Some(user.into()),
        password: Some(password.into()),
        ..PullOptions::default()
    };

    let fetched = pull(&reference, tmp.path(), &creds("alice", "s3cret")).0.unwrap();
    assert!(import(&fetched.path, "bin/busybox").probe.len() > BUSYBOX_BIN_MIN);
    std::fs::remove_file(&fetched.path).unwrap();

    for (opts, who) in [(creds("alice", "wrong"), "as user \"alice\""), (PullOptions::default(), "no credentials")] {
        let err = pull(&reference, tmp.path(), &opts).0.unwrap_err();
        let RegistryError::Unauthorized { registry, message } = &err else {
            panic!("expected Unauthorized, got {err:?}")
        };
        assert_eq!(registry, &reg.addr);
        assert!(message.contains("UNAUTHORIZED") && message.contains(who), "{message}");
        assert!(err.to_string().contains("unauthorized"), "{err}");
    }
    assert!(files_in(tmp.path()).is_empty());
}

#[test]
fn bearer_token_flow_with_redirected_blobs() {
    let Some(busybox) = prerequisites() else { return };
    let setup = BearerSetup::start(&busybox, TokenService::default(), |p, _| p.redirect_blobs = true);
    let tmp = tempfile::tempdir().unwrap();
    let reference = setup.reference(":latest");
    let fetched = pull(&reference, tmp.path(), &PullOptions::default()).0.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fetched.name, reference);
    assert_eq!(fetched.manifest_digest, setup.registry.manifest("busybox", "latest").digest);

    let queries = setup.tokens.queries.lock().unwrap().clone();
    assert!(!queries.is_empty());
    for q in &queries {
        assert!(q.contains("service=test") && q.contains("scope=repository%3Abusybox%3Apull"), "token query {q}");
    }
    assert!(setup.proxy.challenged.load(Ordering::SeqCst) >= 1, "the proxy never asked for a token");
    assert_eq!(setup.proxy.cdn_hits.load(Ordering::SeqCst), 3, "config and layers come through the redirect");
    assert!(!setup.proxy.auth_leaked.load(Ordering::SeqCst), "the token followed the redirect");
    let imported = import(&fetched.path, "bin/busybox");
    assert_eq!(imported.names, vec![reference]);
}

#[test]
fn bearer_token_service_with_credentials() {
    let Some(busybox) = prerequisites() else { return };
    let tokens =
        TokenService { require: Some(("bob".into(), "hunter2".into())), access_token: true, ..Default::default() };
    let setup = BearerSetup::start(&busybox, tokens, |_, _| {});
    let tmp = tempfile::tempdir().unwrap();
    let reference = setup.reference(":latest");
    let opts = |password: &str| PullOptions {
        username: Some("bob".into()),
        password: Some(password.into()),
        ..PullOptions::default()
    };
    let fetched = pull(&reference, tmp.path(), &opts("hunter2")).0.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fetched.manifest_digest, setup.registry.manifest("busybox", "latest").digest);
    std::fs::remove_file(&fetched.path).unwrap();

    for opts in [opts("nope"), PullOptions::default()] {
        let err = pull(&reference, tmp.path(), &opts).0.unwrap_err();
        let RegistryError::Unauthorized { message, .. } = &err else { panic!("expected Unauthorized, got {err:?}") };
        assert!(message.contains("incorrect username or password"), "{message}");
    }
    assert!(files_in(tmp.path()).is_empty());
}

#[test]
fn tampered_layer_is_rejected() {
    let Some(busybox) = prerequisites() else { return };
    let setup = BearerSetup::start(&busybox, TokenService::default(), |p, reg| {
        let layer = reg.manifest("busybox", "latest").layers[0].clone();
        p.corrupt = Some(layer);
    });
    let layer = setup.registry.manifest("busybox", "latest").layers[0].clone();
    let tmp = tempfile::tempdir().unwrap();
    let err = pull(&setup.reference(":latest"), tmp.path(), &PullOptions::default()).0.unwrap_err();
    match &err {
        RegistryError::DigestMismatch { what, expected, actual } => {
            assert!(what.contains(&layer), "{what}");
            assert_eq!(expected, &layer);
            assert_ne!(actual, &layer);
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    assert!(files_in(tmp.path()).is_empty(), "partial layout left: {:?}", files_in(tmp.path()));
}

#[test]
fn tampered_manifest_is_rejected() {
    let Some(busybox) = prerequisites() else { return };
    let setup = BearerSetup::start(&busybox, TokenService::default(), |p, _| {
        p.corrupt = Some("/manifests/".to_owned());
    });
    let digest = setup.registry.manifest("busybox", "latest").digest;
    let tmp = tempfile::tempdir().unwrap();
    for suffix in [":latest".to_owned(), format!("@{digest}")] {
        // By digest the content must hash to it; by tag to the registry's Docker-Content-Digest.
        let err = pull(&setup.reference(&suffix), tmp.path(), &PullOptions::default()).0.unwrap_err();
        let RegistryError::DigestMismatch { what, .. } = &err else { panic!("expected DigestMismatch, got {err:?}") };
        assert!(what.starts_with("manifest "), "{what}");
    }
    assert!(files_in(tmp.path()).is_empty());
}

#[test]
fn unknown_tag_repository_and_digest_are_not_found() {
    let Some(busybox) = prerequisites() else { return };
    let reg = registry_with_busybox(&busybox);
    let tmp = tempfile::tempdir().unwrap();
    let missing_digest = format!("sha256:{}", "0".repeat(64));
    for reference in [
        format!("{}/busybox:nope", reg.addr),
        format!("{}/nothere:latest", reg.addr),
        format!("{}/busybox@{missing_digest}", reg.addr),
    ] {
        let err = pull(&reference, tmp.path(), &PullOptions::default()).0.unwrap_err();
        let RegistryError::NotFound { message, .. } = &err else {
            panic!("{reference}: expected NotFound, got {err:?}")
        };
        assert!(message.contains("MANIFEST_UNKNOWN") || message.contains("NAME_UNKNOWN"), "{message}");
        assert!(err.to_string().contains("not found"), "{err}");
    }
    assert!(files_in(tmp.path()).is_empty());
}

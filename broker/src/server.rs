//! `pvisor serve`: the broker daemon.
use crate::api;
use crate::http::admission::Admission;
use crate::http::guard::Guard;
use crate::http::HttpLimits;
use crate::sandbox::backend::{self, BackendChoice};
use crate::sandbox::images::ImageMounts;
use crate::sandbox::net::{DefaultEgress, NetSettings};
use crate::sandbox::pool::Pool;
use crate::sandbox::rootfs::{BlockRoots, FuseRoots, RootFsProvider};
use crate::sandbox::vm::VmAssets;
use crate::sandbox::{expiry, teardown::teardown, Registry};
use pvisor_images::Pool as ImagePool;
use pvisor_worker::cgroup::{GroupPaths, Layout};
use pvisor_worker::config::{BackendKind, IdMap, Limits};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How long open streams may delay a shutdown.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Everything the handlers share.
pub struct Ctx {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub run_dir: PathBuf,
    pub sandboxes_dir: PathBuf,
    pub images: ImagePool,
    pub cgroups: Option<Layout>,
    pub worker_bin: PathBuf,
    pub agent_bin: PathBuf,
    pub default_limits: Limits,
    /// What a create's `resourceLimits` may ask for.
    pub limit_bounds: crate::api::limits::Bounds,
    /// ns sandboxes' disk bound (`--disk-limit`).
    pub disks: crate::sandbox::disk::Disks,
    pub ids: IdMap,
    pub registry: Registry,
    pub api_key: Option<String>,
    /// The key of signed endpoints (`<data>/endpoint-signing.key`).
    pub signing: crate::api::signing::SigningKey,
    pub pool: Pool,
    /// One FUSE server per image in use.
    pub mounts: ImageMounts,
    /// Pull images missing from the pool when a create names them.
    pub allow_pull: bool,
    /// An image server no sandbox used for this long is stopped.
    pub image_idle: std::time::Duration,
    /// Prefix of this broker's cgroup names (see [`cgroup_prefix`]).
    pub cgroup_prefix: String,
    /// The backend of a create that does not name one.
    pub default_backend: BackendKind,
    /// What vm sandboxes need, or why this server cannot run them.
    pub vm: Result<VmAssets, String>,
    /// Networking: the default egress, upstream resolvers, the deny list.
    pub net: NetSettings,
    /// Host-path allowlist and the named-volume store.
    pub volumes: crate::volumes::Settings,
    /// Snapshot records (`<data>/snapshots`).
    pub snapshots: crate::snapshot::store::SnapshotStore,
    /// Sandbox records (`<data>/state/sandboxes`, see [`crate::durable`]).
    pub state: Arc<crate::durable::SandboxStore>,
    /// Sandboxes and image servers outlive the broker (unless
    /// `--stop-sandboxes-on-exit`).
    pub durable: bool,
    /// Benchmark only (`PVISOR_BENCH_NO_STATE=1`): creates write no record,
    /// to measure what the record costs (bench/durability.py).
    pub persist: bool,
    /// What one client may make the server hold (`--max-*`, timeouts).
    pub http: HttpLimits,
    /// Heads, bodies and open streams of requests.
    pub guard: Arc<Guard>,
    /// Concurrent creates and sandboxes per server.
    pub admission: Admission,
    /// `--memory-merge`: ns sandboxes are mergeable; the host's KSM as
    /// this broker found and set it.
    pub memory_merge: Option<crate::sandbox::ksm::HostKsm>,
    /// `--vm-templates` (where the vm backend is available).
    pub templates: Option<crate::sandbox::templates::Templates>,
    /// The API's templates (`<data>/catalog`) and their warm sandboxes.
    pub catalog: crate::catalog::Catalog,
    /// `--ready-timeout-secs`: how long a create waits for its worker's Ready.
    pub ready_timeout: std::time::Duration,
}

impl Ctx {
    /// The root-filesystem provider of a backend.
    pub fn rootfs(&self, backend: BackendKind) -> Box<dyn RootFsProvider + '_> {
        match backend {
            BackendKind::Ns => Box::new(FuseRoots(&self.mounts)),
            BackendKind::Vm => Box::new(BlockRoots { pool_dir: self.images.root().to_path_buf() }),
        }
    }
}

pub struct ServeOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub worker_bin: Option<PathBuf>,
    pub agent_bin: Option<PathBuf>,
    pub imaged_bin: Option<PathBuf>,
    pub allow_no_cgroups: bool,
    pub allow_pull: bool,
    pub image_idle: std::time::Duration,
    /// Warm workers kept ready for creates.
    pub warm_workers: usize,
    /// `--backend`.
    pub backend: BackendChoice,
    /// The guest kernel (vmlinux) of vm sandboxes.
    pub guest_kernel: Option<PathBuf>,
    /// `--default-egress`.
    pub default_egress: DefaultEgress,
    /// `--net-dns` (empty: the host's resolvers).
    pub net_dns: Vec<String>,
    /// `--net-deny`.
    pub net_deny: Vec<String>,
    /// `--allow-host-path`.
    pub allow_host_paths: Vec<PathBuf>,
    /// `--stop-sandboxes-on-exit`: sandboxes end with the broker (at a
    /// clean stop and a crash alike) instead of being re-adopted.
    pub stop_sandboxes_on_exit: bool,
    /// `--max-*` and the client timeouts.
    pub http: HttpLimits,
    /// `--disk-limit` in bytes (0: no disk bound).
    pub disk_limit: u64,
    /// `--memory-merge`.
    pub memory_merge: bool,
    /// `--vm-templates`.
    pub vm_templates: bool,
    /// `--template-warm`: sandboxes started ahead per API template.
    pub template_warm: usize,
    /// `--ready-timeout-secs`.
    pub ready_timeout: std::time::Duration,
}

/// `/var/lib/pvisor` for root, else the user's data directory.
pub fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/pvisor");
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(x).join("pvisor");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/share/pvisor")
}

/// A sibling binary of the running executable.
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(name))).unwrap_or_else(|| PathBuf::from(name))
}

/// True when the ELF file has no program interpreter (statically linked). Reads the ELF header
/// and the program headers only: the whole agent read at every start stayed in the page cache
/// and was charged to the broker (7.7 MiB).
pub fn is_static_elf(path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not a 64-bit ELF file");
    let file = std::fs::File::open(path)?;
    let mut head = [0u8; 64];
    file.read_exact_at(&mut head, 0).map_err(|_| bad())?;
    if &head[0..4] != b"\x7fELF" || head[4] != 2 {
        return Err(bad());
    }
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().map_err(|_| bad())?);
    let phentsize = u16::from_le_bytes([head[0x36], head[0x37]]) as usize;
    let phnum = u16::from_le_bytes([head[0x38], head[0x39]]) as usize;
    if phentsize < 4 {
        return Err(bad());
    }
    let mut table = vec![0u8; phentsize * phnum];
    file.read_exact_at(&mut table, phoff).map_err(|_| bad())?;
    // PT_INTERP (3): a dynamically linked program names its loader.
    Ok(!table.chunks_exact(phentsize).any(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == 3))
}

/// Longest Unix socket path (`sun_path` holds 108 bytes with the NUL).
const SUN_PATH_MAX: usize = 107;
/// Length of a worker socket's file name (`<16 hex>.sock`) plus its slash.
const SOCKET_NAME_LEN: usize = 22;

/// Where worker sockets live: `<data>/run`, unless that path is too long for
/// a Unix socket; then a private directory under the system's temp dir.
fn run_dir(data_dir: &Path) -> Result<PathBuf, String> {
    let preferred = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf()).join("run");
    if preferred.as_os_str().len() + SOCKET_NAME_LEN <= SUN_PATH_MAX {
        return Ok(preferred);
    }
    let uid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("{}{uid}", cgroup_prefix(data_dir)));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("socket dir {}: {e}", dir.display())),
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let md = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !md.is_dir() || md.uid() != uid {
        return Err(format!("socket dir {} is not a directory owned by uid {uid}", dir.display()));
    }
    if dir.as_os_str().len() + SOCKET_NAME_LEN > SUN_PATH_MAX {
        return Err(format!("no socket directory short enough for data dir {}", data_dir.display()));
    }
    Ok(dir)
}

/// Makes `dirs` private (0700). Image trees and sandbox layers hold files
/// owned by the sandboxes' mapped ids, setuid ones included: no other host
/// user may reach them. Sandboxes themselves never traverse these paths
/// (their init opens the layers before it changes identity).
pub fn secure_dirs(dirs: &[&Path]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for d in dirs {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

/// The cgroup name prefix of the broker serving `data_dir`: several brokers
/// (different data dirs) can share a host and its cgroup hierarchies, and
/// each must only ever clean up its own groups.
fn cgroup_prefix(data_dir: &Path) -> String {
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    // FNV-1a: stable across runs and releases, unlike std's hasher.
    let h = abs
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3));
    format!("pvisor-{:08x}-", h as u32)
}

/// Removes sandbox cgroups a previous broker of the same data dir left
/// behind, but for those in `keep` (re-adopted sandboxes and image servers).
fn clean_stale_cgroups(layout: &Layout, prefix: &str, keep: &std::collections::HashSet<String>) {
    let bases: Vec<(Option<String>, PathBuf)> = match layout {
        Layout::V2 { base } => vec![(None, base.clone())],
        Layout::V1 { bases } => bases.iter().map(|(c, b)| (Some(c.clone()), b.clone())).collect(),
    };
    let mut stale: std::collections::BTreeMap<String, GroupPaths> = Default::default();
    for (ctrl, base) in bases {
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(prefix) || !e.path().is_dir() || keep.contains(&name) {
                continue;
            }
            let g = stale.entry(name).or_default();
            match &ctrl {
                None => g.v2 = Some(e.path()),
                Some(c) => {
                    g.v1.insert(c.clone(), e.path());
                }
            }
        }
    }
    for (name, g) in stale {
        tracing::info!("removing stale cgroup {name}");
        let _ = g.destroy();
    }
}

fn build_ctx(o: ServeOptions) -> Result<(Ctx, Vec<crate::durable::recover::Found>), String> {
    o.http.check()?;
    let api_key = std::env::var("PVISOR_API_KEY").ok().filter(|k| !k.is_empty());
    if !o.listen.ip().is_loopback() && api_key.is_none() {
        return Err(format!(
            "refusing to listen on {} without an API key: set PVISOR_API_KEY, or listen on a loopback address",
            o.listen
        ));
    }
    let net = NetSettings::new(o.default_egress, &o.net_dns, &o.net_deny, o.listen)?;
    let volumes = crate::volumes::Settings::new(&o.allow_host_paths, &o.data_dir)?;
    let run_dir = run_dir(&o.data_dir)?;
    let sandboxes_dir = o.data_dir.join("sandboxes");
    let durable = !o.stop_sandboxes_on_exit;
    // What a previous broker left running is found before anything is cleaned.
    std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    secure_dirs(&[&o.data_dir])?;
    let recovery = crate::durable::recover(&o.data_dir, &run_dir, durable)?;
    let keep = &recovery.keep;
    // Each failure is logged there; what could not go stays for the next start.
    crate::sandbox::trees::clean_dir(&run_dir, &keep.run_files)?;
    let images = ImagePool::open(&o.data_dir.join("images")).map_err(|e| format!("image store: {e}"))?;
    secure_dirs(&[&o.data_dir, &o.data_dir.join("images"), &sandboxes_dir, &run_dir])?;
    let signing = crate::api::signing::SigningKey::load_or_create(&o.data_dir).map_err(|e| e.to_string())?;
    let cgroup_prefix = cgroup_prefix(&o.data_dir);
    let cgroups = match Layout::detect() {
        Ok(l) => {
            let l = l.prepare(&format!("{cgroup_prefix}host")).map_err(|e| e.to_string())?;
            clean_stale_cgroups(&l, &cgroup_prefix, &keep.cgroups);
            Some(l)
        }
        Err(e) if o.allow_no_cgroups => {
            tracing::warn!("no cgroups: sandboxes run without resource limits ({e})");
            None
        }
        Err(e) => return Err(format!("{e}; pass --allow-no-cgroups to run without resource limits")),
    };
    // After the stale groups are gone with their processes: a warm worker of the
    // last broker, killed there while it made its disk ahead (`.ahead-<slot>`), has
    // no chance to remove it itself, and one still making it would make it again.
    crate::sandbox::trees::clean_dir(&sandboxes_dir, &keep.sandbox_dirs)?;
    let worker_bin = o
        .worker_bin
        .or_else(|| std::env::var_os("PVISOR_WORKER").map(PathBuf::from))
        .unwrap_or_else(|| sibling("pvisor-worker"));
    let agent_bin = o
        .agent_bin
        .or_else(|| std::env::var_os("PVISOR_AGENT").map(PathBuf::from))
        .unwrap_or_else(|| sibling("pvisor-agent"));
    let imaged_bin = o
        .imaged_bin
        .or_else(|| std::env::var_os("PVISOR_IMAGED").map(PathBuf::from))
        .unwrap_or_else(|| sibling("pvisor-imaged"));
    if !imaged_bin.is_file() {
        return Err(format!("image server binary {} not found (use --imaged-bin)", imaged_bin.display()));
    }
    if !worker_bin.is_file() {
        return Err(format!("worker binary {} not found (use --worker-bin)", worker_bin.display()));
    }
    match is_static_elf(&agent_bin) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "agent binary {} is dynamically linked; it must be static to run inside any image",
                agent_bin.display()
            ))
        }
        Err(e) => return Err(format!("agent binary {}: {e} (use --agent-bin)", agent_bin.display())),
    }
    let ids = IdMap::for_current_user(images.id_shift());
    let mounts = ImageMounts::new(
        imaged_bin,
        images.root().to_path_buf(),
        o.data_dir.join("mnt"),
        run_dir.clone(),
        ids,
        cgroups.clone(),
        cgroup_prefix.clone(),
        durable,
        recovery.images,
    )?;
    secure_dirs(&[&o.data_dir.join("mnt")])?;
    let host = pvisor_worker::vm::host::probe();
    let vm = VmAssets::prepare(&o.data_dir.join("vm"), o.guest_kernel.as_deref(), &agent_bin, &host);
    let default_backend = match o.backend {
        BackendChoice::Ns => BackendKind::Ns,
        BackendChoice::Vm => match &vm {
            Ok(_) => BackendKind::Vm,
            Err(e) => return Err(format!("--backend vm: {e}")),
        },
        BackendChoice::Auto => {
            let (kind, why) = backend::auto(&host, &vm.as_ref().map(drop).map_err(Clone::clone));
            tracing::info!("--backend auto chose {}: {why}", kind.name());
            kind
        }
    };
    let snapshots = crate::snapshot::open_store(&o.data_dir, &images)?;
    let disks = crate::sandbox::disk::Disks::new(&o.data_dir.join("disk"), o.disk_limit);
    match disks.unavailable() {
        None => tracing::info!(bytes = disks.default_bytes, "ns sandboxes get their own disk"),
        Some(why) => tracing::warn!("ns sandboxes' writable layers are not bounded: {why}"),
    }
    let limit_bounds = crate::api::limits::Bounds::for_host(
        disks.max_bytes().ok_or_else(|| disks.unavailable().unwrap_or("no disk bound").to_string()),
    );
    let default_limits = Limits { disk_bytes: disks.default_bytes, ..Limits::default() };
    let memory_merge = match o.memory_merge {
        false => None,
        true => {
            let k =
                crate::sandbox::ksm::HostKsm::start(Path::new(crate::sandbox::ksm::KSM_DIR), &o.data_dir.join("state"))
                    .map_err(|e| e.to_string())?;
            match &k.control {
                crate::sandbox::ksm::Control::Pvisor => tracing::info!(
                    pages_to_scan = crate::sandbox::ksm::PAGES_TO_SCAN,
                    sleep_millisecs = crate::sandbox::ksm::SLEEP_MILLISECS,
                    "memory merge: KSM on, sandboxes mergeable"
                ),
                crate::sandbox::ksm::Control::Host => {
                    tracing::info!("memory merge: KSM runs with the host's settings; sandboxes mergeable")
                }
                crate::sandbox::ksm::Control::Off { reason } => tracing::warn!("memory merge: {reason}"),
            }
            Some(k)
        }
    };
    let templates = match (o.vm_templates, &vm) {
        (true, Ok(_)) => Some(crate::sandbox::templates::Templates::open(&o.data_dir)?),
        (true, Err(e)) => {
            tracing::warn!("--vm-templates: the vm backend is not available: {e}");
            None
        }
        (false, _) => None,
    };
    let catalog = crate::catalog::Catalog::open(&o.data_dir, o.template_warm)?;
    let ctx = Ctx {
        listen: o.listen,
        data_dir: o.data_dir,
        run_dir,
        sandboxes_dir,
        images,
        cgroups,
        worker_bin,
        agent_bin,
        default_limits,
        limit_bounds,
        disks,
        ids,
        registry: Registry::default(),
        api_key,
        signing,
        pool: Pool::new(o.warm_workers),
        mounts,
        allow_pull: o.allow_pull,
        image_idle: o.image_idle,
        cgroup_prefix,
        default_backend,
        vm,
        net,
        volumes,
        snapshots,
        state: recovery.store,
        durable,
        persist: std::env::var_os("PVISOR_BENCH_NO_STATE").is_none(),
        guard: Guard::new(&o.http),
        admission: Admission::new(
            o.http.max_concurrent_creates,
            o.http.create_queue,
            o.http.create_queue_wait(),
            o.http.max_sandboxes,
        ),
        http: o.http,
        memory_merge,
        templates,
        catalog,
        ready_timeout: o.ready_timeout,
    };
    Ok((ctx, recovery.found))
}

/// Puts the host's KSM settings back once no sandbox of this broker runs
/// (crate::sandbox::ksm).
fn restore_ksm(ctx: &Ctx) {
    if let Some(k) = &ctx.memory_merge {
        match k.restore() {
            Ok(()) => tracing::info!("memory merge: the host's KSM settings are restored"),
            Err(e) => tracing::warn!("memory merge: restoring the host's KSM settings: {e}"),
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub async fn serve(o: ServeOptions) -> Result<(), String> {
    let (ctx, found) = build_ctx(o)?;
    let ctx = Arc::new(ctx);
    // Before the first request: every sandbox a previous broker left is back.
    let t = std::time::Instant::now();
    let (records, live) = (found.len(), crate::durable::adopt::adopt_all(&ctx, found).await);
    if records > 0 {
        tracing::info!(records, live, took = ?t.elapsed(), "sandboxes of the previous broker re-adopted");
    }
    // Warm workers first: the first request after a restart should not pay
    // for starting one.
    Pool::fill_now(&ctx).await;
    // Then the templates' warm sandboxes, in the background.
    crate::catalog::warm::top_up_all(&ctx);
    let listener =
        tokio::net::TcpListener::bind(ctx.listen).await.map_err(|e| format!("listen on {}: {e}", ctx.listen))?;
    expiry::spawn(ctx.clone());
    tracing::info!(
        listen = %ctx.listen,
        data_dir = %ctx.data_dir.display(),
        cgroups = ?ctx.cgroups.as_ref().map(|l| matches!(l, Layout::V2{..}).then_some("v2").unwrap_or("v1")),
        auth = ctx.api_key.is_some(),
        backend = ctx.default_backend.name(),
        "pvisor serving"
    );
    let app = api::router(ctx.clone());
    // Open streams (SSE, metrics/watch) would hold a graceful shutdown
    // forever: give them a few seconds, then tear down regardless.
    crate::http::conn::serve(listener, app, &ctx.http, shutdown_signal(), SHUTDOWN_GRACE).await;
    // Sandboxes nobody has yet end with the broker either way (the next one starts its own).
    crate::catalog::warm::discard(ctx.catalog.warm.close().await).await;
    if ctx.durable {
        // Sandboxes and the image servers they use keep running; their
        // records are current, and the next broker re-adopts them. Servers
        // no live sandbox uses stop now.
        ctx.pool.drain();
        let in_use = ctx.registry.list().into_iter().filter(|e| e.worker_log().is_some()).map(|e| e.image_id.clone());
        let in_use = in_use.collect();
        let c = ctx.clone();
        let _ = tokio::task::spawn_blocking(move || c.mounts.reap(&in_use, std::time::Duration::ZERO)).await;
        let left = ctx.registry.list().len();
        if left == 0 {
            restore_ksm(&ctx);
        }
        tracing::info!(sandboxes = left, "pvisor stopped; sandboxes keep running");
        return Ok(());
    }
    for e in ctx.registry.list() {
        if let Some(e) = ctx.registry.remove(&e.id) {
            teardown(&e).await;
            e.forget();
        }
    }
    ctx.pool.drain();
    ctx.mounts.shutdown();
    restore_ksm(&ctx);
    tracing::info!("pvisor stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_prefixes_differ_per_data_dir_and_are_stable() {
        let a = cgroup_prefix(Path::new("/nonexistent/a"));
        assert_eq!(a, cgroup_prefix(Path::new("/nonexistent/a")));
        assert_ne!(a, cgroup_prefix(Path::new("/nonexistent/b")));
        assert!(a.starts_with("pvisor-") && a.ends_with('-') && a.len() == "pvisor-".len() + 9);
    }

    #[test]
    fn long_data_dirs_get_a_short_socket_dir() {
        let short = run_dir(Path::new("/var/lib/pvisor")).unwrap();
        assert_eq!(short, PathBuf::from("/var/lib/pvisor/run"));
        let long = PathBuf::from("/tmp").join("d".repeat(120));
        let r = run_dir(&long).unwrap();
        assert!(r.as_os_str().len() + SOCKET_NAME_LEN <= SUN_PATH_MAX, "{}", r.display());
        assert!(!r.starts_with(&long));
    }

    #[test]
    fn static_elf_detection() {
        assert!(!is_static_elf(Path::new("/bin/sh")).unwrap(), "/bin/sh is dynamically linked");
        assert!(is_static_elf(Path::new("/etc/passwd")).is_err());
        // A minimal ELF: its header, then one program header of `kind`, `phnum` of them claimed.
        let elf = |kind: u32, phnum: u16| {
            let mut b = vec![0u8; 64 + 56];
            b[0..4].copy_from_slice(b"\x7fELF");
            b[4] = 2;
            b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
            b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
            b[0x38..0x3a].copy_from_slice(&phnum.to_le_bytes());
            b[64..68].copy_from_slice(&kind.to_le_bytes());
            b
        };
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("elf");
        std::fs::write(&f, elf(1, 1)).unwrap();
        assert!(is_static_elf(&f).unwrap(), "a PT_LOAD alone is static");
        std::fs::write(&f, elf(3, 1)).unwrap();
        assert!(!is_static_elf(&f).unwrap(), "a PT_INTERP names a loader");
        std::fs::write(&f, elf(1, 2)).unwrap();
        assert!(is_static_elf(&f).is_err(), "program headers past the end");
    }
}

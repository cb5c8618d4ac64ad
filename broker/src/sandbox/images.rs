//! Image servers: one `pvisor-imaged` process per image in use, serving the
//! image read-only from the pool through FUSE at `<data>/mnt/<id>`. Every
//! sandbox of that image uses the mount as its overlay lower layer, so they
//! share one server and one page cache.
//!
//! A server is started at the first create of its image and kept while the
//! broker runs. A server that died is replaced at the next create of its
//! image (its stale mount is detached first), and the live sandboxes of that
//! image are failed (`IMAGE_SERVER_EXITED`: their root is gone, see
//! [`ImageMounts::take_dead`]), never left silently broken — whether the
//! expiry sweep notices the death first or a create of the image does (the
//! create restarts the server and leaves the death for the sweep to report).
//!
//! Durable brokers (the default) start servers without a lifeline, so they
//! outlive the broker with their sandboxes; each server's identity is kept
//! in `<run>/imaged-<id>.json`, and a restarted broker re-adopts the servers
//! still alive ([`survivors`]). With `--stop-sandboxes-on-exit` a server's
//! lifeline is a pipe from the broker and shutdown stops every server.
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use pvisor_images::ImageRecord;
use pvisor_worker::cgroup::{GroupPaths, Layout, SANDBOX_LEAF};
use pvisor_worker::config::{IdMap, Limits};

/// fds of a server (as `pass_fds` places them): `ready` (it writes "ready\n"
/// once mounted) and `lifeline`.
const READY_FD: RawFd = 3;
const LIFELINE_FD: RawFd = 4;
/// How long a server may take to mount.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Resource limits of one image server's group (its index, chunk cache and
/// FUSE buffers; the page cache of what it serves is charged to readers).
const SERVER_LIMITS: Limits = Limits { cpu_millis: 2000, memory_bytes: 256 << 20, pids: 64, disk_bytes: 0 };

struct Server {
    /// Started by this broker (None: re-adopted after a restart).
    child: Option<Child>,
    /// Held for every server: waits and signals never reach a recycled pid.
    pidfd: Option<OwnedFd>,
    /// The broker's end of the server's lifeline (non-durable brokers).
    lifeline: Option<OwnedFd>,
    mountpoint: PathBuf,
    cgroup: Option<GroupPaths>,
    /// `<run>/imaged-<id>.json`, the server's identity for a later broker.
    state_file: PathBuf,
}

impl Server {
    /// `<run>/imaged-<id>.log`, its stderr (next to its record).
    fn log_path(&self) -> PathBuf {
        self.state_file.with_extension("log")
    }

    /// Whether the server process still runs (a dead child is reaped).
    fn alive(&mut self) -> bool {
        if let Some(c) = self.child.as_mut() {
            return matches!(c.try_wait(), Ok(None));
        }
        self.pidfd.as_ref().is_some_and(|fd| !crate::durable::proc::exited(fd))
    }

    fn kill(&mut self) {
        match (self.child.as_mut(), self.pidfd.as_ref()) {
            (Some(c), _) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            (None, Some(fd)) => crate::durable::proc::pidfd_signal(fd, libc::SIGKILL),
            (None, None) => {}
        }
    }
}

/// What a restarted broker needs to find a server again.
#[derive(serde::Serialize, serde::Deserialize)]
struct ServerRecord {
    image_id: String,
    proc: crate::durable::proc::ProcId,
    mountpoint: PathBuf,
    #[serde(default)]
    cgroup: Option<GroupPaths>,
}

/// A live server of a previous broker, found by [`survivors`].
pub struct Survivor {
    image_id: String,
    pidfd: OwnedFd,
    mountpoint: PathBuf,
    cgroup: Option<GroupPaths>,
    state_file: PathBuf,
}

impl Survivor {
    /// The pool id of the image it serves.
    pub fn image_id(&self) -> &str {
        &self.image_id
    }

    /// Names the start-up cleanup must leave alone: files in the run dir,
    /// the cgroup's name, the mount point's name.
    pub fn keep(&self, keep: &mut crate::durable::Keep) {
        let hex = hex_of(&self.image_id);
        let short = &hex[..16.min(hex.len())];
        keep.run_files.insert(format!("imaged-{short}.json"));
        keep.run_files.insert(format!("imaged-{short}.log"));
        if let Some(g) = &self.cgroup {
            keep.cgroups.extend(crate::durable::cgroup_name(g));
        }
        if let Some(n) = self.mountpoint.file_name() {
            keep.mounts.insert(n.to_string_lossy().into_owned());
        }
    }
}

/// True when `p` is a mount point (its device differs from its parent's).
fn is_mounted(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Some(parent), Ok(m)) = (p.parent(), std::fs::metadata(p)) else { return false };
    std::fs::metadata(parent).is_ok_and(|pm| pm.dev() != m.dev())
}

/// The image servers of a previous broker (records in `run_dir`) that still
/// run with their mount in place. With `adopt` false (a non-durable broker,
/// or a host restart), every one still running is killed instead.
pub fn survivors(run_dir: &Path, adopt: bool) -> Vec<Survivor> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(run_dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("imaged-") && name.ends_with(".json")) {
            continue;
        }
        let path = e.path();
        let Some(rec) = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<ServerRecord>(&b).ok()) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        match rec.proc.open() {
            Some(fd) if adopt && is_mounted(&rec.mountpoint) => {
                tracing::info!(image = %rec.image_id, pid = rec.proc.pid, "re-adopting the image server");
                out.push(Survivor {
                    image_id: rec.image_id,
                    pidfd: fd,
                    mountpoint: rec.mountpoint,
                    cgroup: rec.cgroup,
                    state_file: path,
                });
            }
            other => {
                if let Some(fd) = other {
                    tracing::info!(image = %rec.image_id, pid = rec.proc.pid, "stopping a previous broker's image server");
                    crate::durable::proc::pidfd_signal(&fd, libc::SIGKILL);
                }
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

/// A running server, as [`ImageMounts::running`] reports it.
pub struct RunningServer {
    pub image_id: String,
    pub pid: Option<u32>,
    pub cgroup: Option<GroupPaths>,
}

/// The pid a pidfd refers to (its `Pid:` line in fdinfo).
fn pid_of_pidfd(fd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|p| p.trim().parse().ok()).filter(|p: &u32| *p > 0)
}

/// What starting a server needs.
pub struct ImageMounts {
    imaged_bin: PathBuf,
    pool_dir: PathBuf,
    mount_dir: PathBuf,
    /// Where each server's stderr goes (`imaged-<id>.log`).
    log_dir: PathBuf,
    ids: IdMap,
    cgroups: Option<Layout>,
    cgroup_prefix: String,
    /// One slot per image, locked while its server is checked or started.
    servers: Mutex<HashMap<String, Slot>>,
    /// Servers outlive the broker (no lifeline).
    durable: bool,
    /// Deaths a create noticed (and restarted the server after), for the next
    /// [`ImageMounts::take_dead`].
    noticed: Mutex<Vec<Death>>,
}

/// An image server found dead: the sandboxes of its image made before
/// `noticed` used its mount and have lost their root (later ones use the
/// new server's).
#[derive(Debug, Clone, PartialEq)]
pub struct Death {
    pub image_id: String,
    pub noticed: chrono::DateTime<chrono::Utc>,
}

impl Death {
    fn now(image_id: &str) -> Death {
        Death { image_id: image_id.to_string(), noticed: chrono::Utc::now() }
    }
}

type Slot = std::sync::Arc<Mutex<SlotState>>;

/// An image's server, if running, and when a sandbox last used it.
struct SlotState {
    server: Option<Server>,
    last_used: Instant,
    /// Taken out of the map by [`ImageMounts::reap`]: look the image up again.
    retired: bool,
}

impl Default for SlotState {
    fn default() -> Self {
        SlotState { server: None, last_used: Instant::now(), retired: false }
    }
}

fn hex_of(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

/// Detaches whatever is mounted at `p` (a stale or dead FUSE mount).
fn detach(p: &Path) {
    match nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => tracing::debug!(mount = %p.display(), "detached image mount"),
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {} // not mounted
        Err(nix::errno::Errno::EPERM) => {
            // Not root: the mount was made by fusermount3, which undoes it too.
            match Command::new("fusermount3").arg("-u").arg("-z").arg("--").arg(p).stderr(Stdio::null()).status() {
                Ok(s) if s.success() => tracing::debug!(mount = %p.display(), "detached image mount"),
                _ => {}
            }
        }
        Err(e) => tracing::warn!(mount = %p.display(), "cannot detach image mount: {e}"),
    }
}

impl ImageMounts {
    /// Takes over the `survivors` of a previous broker and detaches every
    /// other mount it left behind.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        imaged_bin: PathBuf,
        pool_dir: PathBuf,
        mount_dir: PathBuf,
        log_dir: PathBuf,
        ids: IdMap,
        cgroups: Option<Layout>,
        cgroup_prefix: String,
        durable: bool,
        survivors: Vec<Survivor>,
    ) -> Result<ImageMounts, String> {
        std::fs::create_dir_all(&mount_dir).map_err(|e| format!("{}: {e}", mount_dir.display()))?;
        let adopted: HashSet<PathBuf> = survivors.iter().map(|s| s.mountpoint.clone()).collect();
        for e in std::fs::read_dir(&mount_dir).map_err(|e| format!("{}: {e}", mount_dir.display()))?.flatten() {
            if adopted.contains(&e.path()) {
                continue;
            }
            detach(&e.path());
            let _ = std::fs::remove_dir(e.path());
        }
        let servers = survivors
            .into_iter()
            .map(|s| {
                let server = Server {
                    child: None,
                    pidfd: Some(s.pidfd),
                    lifeline: None,
                    mountpoint: s.mountpoint,
                    cgroup: s.cgroup,
                    state_file: s.state_file,
                };
                let state = SlotState { server: Some(server), ..Default::default() };
                (s.image_id, std::sync::Arc::new(Mutex::new(state)))
            })
            .collect();
        Ok(ImageMounts {
            imaged_bin,
            pool_dir,
            mount_dir,
            log_dir,
            ids,
            cgroups,
            cgroup_prefix,
            servers: Mutex::new(servers),
            durable,
            noticed: Mutex::new(Vec::new()),
        })
    }

    /// Every image's slot, copied out of the table (so the table's lock is
    /// not held while a slot is locked).
    fn slots(&self) -> Vec<(String, Slot)> {
        let servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        servers.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The images whose server died since the last call (each such server
    /// is cleaned up: its stale mount detached, so the next create of the
    /// image starts a new one). Their live sandboxes have lost their root.
    pub fn take_dead(&self) -> Vec<Death> {
        let slots = self.slots();
        let mut dead = std::mem::take(&mut *self.noticed.lock().unwrap_or_else(|p| p.into_inner()));
        for (id, slot) in slots {
            // Busy (a create is checking or starting it): next time.
            let Ok(mut st) = slot.try_lock() else { continue };
            if st.server.as_mut().is_some_and(|s| !s.alive()) {
                if let Some(s) = st.server.take() {
                    // Its log goes with it (stop): what it said last goes to the broker's log.
                    tracing::warn!(image = %id, last_words = %log_tail(&s.log_path()), "image server exited");
                    stop(s);
                }
                dead.push(Death::now(&id));
            }
        }
        dead
    }

    /// The servers running now (a server being started or checked is left
    /// out): image id, pid (None where unknown) and group, for the metrics.
    pub fn running(&self) -> Vec<RunningServer> {
        let slots = self.slots();
        let mut out = Vec::new();
        for (image_id, slot) in slots {
            let Ok(st) = slot.try_lock() else { continue };
            if let Some(s) = &st.server {
                let pid = s.child.as_ref().map(|c| c.id()).or_else(|| s.pidfd.as_ref().and_then(pid_of_pidfd));
                out.push(RunningServer { image_id, pid, cgroup: s.cgroup.clone() });
            }
        }
        out
    }

    /// The mounted image, starting its server if none runs. Blocking; a
    /// slow start holds up only creates of the same image.
    pub fn ensure(&self, image: &ImageRecord) -> Result<PathBuf, String> {
        loop {
            let slot = {
                let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
                servers.entry(image.id.clone()).or_default().clone()
            };
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if slot.retired {
                continue; // reaped meanwhile; a new slot is in the map
            }
            slot.last_used = Instant::now();
            if let Some(s) = slot.server.as_mut() {
                if s.alive() {
                    return Ok(s.mountpoint.clone());
                }
                tracing::warn!(image = %image.id, "image server exited; restarting");
                if let Some(old) = slot.server.take() {
                    stop(old);
                }
                // Its sandboxes are failed by the sweep (take_dead), as if it had seen the death.
                self.noticed.lock().unwrap_or_else(|p| p.into_inner()).push(Death::now(&image.id));
            }
            let server = self.start(image)?;
            let mp = server.mountpoint.clone();
            slot.server = Some(server);
            return Ok(mp);
        }
    }

    /// Stops the servers of images no sandbox has used for `idle` (`in_use`:
    /// the image ids of the live sandboxes). A stopped server closes the
    /// packs it held, so the space gc freed is released; the next create of
    /// the image starts a new one.
    pub fn reap(&self, in_use: &HashSet<String>, idle: Duration) {
        let mut doomed = Vec::new();
        {
            let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
            servers.retain(|id, slot| {
                // Busy (a create of this image is checking or starting it): later.
                let Ok(mut st) = slot.try_lock() else { return true };
                if in_use.contains(id) {
                    st.last_used = Instant::now();
                    return true;
                }
                if st.last_used.elapsed() < idle {
                    return true;
                }
                st.retired = true;
                if let Some(s) = st.server.take() {
                    tracing::info!(image = %id, "stopping the idle image server");
                    doomed.push(s);
                }
                false
            });
        }
        for s in doomed {
            stop(s);
        }
    }

    fn start(&self, image: &ImageRecord) -> Result<Server, String> {
        let hex = hex_of(&image.id);
        let mountpoint = self.mount_dir.join(&hex[..16.min(hex.len())]);
        detach(&mountpoint);
        std::fs::create_dir_all(&mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
        let cgroup = match &self.cgroups {
            Some(l) => Some(
                l.create_group(&format!("{}img-{}", self.cgroup_prefix, &hex[..12.min(hex.len())]), &SERVER_LIMITS)
                    .map_err(|e| format!("image server cgroup: {e}"))?,
            ),
            None => None,
        };
        let (ready_rd, ready_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        let (life_rd, life_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        // A durable server keeps running without the broker: the read end it
        // gets is closed at once, and it watches no lifeline.
        let mut cmd = Command::new(&self.imaged_bin);
        cmd.arg("--pool").arg(&self.pool_dir).arg("--image").arg(&image.id).arg("--mountpoint").arg(&mountpoint);
        if self.ids.count > 1 {
            cmd.arg("--id-shift").arg(self.ids.uid_base.to_string());
        } else {
            cmd.arg("--owner").arg(format!("{}:{}", self.ids.uid_base, self.ids.gid_base));
        }
        cmd.arg("--ready-fd").arg(READY_FD.to_string());
        if !self.durable {
            cmd.arg("--lifeline-fd").arg(LIFELINE_FD.to_string());
        }
        // A file, not a pipe: nobody reads a pipe once the server runs, and a
        // full one would block it.
        let log_path = self.log_dir.join(format!("imaged-{}.log", &hex[..16.min(hex.len())]));
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        // The server's fds 3 and 4.
        pvisor_worker::launch::pass_fds(&mut cmd, [ready_wr.as_raw_fd(), life_rd.as_raw_fd()]);
        let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", self.imaged_bin.display()))?;
        drop((ready_wr, life_rd));
        if let Some(g) = &cgroup {
            if let Err(e) = g.join(SANDBOX_LEAF, child.id() as i32) {
                tracing::warn!("image server cgroup: {e}");
            }
        }
        let pidfd = crate::durable::proc::pidfd_open(child.id());
        let state_file = self.log_dir.join(format!("imaged-{}.json", &hex[..16.min(hex.len())]));
        let lifeline = (!self.durable).then_some(life_wr);
        let mut server = Server { child: Some(child), pidfd, lifeline, mountpoint, cgroup, state_file };
        match wait_ready(ready_rd) {
            Ok(()) => {
                tracing::info!(image = %image.id, mount = %server.mountpoint.display(), "image server ready");
                if self.durable {
                    self.record(image, &server);
                }
                Ok(server)
            }
            Err(e) => {
                server.kill();
                let err = std::fs::read_to_string(&log_path).unwrap_or_default();
                let mountpoint = server.mountpoint.clone();
                stop(server);
                let _ = std::fs::remove_dir(&mountpoint);
                Err(format!(
                    "image server for {}: {e}{}",
                    image.id,
                    if err.is_empty() { String::new() } else { format!(": {}", err.trim()) }
                ))
            }
        }
    }

    /// Writes the server's identity for a later broker (best effort: without
    /// it a restarted broker stops the server and fails its sandboxes).
    fn record(&self, image: &ImageRecord, server: &Server) {
        let Some(proc) = server.child.as_ref().and_then(|c| crate::durable::proc::ProcId::of(c.id())) else { return };
        let rec = ServerRecord {
            image_id: image.id.clone(),
            proc,
            mountpoint: server.mountpoint.clone(),
            cgroup: server.cgroup.clone(),
        };
        let tmp = server.state_file.with_extension("tmp");
        let written = serde_json::to_vec(&rec)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &server.state_file));
        if let Err(e) = written {
            tracing::warn!(image = %image.id, "recording the image server: {e}");
        }
    }

    /// Stops every server and detaches its mount.
    pub fn shutdown(&self) {
        let slots: Vec<Slot> = self.servers.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, s)| s).collect();
        for slot in slots {
            let mut st = slot.lock().unwrap_or_else(|p| p.into_inner());
            st.retired = true;
            if let Some(s) = st.server.take() {
                stop(s);
            }
        }
    }
}

/// Reads the server's "ready" line (EOF first means it failed).
fn wait_ready(fd: OwnedFd) -> Result<(), String> {
    let mut pfd = [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&fd), nix::poll::PollFlags::POLLIN)];
    let ms = READY_TIMEOUT.as_millis() as u16;
    match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(ms)) {
        Ok(0) => return Err(format!("not mounted within {READY_TIMEOUT:?}")),
        Ok(_) => {}
        Err(e) => return Err(format!("waiting for the mount: {e}")),
    }
    let mut buf = [0u8; 16];
    let n = nix::unistd::read(fd.as_raw_fd(), &mut buf).map_err(|e| format!("ready pipe: {e}"))?;
    if buf[..n].starts_with(b"ready") {
        Ok(())
    } else {
        Err("exited before mounting".into())
    }
}

/// The last lines of a server's log, for the broker's log (the file goes with the server).
fn log_tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Ends a server: its lifeline closes (it exits; a durable server, which
/// has none, is killed), it is reaped, its mount detached, its group,
/// record and log removed (a server of an image never used again, e.g. a
/// deleted snapshot's, would otherwise leave its log in the run dir).
fn stop(mut s: Server) {
    if s.lifeline.take().is_some() {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while s.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if s.alive() {
        s.kill();
    }
    let _ = std::fs::remove_file(&s.state_file);
    let _ = std::fs::remove_file(s.log_path());
    detach(&s.mountpoint);
    let _ = std::fs::remove_dir(&s.mountpoint);
    if let Some(g) = s.cgroup {
        let _ = g.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_server_leaves_no_record_log_or_mount_dir() {
        let run = tempfile::tempdir().expect("tempdir");
        let state_file = run.path().join("imaged-0123456789abcdef.json");
        let log = run.path().join("imaged-0123456789abcdef.log");
        let mountpoint = run.path().join("mnt-0123456789abcdef");
        std::fs::write(&state_file, b"{}").expect("record");
        std::fs::write(&log, b"first\nlast words\n").expect("log");
        std::fs::create_dir(&mountpoint).expect("mount dir");
        let server = Server {
            child: None,
            pidfd: None,
            lifeline: None,
            mountpoint: mountpoint.clone(),
            cgroup: None,
            state_file,
        };
        assert_eq!(server.log_path(), log);
        assert_eq!(log_tail(&log), "first | last words");
        stop(server);
        assert!(!log.exists(), "the log of a stopped server stays in the run dir");
        assert!(!mountpoint.exists());
        assert_eq!(std::fs::read_dir(run.path()).expect("run dir").count(), 0);
    }

    /// A create that finds its image's server dead restarts it; the sweep must still
    /// learn of the death, or the sandboxes of the old server stay Running without a root.
    #[test]
    fn a_death_a_create_finds_is_reported_by_the_sweep() {
        let run = tempfile::tempdir().expect("tempdir");
        let mut dead_child = Command::new("true").spawn().expect("spawn true");
        dead_child.wait().expect("wait");
        let id = "sha256:0123456789abcdef0123456789abcdef".to_string();
        let server = Server {
            child: Some(dead_child),
            pidfd: None,
            lifeline: None,
            mountpoint: run.path().join("mnt/0123456789abcdef"),
            cgroup: None,
            state_file: run.path().join("imaged-0123456789abcdef.json"),
        };
        let slot = SlotState { server: Some(server), ..Default::default() };
        let mounts = ImageMounts {
            imaged_bin: run.path().join("no-such-imaged"),
            pool_dir: run.path().join("pool"),
            mount_dir: run.path().join("mnt"),
            log_dir: run.path().to_path_buf(),
            ids: IdMap { uid_base: 100_000, gid_base: 100_000, count: 65_536 },
            cgroups: None,
            cgroup_prefix: "pvisor-test-".into(),
            servers: Mutex::new(HashMap::from([(id.clone(), std::sync::Arc::new(Mutex::new(slot)))])),
            durable: true,
            noticed: Mutex::new(Vec::new()),
        };
        let before = chrono::Utc::now();
        let image = ImageRecord {
            id: id.clone(),
            names: vec![],
            config: Default::default(),
            size_bytes: 0,
            imported_at: String::new(),
        };
        // The restart itself fails here (no server binary): the death is noticed either way.
        assert!(mounts.ensure(&image).is_err());
        let dead = mounts.take_dead();
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].image_id, id);
        assert!(dead[0].noticed >= before);
        assert!(mounts.take_dead().is_empty(), "a death is reported once");
    }
}

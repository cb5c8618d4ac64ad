//! Warm workers: processes already started and already in a fresh cgroup,
//! waiting (single-threaded) for a sandbox configuration. Taking one keeps
//! process start-up, cgroup creation and cgroup migration — the slow parts
//! of a start on these hosts — off the create path.
use crate::server::Ctx;
use nix::fcntl::OFlag;
use pvisor_worker::cgroup::GroupPaths;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct WarmWorker {
    pub child: tokio::process::Child,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The broker's end of the worker's lifeline pipe.
    pub lifeline: OwnedFd,
    /// Write end of the worker's configuration pipe.
    pub config: OwnedFd,
    pub cgroup: Option<GroupPaths>,
    /// The disk this worker mounts ahead, if asked (see [`DiskAhead`]).
    pub disk_ahead: Option<DiskAhead>,
}

/// How the directories of disks made ahead begin (never a sandbox id).
pub const AHEAD_PREFIX: &str = ".ahead-";

/// An ns sandbox's disk that a warm worker copies, attaches and mounts
/// (detached) before it has a sandbox (`pvisor_worker::ns::disk_ahead`): the
/// default bound's template, in `<sandboxes>/.ahead-<slot>` (beside the state
/// dirs: one file system for the rename; a start-up sweeps what is left). A create with that
/// template that finds it ready renames the directory to its state dir
/// ([`DiskAhead::take`]) and the worker attaches the mount there.
#[derive(Debug, Clone)]
pub struct DiskAhead {
    pub template: PathBuf,
    pub dir: PathBuf,
}

impl DiskAhead {
    /// What a warm worker of `ctx` mounts ahead: the default bound's disk,
    /// when the default backend is ns and this server bounds disks.
    fn of(ctx: &Ctx, slot: &str) -> Option<DiskAhead> {
        if ctx.default_backend != pvisor_worker::config::BackendKind::Ns {
            return None;
        }
        let template = ctx.disks.template(ctx.default_limits.disk_bytes).ok()??;
        Some(DiskAhead { template, dir: ctx.sandboxes_dir.join(format!("{AHEAD_PREFIX}{slot}")) })
    }

    /// Moves the disk to `state_dir` (which must not exist) if it is ready and
    /// of `template`; false if the create must make its own.
    pub fn take(&self, template: Option<&std::path::Path>, state_dir: &std::path::Path) -> bool {
        if template != Some(self.template.as_path()) || !self.dir.join(pvisor_worker::ns::disk::READY).exists() {
            return false;
        }
        match std::fs::rename(&self.dir, state_dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), "taking the disk made ahead: {e}");
                false
            }
        }
    }

    /// Removes it (not taken, or its worker is gone): only the image and the
    /// mark are here; the file system is the worker's (an fd, mounted nowhere).
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), "disk made ahead: {e}");
            }
        }
    }
}

/// Files and groups of a worker, released when it is discarded or torn down.
pub fn release_files(socket: &PathBuf, log: &PathBuf, cgroup: Option<&GroupPaths>) {
    if let Some(g) = cgroup {
        if let Err(e) = g.destroy() {
            tracing::warn!("cgroup cleanup: {e}");
        }
    }
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(log);
}

impl WarmWorker {
    /// Starts a worker that waits for its sandbox; a warm one (`ahead`) makes
    /// the default disk meanwhile, one started for a waiting create does not.
    pub fn spawn(ctx: &Ctx, ahead: bool) -> Result<WarmWorker, String> {
        let slot = format!("{:016x}", rand::random::<u64>());
        let cgroup = match &ctx.cgroups {
            Some(l) => Some(
                l.create_group(&format!("{}{slot}", ctx.cgroup_prefix), &ctx.default_limits)
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let socket = ctx.run_dir.join(format!("{slot}.sock"));
        let log = ctx.run_dir.join(format!("{slot}.log"));
        let disk_ahead = if ahead { DiskAhead::of(ctx, &slot) } else { None };
        let r = (|| -> Result<WarmWorker, String> {
            let listener = std::os::unix::net::UnixListener::bind(&socket)
                .map_err(|e| format!("worker socket {}: {e}", socket.display()))?;
            let (life_rd, life_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
            let (cfg_rd, cfg_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
            let logf = std::fs::File::create(&log).map_err(|e| format!("worker log: {e}"))?;
            let fds = [listener.as_raw_fd(), life_rd.as_raw_fd(), cfg_rd.as_raw_fd()];
            let cmd = pvisor_worker::launch::command(&ctx.worker_bin, cgroup.as_ref(), fds, logf)
                .map_err(|e| e.to_string())?;
            let mut cmd = tokio::process::Command::from(cmd);
            // Not killed with its handle: an assigned worker outlives the
            // broker (a warm one exits when its config pipe closes).
            cmd.kill_on_drop(false);
            let child = cmd.spawn().map_err(|e| format!("spawn {}: {e}", ctx.worker_bin.display()))?;
            if let Some(d) = &disk_ahead {
                let ahead = pvisor_worker::config::Ahead {
                    disk_template: d.template.to_string_lossy().into_owned(),
                    disk_dir: d.dir.to_string_lossy().into_owned(),
                };
                // A few hundred bytes: the pipe takes them without blocking.
                pvisor_worker::launch::send_ahead(&cfg_wr, &ahead).map_err(|e| format!("worker pipe: {e}"))?;
            }
            Ok(WarmWorker {
                child,
                socket: socket.clone(),
                log: log.clone(),
                lifeline: life_wr,
                config: cfg_wr,
                cgroup: cgroup.clone(),
                disk_ahead: disk_ahead.clone(),
            })
        })();
        if r.is_err() {
            release_files(&socket, &log, cgroup.as_ref());
            if let Some(d) = &disk_ahead {
                d.remove();
            }
        }
        r
    }

    /// Ends a worker that never got a sandbox.
    pub fn discard(mut self) {
        let _ = self.child.start_kill();
        release_files(&self.socket, &self.log, self.cgroup.as_ref());
        if let Some(d) = &self.disk_ahead {
            d.remove();
        }
    }
}

/// Delay between a create and the refill it triggers.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// The name a create gives in `extensions.poolRef` to be served by the warm
/// workers (the only pool this server has).
pub const WARM_POOL: &str = "default";

/// A small stock of warm workers, refilled in the background.
pub struct Pool {
    want: usize,
    idle: Mutex<VecDeque<WarmWorker>>,
    refilling: AtomicBool,
}

impl Pool {
    pub fn new(want: usize) -> Self {
        Pool { want, idle: Mutex::new(VecDeque::new()), refilling: AtomicBool::new(false) }
    }

    /// How many warm workers it keeps (`--warm-workers`; 0: no pool).
    pub fn size(&self) -> usize {
        self.want
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<WarmWorker>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live warm worker: from the stock if one is there, else a fresh one.
    pub fn take(&self, ctx: &Arc<Ctx>) -> Result<WarmWorker, String> {
        let found = loop {
            let Some(mut w) = self.idle().pop_front() else {
                break None;
            };
            match w.child.try_wait() {
                Ok(None) => break Some(w),
                _ => w.discard(),
            }
        };
        match found {
            Some(w) => Ok(w),
            None => WarmWorker::spawn(ctx, false),
        }
    }

    /// Discards the idle workers that died (killed, crashed) with their
    /// cgroup, socket and log, and says how many: a dead one would otherwise
    /// keep them until a create took it, and leave the stock short.
    /// Blocking (cgroup removal); the expiry sweep calls it.
    pub fn prune(&self) -> usize {
        let mut dead = Vec::new();
        {
            let mut idle = self.idle();
            let mut live = VecDeque::with_capacity(idle.len());
            for mut w in idle.drain(..) {
                match w.child.try_wait() {
                    Ok(None) => live.push_back(w),
                    _ => dead.push(w),
                }
            }
            *idle = live;
        }
        let n = dead.len();
        for w in dead {
            tracing::warn!(log = %w.log.display(), "a warm worker died; discarded");
            w.discard();
        }
        n
    }

    /// Tops the stock up, off the request path (call it once a create is
    /// done, so its cgroup work does not compete with the create). One refill
    /// runs at a time.
    pub fn refill(ctx: Arc<Ctx>) {
        if ctx.pool.want == 0 || ctx.pool.refilling.swap(true, Ordering::SeqCst) {
            return;
        }
        tokio::spawn(async move {
            // A worker's cgroup join stalls every fork on the host for an RCU
            // grace period: let the new sandbox's first command go first.
            tokio::time::sleep(REFILL_DELAY).await;
            let _ = tokio::task::spawn_blocking(move || Self::fill(&ctx)).await;
        });
    }

    /// Fills the stock now (service start-up, before the first request).
    pub async fn fill_now(ctx: &Arc<Ctx>) {
        if ctx.pool.refilling.swap(true, Ordering::SeqCst) {
            return;
        }
        let c = ctx.clone();
        let _ = tokio::task::spawn_blocking(move || Self::fill(&c)).await;
    }

    /// Spawns workers until the stock is full; runs on a blocking thread
    /// (cgroup set-up is synchronous) and clears the `refilling` flag.
    fn fill(ctx: &Arc<Ctx>) {
        while ctx.pool.idle().len() < ctx.pool.want {
            match WarmWorker::spawn(ctx, true) {
                Ok(w) => ctx.pool.idle().push_back(w),
                Err(e) => {
                    tracing::warn!("warm worker: {e}");
                    break;
                }
            }
        }
        ctx.pool.refilling.store(false, Ordering::SeqCst);
    }

    /// Ends every idle worker (service shutdown).
    pub fn drain(&self) {
        let all: Vec<WarmWorker> = self.idle().drain(..).collect();
        for w in all {
            w.discard();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(dir: &std::path::Path, name: &str, program: &str) -> WarmWorker {
        let (_, lifeline) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let (_, config) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let socket = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        std::fs::write(&socket, b"").expect("socket file");
        std::fs::write(&log, b"").expect("log file");
        let child = tokio::process::Command::new(program).arg("30").spawn().expect("spawn");
        WarmWorker { child, socket, log, lifeline, config, cgroup: None, disk_ahead: None }
    }

    #[tokio::test]
    async fn a_dead_warm_worker_is_pruned_with_its_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = Pool::new(2);
        let mut dead = worker(dir.path(), "dead", "true");
        dead.child.wait().await.expect("wait");
        let live = worker(dir.path(), "live", "sleep");
        pool.idle().push_back(dead);
        pool.idle().push_back(live);
        assert_eq!(pool.prune(), 1);
        assert_eq!(pool.idle().len(), 1);
        assert!(!dir.path().join("dead.sock").exists() && !dir.path().join("dead.log").exists());
        assert!(dir.path().join("live.sock").exists());
        assert_eq!(pool.prune(), 0, "a live worker stays");
        pool.drain();
    }
}

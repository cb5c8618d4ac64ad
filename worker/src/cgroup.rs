//! Sandbox cgroups on cgroup v1 (these hosts) and v2 (modern hosts).
//!
//! A sandbox group is created *beneath the broker's own group* in every
//! hierarchy used. It carries the limits and has two leaves, `worker` and
//! `sandbox`. A worker starts in `sandbox` everywhere, so the sandbox's init
//! inherits its place at clone time without a (slow) cgroup migration; the
//! worker then moves itself to `worker` where freezing needs the two apart
//! (v1's freezer hierarchy, v2's single one). The sandbox can then be frozen
//! without freezing its worker, and the limits cover both.
use crate::config::Limits;
use crate::error::{Result, WorkerError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const WORKER_LEAF: &str = "worker";
pub const SANDBOX_LEAF: &str = "sandbox";
/// v1 controllers pvisor uses.
const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|source| WorkerError::Cgroup { path: path.display().to_string(), source })
}

fn read(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `memory.stat` lines (`key value`); on v1 only the hierarchical
/// `total_` keys, renamed without the prefix.
fn parse_memory_stat(text: &str, v1: bool) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            let k = match v1 {
                true => k.strip_prefix("total_")?,
                false => k,
            };
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Where the calling process sits, per hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Unified hierarchy: the process's own group directory.
    V2 { base: PathBuf },
    /// Legacy hierarchies: controller → the process's own group directory.
    V1 { bases: BTreeMap<String, PathBuf> },
}

struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    opts: String,
}

fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let g: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                root: f.get(3)?.to_string(),
                point: PathBuf::from(f.get(4)?),
                fstype: g.first()?.to_string(),
                opts: g.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

fn join_rel(point: &Path, mount_root: &str, own: &str) -> PathBuf {
    let rel = own.strip_prefix(mount_root).unwrap_or(own).trim_start_matches('/');
    if rel.is_empty() {
        point.to_path_buf()
    } else {
        point.join(rel)
    }
}

impl Layout {
    /// Finds the hierarchies of the calling process. Prefers v2 when its
    /// memory controller is available, else v1's memory hierarchy.
    pub fn detect() -> Result<Layout> {
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| WorkerError::NoCgroup(e.to_string()))?;
        let mut v2_path = None;
        let mut v1_paths: BTreeMap<String, String> = BTreeMap::new();
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrls, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if ctrls.is_empty() {
                v2_path = Some(path.to_string());
            } else {
                for c in ctrls.split(',') {
                    v1_paths.insert(c.to_string(), path.to_string());
                }
            }
        }
        let ms = mounts();
        if let Some(p) = &v2_path {
            for m in ms.iter().filter(|m| m.fstype == "cgroup2") {
                let mut base = join_rel(&m.point, &m.root, p);
                // A broker that moved itself into `pvisor-broker` (below) and
                // restarted: its group is still the parent.
                if base.file_name().is_some_and(|n| n == BROKER_LEAF) {
                    base.pop();
                }
                let ctrls = read(&base.join("cgroup.controllers")).unwrap_or_default();
                if ctrls.split_whitespace().any(|c| c == "memory") && base.is_dir() {
                    return Ok(Layout::V2 { base });
                }
            }
        }
        let mut bases = BTreeMap::new();
        for m in ms.iter().filter(|m| m.fstype == "cgroup") {
            for c in V1_CONTROLLERS {
                if m.opts.split(',').any(|o| o == c) {
                    if let Some(p) = v1_paths.get(c) {
                        bases.insert(c.to_string(), join_rel(&m.point, &m.root, p));
                    }
                }
            }
        }
        if bases.contains_key("memory") {
            return Ok(Layout::V1 { bases });
        }
        Err(WorkerError::NoCgroup("neither a cgroup v2 memory controller nor a v1 memory hierarchy".into()))
    }

    /// Creates the sandbox group `name` with `limits` and its two leaves.
    pub fn create_group(&self, name: &str, limits: &Limits) -> Result<GroupPaths> {
        let g = match self {
            Layout::V2 { base } => {
                enable_v2_controllers(base)?;
                GroupPaths { v2: Some(base.join(name)), v1: BTreeMap::new() }
            }
            Layout::V1 { bases } => {
                GroupPaths { v2: None, v1: bases.iter().map(|(c, b)| (c.clone(), b.join(name))).collect() }
            }
        };
        for dir in g.dirs() {
            mkdir(&dir)?;
            for leaf in [WORKER_LEAF, SANDBOX_LEAF] {
                mkdir(&dir.join(leaf))?;
            }
        }
        g.set_limits(limits)?;
        Ok(g)
    }
}

fn mkdir(dir: &Path) -> Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(WorkerError::Cgroup { path: dir.display().to_string(), source }),
    }
}

/// Where a v2 broker moves itself when its own group must hand controllers
/// to children.
const BROKER_LEAF: &str = "pvisor-broker";

/// Enables `controller` for the children of `base`.
fn enable(base: &Path, controller: &str) -> std::io::Result<()> {
    let have = read(&base.join("cgroup.subtree_control")).unwrap_or_default();
    if have.split_whitespace().any(|h| h == controller) {
        return Ok(());
    }
    fs::write(base.join("cgroup.subtree_control"), format!("+{controller}"))
}

impl Layout {
    /// Makes the broker's group ready to hold sandbox groups, at start-up
    /// rather than at the first create, so a group that cannot hold them is
    /// reported before the service answers. v1 needs nothing.
    ///
    /// v2: the group must hand memory (cpu, pids) to children, which the "no
    /// internal processes" rule forbids while it holds processes. The broker
    /// moves itself into a `pvisor-broker` leaf (what a service started with
    /// `Delegate=yes` needs). If other processes share the group (a root shell's
    /// session scope, say), a root broker moves to a group of its own beside it,
    /// `<own_name>` under the same parent (so the parent's limits still apply);
    /// an unprivileged one cannot and says what to do.
    pub fn prepare(self, own_name: &str) -> Result<Layout> {
        let Layout::V2 { base } = &self else { return Ok(self) };
        match enable_v2_controllers(base) {
            Err(WorkerError::CgroupBusy(path)) if nix::unistd::geteuid().is_root() => {
                let Some(parent) = base.parent() else { return Err(WorkerError::CgroupBusy(path)) };
                let own = parent.join(own_name);
                mkdir(&own)?;
                tracing::warn!(
                    "cgroup {} holds other processes, so it cannot hold sandbox groups: using {} \
                     beside it (run pvisor as a service with Delegate=yes to keep it in its own)",
                    base.display(),
                    own.display()
                );
                mkdir(&own.join(BROKER_LEAF))?;
                write(&own.join(BROKER_LEAF).join("cgroup.procs"), &std::process::id().to_string())?;
                enable_v2_controllers(&own)?;
                Ok(Layout::V2 { base: own })
            }
            Err(e) => Err(e),
            Ok(()) => Ok(self),
        }
    }
}

/// v2: hands memory (required), cpu and pids (where delegated) to the
/// children of the broker's group. The "no internal processes" rule makes
/// that fail with EBUSY while the group has processes; then, and only then,
/// the broker moves itself (not other processes) into a `pvisor-broker`
/// child and tries again; still busy means other processes are there.
fn enable_v2_controllers(base: &Path) -> Result<()> {
    let err = |c: &str, source| WorkerError::Cgroup {
        path: format!("{}/cgroup.subtree_control (+{c})", base.display()),
        source,
    };
    match enable(base, "memory") {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let own = base.join(BROKER_LEAF);
            mkdir(&own)?;
            write(&own.join("cgroup.procs"), &std::process::id().to_string())?;
            match enable(base, "memory") {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(WorkerError::CgroupBusy(base.display().to_string()))
                }
                Err(e) => return Err(err("memory", e)),
            }
        }
        Err(e) => return Err(err("memory", e)),
    }
    for c in ["cpu", "pids"] {
        if let Err(e) = enable(base, c) {
            tracing::warn!(
                "cgroup controller {c} not available under {}: {e}; its limit is not enforced",
                base.display()
            );
        }
    }
    Ok(())
}

/// The directories of one sandbox group, per hierarchy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPaths {
    pub v2: Option<PathBuf>,
    pub v1: BTreeMap<String, PathBuf>,
}

impl GroupPaths {
    /// Distinct group directories (co-mounted v1 controllers share one).
    pub fn dirs(&self) -> Vec<PathBuf> {
        let mut d: Vec<PathBuf> = self.v2.iter().cloned().chain(self.v1.values().cloned()).collect();
        d.sort();
        d.dedup();
        d
    }

    /// Applies `limits` to the whole group (both leaves).
    pub fn set_limits(&self, limits: &Limits) -> Result<()> {
        self.set_bounds(limits)?;
        self.set_cpu(Some(limits.cpu_millis))
    }

    /// Bounds the group's CPU to `millis` thousandths of a core, or lifts
    /// the bound (`None`): a sandbox starts with none, so its start (the
    /// worker, the agent, a guest's boot) is not stretched by a small quota;
    /// the launch bounds it once the sandbox is ready.
    pub fn set_cpu(&self, millis: Option<u64>) -> Result<()> {
        if let Some(d) = &self.v2 {
            let max = millis.map_or_else(|| "max".to_string(), |m| (m * 100).to_string());
            return write(&d.join("cpu.max"), &format!("{max} 100000"));
        }
        match self.v1.get("cpu") {
            Some(dir) => {
                write(&dir.join("cpu.cfs_period_us"), "100000")?;
                write(&dir.join("cpu.cfs_quota_us"), &millis.map_or(-1, |m| (m * 100) as i64).to_string())
            }
            None => Ok(()),
        }
    }

    /// Applies every bound of `limits` but the CPU's (see [`Self::set_cpu`]).
    pub fn set_bounds(&self, limits: &Limits) -> Result<()> {
        if let Some(d) = &self.v2 {
            write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
            let _ = write(&d.join("memory.swap.max"), "0");
            return write(&d.join("pids.max"), &limits.pids.to_string());
        }
        let set = |c: &str, file: &str, v: String| -> Result<()> {
            match self.v1.get(c) {
                Some(dir) => write(&dir.join(file), &v),
                None => Ok(()),
            }
        };
        // memsw must stay >= memory: lower memory first when shrinking, raise
        // memsw first when growing (swap is off on our hosts; memsw may not exist).
        let mem = limits.memory_bytes.to_string();
        let _ = set("memory", "memory.memsw.limit_in_bytes", mem.clone());
        set("memory", "memory.limit_in_bytes", mem.clone())?;
        let _ = set("memory", "memory.memsw.limit_in_bytes", mem);
        set("pids", "pids.max", limits.pids.to_string())
    }

    /// Moves `pid` into `leaf` only where it matters for freezing: the
    /// freezer hierarchy on v1, the unified hierarchy on v2. (Limits sit on
    /// the group, so for them either leaf is the same.)
    pub fn join_freeze_scope(&self, leaf: &str, pid: i32) -> Result<()> {
        let dir = match (&self.v2, self.v1.get("freezer")) {
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => return Ok(()),
        };
        write(&dir.join(leaf).join("cgroup.procs"), &pid.to_string())
    }

    /// Moves process `pid` into `leaf` in every hierarchy.
    pub fn join(&self, leaf: &str, pid: i32) -> Result<()> {
        for dir in self.dirs() {
            write(&dir.join(leaf).join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Freezes or thaws `leaf` and waits until the kernel reports it done.
    pub fn freeze(&self, leaf: &str, frozen: bool) -> Result<()> {
        let (file, value, done) = match (&self.v2, self.v1.get("freezer")) {
            (Some(d), _) => (d.join(leaf).join("cgroup.freeze"), if frozen { "1" } else { "0" }, None),
            (None, Some(d)) => {
                let v = if frozen { "FROZEN" } else { "THAWED" };
                (d.join(leaf).join("freezer.state"), v, Some(v))
            }
            (None, None) => return Err(WorkerError::NoCgroup("no freezer".into())),
        };
        write(&file, value)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ok = match done {
                Some(v) => read(&file).as_deref() == Some(v),
                None => {
                    let events = read(&file.with_file_name("cgroup.events")).unwrap_or_default();
                    events.lines().any(|l| l == format!("frozen {value}"))
                }
            };
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(WorkerError::Cgroup {
                    path: file.display().to_string(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "freezer did not settle"),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Charged memory of the whole group, in bytes.
    pub fn memory_usage(&self) -> Option<u64> {
        match (&self.v2, self.v1.get("memory")) {
            (Some(d), _) => read(&d.join("memory.current"))?.parse().ok(),
            (None, Some(d)) => read(&d.join("memory.usage_in_bytes"))?.parse().ok(),
            _ => None,
        }
    }

    /// The whole group's `memory.stat`, in bytes: v2's keys as they are,
    /// v1's hierarchical `total_*` keys with the prefix stripped (so `rss`,
    /// `cache`, `mapped_file`, ... cover the worker and sandbox leaves).
    pub fn memory_stat(&self) -> Option<BTreeMap<String, u64>> {
        let (text, v1) = match (&self.v2, self.v1.get("memory")) {
            (Some(d), _) => (read(&d.join("memory.stat"))?, false),
            (None, Some(d)) => (read(&d.join("memory.stat"))?, true),
            _ => return None,
        };
        Some(parse_memory_stat(&text, v1))
    }

    /// Peak charged memory of the whole group, in bytes.
    pub fn memory_peak(&self) -> Option<u64> {
        match (&self.v2, self.v1.get("memory")) {
            (Some(d), _) => read(&d.join("memory.peak"))?.parse().ok(),
            (None, Some(d)) => read(&d.join("memory.max_usage_in_bytes"))?.parse().ok(),
            _ => None,
        }
    }

    /// CPU time used by the whole group, in microseconds.
    pub fn cpu_usage_us(&self) -> Option<u64> {
        match (&self.v2, self.v1.get("cpuacct")) {
            (Some(d), _) => read(&d.join("cpu.stat"))?
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec ").and_then(|v| v.parse().ok())),
            (None, Some(d)) => read(&d.join("cpuacct.usage"))?.parse::<u64>().ok().map(|ns| ns / 1000),
            _ => None,
        }
    }

    /// Every pid in the group (leaves included).
    pub fn pids(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for dir in self.dirs() {
            for sub in [dir.clone(), dir.join(WORKER_LEAF), dir.join(SANDBOX_LEAF)] {
                for l in read(&sub.join("cgroup.procs")).unwrap_or_default().lines() {
                    if let Ok(p) = l.parse() {
                        out.push(p);
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Kills every process in the group and removes its directories.
    pub fn destroy(&self) -> Result<()> {
        if let Some(d) = &self.v2 {
            let _ = write(&d.join("cgroup.kill"), "1");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if self.v1.contains_key("freezer") {
                let _ = self.freeze(SANDBOX_LEAF, false);
            }
            for p in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut last = Ok(());
        for dir in self.dirs() {
            for sub in [dir.join(WORKER_LEAF), dir.join(SANDBOX_LEAF), dir.clone()] {
                if sub.exists() {
                    if let Err(source) = rmdir_retry(&sub) {
                        last = Err(WorkerError::Cgroup { path: sub.display().to_string(), source });
                    }
                }
            }
        }
        last
    }
}

fn rmdir_retry(p: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match fs::remove_dir(p) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_join_under_mount_point() {
        assert_eq!(
            join_rel(Path::new("/sys/fs/cgroup/memory"), "/", "/a/b"),
            PathBuf::from("/sys/fs/cgroup/memory/a/b")
        );
        assert_eq!(join_rel(Path::new("/sys/fs/cgroup"), "/a", "/a/b"), PathBuf::from("/sys/fs/cgroup/b"));
        assert_eq!(join_rel(Path::new("/sys/fs/cgroup"), "/", "/"), PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn memory_stat_v1_keeps_hierarchical_totals() {
        let v1 = "cache 10\nrss 20\ntotal_cache 4096\ntotal_rss 8192\ntotal_mapped_file 12\n";
        let m = parse_memory_stat(v1, true);
        assert_eq!(m.get("cache"), Some(&4096));
        assert_eq!(m.get("rss"), Some(&8192));
        assert_eq!(m.len(), 3, "{m:?}");
        let m = parse_memory_stat("anon 1\nfile 2\nfile_mapped 3\n", false);
        assert_eq!((m["anon"], m["file"], m["file_mapped"]), (1, 2, 3));
    }

    /// Runs where a cgroup hierarchy is writable (as root on these hosts).
    #[test]
    fn group_limits_leaves_and_destroy() {
        let Ok(layout) = Layout::detect() else {
            pvisor_testkit::skip("no cgroup hierarchy");
            return;
        };
        let limits = Limits { cpu_millis: 500, memory_bytes: 64 << 20, pids: 77, disk_bytes: 0 };
        let name = format!("pvisor-test-{}", std::process::id());
        let g = match layout.create_group(&name, &limits) {
            Ok(g) => g,
            Err(e) => {
                pvisor_testkit::skip(format!("cannot create cgroups here: {e}"));
                return;
            }
        };
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        g.join(SANDBOX_LEAF, child.id() as i32).unwrap();
        assert_eq!(g.pids(), vec![child.id() as i32]);
        match &g.v2 {
            Some(d) => assert_eq!(read(&d.join("pids.max")).unwrap(), "77"),
            None => {
                assert_eq!(read(&g.v1["pids"].join("pids.max")).unwrap(), "77");
                assert_eq!(read(&g.v1["memory"].join("memory.limit_in_bytes")).unwrap(), (64u64 << 20).to_string());
                assert_eq!(read(&g.v1["cpu"].join("cpu.cfs_quota_us")).unwrap(), "50000");
            }
        }
        // The CPU bound lifts (a sandbox's start) and comes back; the other bounds stay.
        let cpu = || match &g.v2 {
            Some(d) => read(&d.join("cpu.max")).unwrap(),
            None => read(&g.v1["cpu"].join("cpu.cfs_quota_us")).unwrap(),
        };
        let bounded = cpu();
        g.set_cpu(None).unwrap();
        assert!(["max 100000", "-1"].contains(&cpu().as_str()), "{}", cpu());
        g.set_cpu(Some(250)).unwrap();
        assert!(["25000 100000", "25000"].contains(&cpu().as_str()), "{}", cpu());
        g.set_cpu(Some(500)).unwrap();
        assert_eq!(cpu(), bounded);
        assert_eq!(read(&g.v2.clone().unwrap_or_else(|| g.v1["pids"].clone()).join("pids.max")).unwrap(), "77");
        assert!(g.memory_usage().is_some());
        g.freeze(SANDBOX_LEAF, true).unwrap();
        g.freeze(SANDBOX_LEAF, false).unwrap();
        g.destroy().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "the sleeper must have been killed");
        assert!(g.dirs().iter().all(|d| !d.exists()));
    }
}

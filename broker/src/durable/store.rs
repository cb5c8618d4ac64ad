//! Sandbox records on disk: one JSON file per sandbox under
//! `<data>/state/sandboxes/<id>.json`, and the boot id of the host the
//! records were written on (`<data>/state/boot_id`).
//!
//! A record is written to a temporary file and renamed over the old one, so
//! a reader only ever sees a whole old record or a whole new one, and a
//! broker that dies at any point (SIGKILL included) leaves every record it
//! acknowledged in place: the page cache outlives the process. The fsync of
//! the file and the directory, which only a host crash needs, is done right
//! after by a background thread ([`Syncer`]), off the request path: a create
//! then pays one small write and a rename (~0.1 ms) instead of two fsyncs
//! (1-20 ms on a busy disk). What a host crash can lose this way is the last
//! few milliseconds of changes to sandboxes that the crash ended anyway
//! (after a reboot every sandbox is `Terminated`); a record torn by it is
//! skipped with a warning at load. Snapshot and volume records, which do
//! outlive a reboot, keep their synchronous fsyncs.
use super::proc::ProcId;
use chrono::{DateTime, Utc};
use pvisor_fstree::replace::{replace_file, Durability};
use pvisor_worker::cgroup::GroupPaths;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sandbox state {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("sandbox record {path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

/// The live worker of a sandbox, as a restarted broker finds it again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub proc: ProcId,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub state_dir: PathBuf,
    #[serde(default)]
    pub cgroup: Option<GroupPaths>,
}

/// Everything the broker knows of one sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRecord {
    pub id: String,
    pub token: String,
    pub image_uri: String,
    pub image_id: String,
    pub entrypoint: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// `Running`, `Paused`, `Failed` or `Terminated`.
    pub state: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    pub since: DateTime<Utc>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The egress policy as the API shows it (`None`: no network).
    #[serde(default)]
    pub egress: Option<serde_json::Value>,
    #[serde(default)]
    pub origin: crate::snapshot::Origin,
    /// What the create asked for that the API shows back.
    #[serde(default)]
    pub requested: crate::sandbox::requested::Requested,
    /// Unset once the sandbox holds no process (failed, terminated).
    #[serde(default)]
    pub worker: Option<WorkerRecord>,
    /// Named volumes it holds, and those that go with it.
    #[serde(default)]
    pub volumes_in_use: Vec<String>,
    #[serde(default)]
    pub volumes_to_delete: Vec<String>,
    /// A delete or expiry was decided: a restarted broker finishes it.
    #[serde(default)]
    pub deleting: bool,
}

/// Sandbox ids are uuids: nothing else names a record file.
fn valid_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

pub struct SandboxStore {
    dir: PathBuf,
    syncer: Syncer,
}

/// Makes written records durable in the background: paths queued by
/// [`SandboxStore::write`] are fsynced, then their directory once per batch.
struct Syncer {
    queue: std::sync::Arc<(std::sync::Mutex<std::collections::BTreeSet<PathBuf>>, std::sync::Condvar)>,
}

impl Syncer {
    fn start(dir: PathBuf) -> Syncer {
        let queue: std::sync::Arc<(std::sync::Mutex<std::collections::BTreeSet<PathBuf>>, std::sync::Condvar)> =
            Default::default();
        let q = queue.clone();
        let spawned = std::thread::Builder::new().name("state-sync".into()).spawn(move || loop {
            let batch = {
                let (lock, cv) = &*q;
                let mut pending = lock.lock().unwrap_or_else(|e| e.into_inner());
                while pending.is_empty() {
                    pending = cv.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                std::mem::take(&mut *pending)
            };
            for p in &batch {
                // Gone meanwhile (removed, or replaced: then queued again).
                if let Ok(f) = fs::File::open(p) {
                    let _ = f.sync_all();
                }
            }
            if let Err(e) = fs::File::open(&dir).and_then(|d| d.sync_all()) {
                tracing::warn!("syncing {}: {e}", dir.display());
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(
                "no background sync of sandbox records ({e}): they reach the disk with the kernel's writeback"
            );
        }
        Syncer { queue }
    }

    fn queue(&self, p: PathBuf) {
        let (lock, cv) = &*self.queue;
        lock.lock().unwrap_or_else(|e| e.into_inner()).insert(p);
        cv.notify_one();
    }
}

impl SandboxStore {
    /// Opens (creating, 0700) `dir`.
    pub fn open(dir: &Path) -> Result<SandboxStore, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io_err(dir))?;
        Ok(SandboxStore { dir: dir.to_path_buf(), syncer: Syncer::start(dir.to_path_buf()) })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Every record (leftover temporary files removed; an unreadable record
    /// is logged and skipped, never fatal).
    pub fn load(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let e = e.map_err(io_err(&self.dir))?;
            let path = e.path();
            let fname = e.file_name().to_string_lossy().into_owned();
            if fname.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(id) = fname.strip_suffix(".json").filter(|i| valid_id(i)) else { continue };
            let parsed = fs::read(&path).map_err(io_err(&path)).and_then(|b| {
                serde_json::from_slice::<SandboxRecord>(&b)
                    .map_err(|source| StoreError::Json { path: path.clone(), source })
            });
            match parsed {
                Ok(r) if r.id == id => out.push(r),
                Ok(_) => tracing::warn!("{}: names another sandbox; ignored", path.display()),
                Err(e) => tracing::warn!("{e}; ignored"),
            }
        }
        out.sort_by_key(|r| r.created_at);
        Ok(out)
    }

    /// Writes a record: whole or not at all, in place (for any later
    /// broker) before this returns, on the disk shortly after (see the
    /// module docs).
    pub fn write(&self, rec: &SandboxRecord) -> Result<(), StoreError> {
        let path = self.path(&rec.id);
        let bytes = serde_json::to_vec(rec).map_err(|source| StoreError::Json { path: path.clone(), source })?;
        replace_file(&path, &bytes, Durability::Deferred).map_err(io_err(&path))?;
        self.syncer.queue(path);
        Ok(())
    }

    /// Removes a record (gone already is fine).
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.syncer.queue(self.dir.clone());
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }
}

/// This boot of the host: `/proc/sys/kernel/random/boot_id`, or, for tests
/// that simulate a host restart, `PVISOR_TEST_BOOT_ID`.
pub fn current_boot_id() -> String {
    if let Some(fake) = std::env::var("PVISOR_TEST_BOOT_ID").ok().filter(|s| !s.is_empty()) {
        return fake;
    }
    fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Records `boot` in `file`; returns the boot id that was there before
/// (None on a fresh data dir).
pub fn swap_boot_id(file: &Path, boot: &str) -> Result<Option<String>, StoreError> {
    let before = match fs::read_to_string(file) {
        Ok(s) => Some(s.trim().to_string()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(StoreError::Io { path: file.to_path_buf(), source: e }),
    };
    if before.as_deref() != Some(boot) {
        replace_file(file, boot.as_bytes(), Durability::Synced).map_err(io_err(file))?;
    }
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            token: "t".into(),
            image_uri: "img".into(),
            image_id: "sha256:00".into(),
            entrypoint: vec!["sleep".into()],
            created_at: Utc::now(),
            state: "Running".into(),
            reason: None,
            message: None,
            since: Utc::now(),
            expires_at: None,
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            egress: None,
            origin: Default::default(),
            requested: Default::default(),
            worker: None,
            volumes_in_use: vec![],
            volumes_to_delete: vec![],
            deleting: false,
        }
    }

    #[test]
    fn records_round_trip_and_leftovers_are_dropped() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = SandboxStore::open(d.path()).expect("open");
        let id = "0123abcd-0000-4000-8000-000000000000";
        s.write(&rec(id)).expect("write");
        fs::write(d.path().join(format!("{id}.json.tmp")), b"{half").expect("tmp");
        fs::write(d.path().join("11111111-0000-4000-8000-000000000000.json"), b"{broken").expect("broken");
        let all = s.load().expect("load");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].metadata.get("k").map(String::as_str), Some("v"));
        assert!(!d.path().join(format!("{id}.json.tmp")).exists());
        s.remove(id).expect("remove");
        s.remove(id).expect("remove twice");
        assert!(s.load().expect("load").is_empty());
    }

    #[test]
    fn boot_id_swaps() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("boot_id");
        assert_eq!(swap_boot_id(&f, "a").expect("first"), None);
        assert_eq!(swap_boot_id(&f, "a").expect("same"), Some("a".into()));
        assert_eq!(swap_boot_id(&f, "b").expect("changed"), Some("a".into()));
        assert_eq!(fs::read_to_string(&f).expect("read"), "b");
    }
}

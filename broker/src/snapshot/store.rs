//! Snapshot records: in memory, and one JSON file each under
//! `<data>/snapshots/`, written crash-safely (temporary file, fsync,
//! rename, fsync of the directory), so a snapshot survives a broker restart.
//! A record left `Creating` by a broker that died is `Failed` at the next
//! start (its capture is gone with that broker).
use chrono::{DateTime, Utc};
use pvisor_fstree::replace::{replace_file, Durability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub const REASON_ACCEPTED: &str = "snapshot_accepted";
pub const MESSAGE_ACCEPTED: &str = "Snapshot creation accepted.";
pub const REASON_READY: &str = "snapshot_runtime_ready";
pub const MESSAGE_READY: &str = "Snapshot image created successfully.";
pub const REASON_FAILED: &str = "snapshot_runtime_failed";
pub const REASON_TIMEOUT: &str = "snapshot_runtime_timeout";
pub const REASON_DELETE: &str = "snapshot_delete_requested";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapState {
    Creating,
    Ready,
    Failed,
    Deleting,
}

impl SnapState {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapState::Creating => "Creating",
            SnapState::Ready => "Ready",
            SnapState::Failed => "Failed",
            SnapState::Deleting => "Deleting",
        }
    }
}

/// One snapshot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub sandbox_id: String,
    #[serde(default)]
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub state: SnapState,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    pub last_transition_at: DateTime<Utc>,
    /// The source sandbox's image (its uri as created).
    pub source_image: String,
    /// Pool id of the snapshot's image, once Ready.
    #[serde(default)]
    pub image_id: Option<String>,
    /// Backend of the source (`ns`, `vm`).
    pub backend: String,
    /// A vm snapshot's machine (its files are in [`SnapshotStore::vm_dir`]).
    #[serde(default)]
    pub vm: Option<VmSnapshot>,
}

/// What a vm snapshot holds beside its files (`state`: the machine, with
/// guest memory under QEMU; `memory`: guest memory under the project's VMM;
/// `scratch.img`: the scratch disk), and what a restore must match: the same
/// guest kernel, initramfs and engine, shape and devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSnapshot {
    /// The source's image in the pool (the restore's root disk).
    pub image_id: String,
    /// The guest kernel command line the source booted with.
    pub cmdline: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Whether the source had a network (a virtio-net device).
    pub net: bool,
    /// `VmAssets::identity` when it was taken.
    pub assets: String,
    /// The agent's configuration in the source (a restored agent keeps it).
    pub agent_env: Vec<String>,
    pub agent_workdir: String,
    pub agent_user: String,
    pub agent_entrypoint: Vec<String>,
    /// Its lifecycle hooks (the restored agent goes on running them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_lifecycle: Option<crate::sandbox::hooks::Lifecycle>,
    pub state_bytes: u64,
}

impl SnapshotRecord {
    pub fn transition(&mut self, state: SnapState, reason: &str, message: impl Into<String>) {
        self.state = state;
        self.reason = Some(reason.to_owned());
        self.message = Some(message.into());
        self.last_transition_at = Utc::now();
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("snapshot store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("snapshot record {path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

pub struct SnapshotStore {
    dir: PathBuf,
    map: Mutex<BTreeMap<String, SnapshotRecord>>,
}

/// Snapshot ids are uuids: nothing else names a record file.
fn valid_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

impl SnapshotStore {
    /// Loads every record under `dir` (created 0700 if missing), failing the
    /// ones a previous broker left Creating; returns them too, so the caller
    /// can drop what their capture left in the pool.
    pub fn open(dir: &Path) -> Result<(SnapshotStore, Vec<SnapshotRecord>), StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io_err(dir))?;
        let store = SnapshotStore { dir: dir.to_path_buf(), map: Mutex::new(BTreeMap::new()) };
        let mut interrupted = Vec::new();
        for e in fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let path = e.path();
            let fname = e.file_name().to_string_lossy().into_owned();
            // Leftovers of a write or a capture that did not finish.
            if fname.ends_with(".tmp") || fname.ends_with(".layer.tar") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(id) = fname.strip_suffix(".json").filter(|i| valid_id(i)) else { continue };
            let bytes = fs::read(&path).map_err(io_err(&path))?;
            let mut rec: SnapshotRecord =
                serde_json::from_slice(&bytes).map_err(|source| StoreError::Json { path: path.clone(), source })?;
            if rec.id != id {
                continue;
            }
            match rec.state {
                SnapState::Creating => {
                    rec.transition(
                        SnapState::Failed,
                        REASON_FAILED,
                        "the server restarted while the snapshot was being created",
                    );
                    store.write(&rec)?;
                    interrupted.push(rec.clone());
                }
                SnapState::Deleting => {
                    // The delete was decided; finish it.
                    interrupted.push(rec.clone());
                    store.unlink(&rec.id)?;
                    continue;
                }
                _ => {}
            }
            store.lock().insert(rec.id.clone(), rec);
        }
        // vm files of interrupted captures, and of records gone (a delete
        // that ended between the record and its files).
        for rec in &interrupted {
            store.remove_vm_files(&rec.id);
        }
        for e in fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
            let fname = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = fname.strip_suffix(".vm") {
                if !store.lock().contains_key(id) {
                    store.remove_vm_files(id);
                }
            }
        }
        Ok((store, interrupted))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, SnapshotRecord>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Where a vm snapshot's files are.
    pub fn vm_dir(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.vm"))
    }

    /// Removes a vm snapshot's files (if any).
    pub fn remove_vm_files(&self, id: &str) {
        match fs::remove_dir_all(self.vm_dir(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(snapshot = %id, "removing the snapshot's vm files: {e}"),
        }
    }

    /// The capture spool of a snapshot (removed at startup if left over).
    pub fn spool_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!(".{id}.layer.tar"))
    }

    fn write(&self, rec: &SnapshotRecord) -> Result<(), StoreError> {
        let path = self.path(&rec.id);
        let bytes = serde_json::to_vec_pretty(rec).map_err(|source| StoreError::Json { path: path.clone(), source })?;
        replace_file(&path, &bytes, Durability::Synced).map_err(io_err(&path))
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io_err(&self.dir))
    }

    fn unlink(&self, id: &str) -> Result<(), StoreError> {
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io { path, source: e }),
        }
    }

    /// Adds a record (on disk first).
    pub fn insert(&self, rec: SnapshotRecord) -> Result<(), StoreError> {
        let mut map = self.lock();
        self.write(&rec)?;
        map.insert(rec.id.clone(), rec);
        Ok(())
    }

    /// Changes a record in memory and on disk; returns the new record.
    pub fn update(&self, id: &str, f: impl FnOnce(&mut SnapshotRecord)) -> Result<Option<SnapshotRecord>, StoreError> {
        let mut map = self.lock();
        let Some(rec) = map.get_mut(id) else { return Ok(None) };
        let mut next = rec.clone();
        f(&mut next);
        self.write(&next)?;
        *rec = next.clone();
        Ok(Some(next))
    }

    pub fn get(&self, id: &str) -> Option<SnapshotRecord> {
        self.lock().get(id).cloned()
    }

    /// Every record, newest first.
    pub fn list(&self) -> Vec<SnapshotRecord> {
        let mut v: Vec<SnapshotRecord> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        v
    }

    /// Marks a record Deleting (on disk, so a broker that dies meanwhile
    /// finishes the delete at its next start), if `check` allows it.
    pub fn begin_delete<E>(
        &self,
        id: &str,
        check: impl FnOnce(&SnapshotRecord) -> Result<(), E>,
    ) -> Result<Option<Result<SnapshotRecord, E>>, StoreError> {
        let mut map = self.lock();
        let Some(rec) = map.get_mut(id) else { return Ok(None) };
        if let Err(e) = check(rec) {
            return Ok(Some(Err(e)));
        }
        let mut next = rec.clone();
        next.transition(SnapState::Deleting, REASON_DELETE, "Snapshot deletion requested.");
        self.write(&next)?;
        *rec = next.clone();
        Ok(Some(Ok(next)))
    }

    /// Takes a record out (memory and disk), if `check` allows it.
    pub fn remove<E>(
        &self,
        id: &str,
        check: impl FnOnce(&SnapshotRecord) -> Result<(), E>,
    ) -> Result<Option<Result<SnapshotRecord, E>>, StoreError> {
        let mut map = self.lock();
        let Some(rec) = map.get(id) else { return Ok(None) };
        if let Err(e) = check(rec) {
            return Ok(Some(Err(e)));
        }
        self.unlink(id)?;
        Ok(map.remove(id).map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, state: SnapState) -> SnapshotRecord {
        let now = Utc::now();
        SnapshotRecord {
            id: id.into(),
            sandbox_id: "sb".into(),
            name: None,
            created_at: now,
            state,
            reason: None,
            message: None,
            last_transition_at: now,
            source_image: "busybox".into(),
            image_id: None,
            backend: "ns".into(),
            vm: None,
        }
    }

    #[test]
    fn records_survive_reopen_and_creating_becomes_failed() {
        let dir = tempfile::tempdir().unwrap();
        let a = "aaaaaaaa-aaaa-4aaa-aaaa-aaaaaaaaaaaa";
        let b = "bbbbbbbb-bbbb-4bbb-bbbb-bbbbbbbbbbbb";
        {
            let (s, _) = SnapshotStore::open(dir.path()).unwrap();
            s.insert(rec(a, SnapState::Ready)).unwrap();
            s.insert(rec(b, SnapState::Creating)).unwrap();
            std::fs::write(s.spool_path(b), b"partial").unwrap();
        }
        let (s, interrupted) = SnapshotStore::open(dir.path()).unwrap();
        assert_eq!(s.get(a).unwrap().state, SnapState::Ready);
        let failed = s.get(b).unwrap();
        assert_eq!(failed.state, SnapState::Failed);
        assert_eq!(failed.reason.as_deref(), Some(REASON_FAILED));
        assert_eq!(interrupted.len(), 1);
        assert!(!s.spool_path(b).exists());
        let removed = s.remove::<()>(a, |_| Ok(())).unwrap();
        assert!(matches!(removed, Some(Ok(_))));
        assert!(s.get(a).is_none());
        let (s, _) = SnapshotStore::open(dir.path()).unwrap();
        assert!(s.get(a).is_none());
    }

    #[test]
    fn vm_files_of_interrupted_and_unknown_snapshots_are_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (ready, creating, orphan) = (
            "aaaaaaaa-aaaa-4aaa-aaaa-aaaaaaaaaaaa",
            "bbbbbbbb-bbbb-4bbb-bbbb-bbbbbbbbbbbb",
            "cccccccc-cccc-4ccc-cccc-cccccccccccc",
        );
        {
            let (s, _) = SnapshotStore::open(dir.path()).unwrap();
            s.insert(rec(ready, SnapState::Ready)).unwrap();
            s.insert(rec(creating, SnapState::Creating)).unwrap();
            for id in [ready, creating, orphan] {
                std::fs::create_dir_all(s.vm_dir(id)).unwrap();
                std::fs::write(s.vm_dir(id).join("state"), b"x").unwrap();
            }
        }
        let (s, _) = SnapshotStore::open(dir.path()).unwrap();
        assert!(s.vm_dir(ready).join("state").is_file(), "a Ready snapshot keeps its files");
        assert!(!s.vm_dir(creating).exists(), "an interrupted capture's files are removed");
        assert!(!s.vm_dir(orphan).exists(), "files without a record are removed");
        assert_eq!(s.get(creating).unwrap().state, SnapState::Failed);
    }

    #[test]
    fn only_uuid_named_files_are_records() {
        assert!(valid_id("aaaaaaaa-aaaa-4aaa-aaaa-aaaaaaaaaaaa"));
        assert!(!valid_id("../../etc/passwd"));
    }
}

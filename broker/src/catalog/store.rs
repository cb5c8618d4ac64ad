//! Template records: in memory, and one JSON file each under
//! `<data>/catalog/<id>.json`, written crash-safely (temporary file, fsync,
//! rename, fsync of the directory) like snapshot records: a template
//! outlives broker restarts and host reboots alike.
use super::record::{valid_id, TemplateRecord};
use pvisor_fstree::replace::{replace_file, Durability};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("template store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("template record {path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_path_buf(), source }
}

pub struct TemplateStore {
    dir: PathBuf,
    map: Mutex<BTreeMap<String, TemplateRecord>>,
}

impl TemplateStore {
    /// Loads every record under `dir` (created 0700 if missing). A record
    /// that does not parse is skipped with a warning (and left in place).
    pub fn open(dir: &Path) -> Result<TemplateStore, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io_err(dir))?;
        let store = TemplateStore { dir: dir.to_path_buf(), map: Mutex::new(BTreeMap::new()) };
        for e in fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let path = e.path();
            let fname = e.file_name().to_string_lossy().into_owned();
            if fname.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(id) = fname.strip_suffix(".json").filter(|i| valid_id(i)) else { continue };
            let bytes = fs::read(&path).map_err(io_err(&path))?;
            match serde_json::from_slice::<TemplateRecord>(&bytes) {
                Ok(rec) if rec.id == id => {
                    store.lock().insert(rec.id.clone(), rec);
                }
                Ok(_) => tracing::warn!(path = %path.display(), "a template record of another id; skipped"),
                Err(e) => tracing::warn!(path = %path.display(), "template record skipped: {e}"),
            }
        }
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, TemplateRecord>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Adds a record (on disk first).
    pub fn insert(&self, rec: TemplateRecord) -> Result<(), StoreError> {
        let mut map = self.lock();
        let path = self.path(&rec.id);
        let bytes =
            serde_json::to_vec_pretty(&rec).map_err(|source| StoreError::Json { path: path.clone(), source })?;
        replace_file(&path, &bytes, Durability::Synced).map_err(io_err(&path))?;
        map.insert(rec.id.clone(), rec);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<TemplateRecord> {
        self.lock().get(id).cloned()
    }

    /// Every record, newest first.
    pub fn list(&self) -> Vec<TemplateRecord> {
        let mut v: Vec<TemplateRecord> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        v
    }

    /// Takes a record out (disk first); `None` if there was none.
    pub fn remove(&self, id: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let mut map = self.lock();
        if !map.contains_key(id) {
            return Ok(None);
        }
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io_err(&self.dir))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::Io { path, source: e }),
        }
        Ok(map.remove(id))
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::{new_id, Format, Phase};
    use super::*;
    use chrono::{Duration, Utc};

    fn rec(age_secs: i64) -> TemplateRecord {
        let t = Utc::now() - Duration::seconds(age_secs);
        TemplateRecord {
            id: new_id(),
            image: "busybox:latest".into(),
            publish: "s3://b/p".into(),
            format: Format::Native,
            resource_limits: Some(BTreeMap::from([("memory".into(), "256Mi".into())])),
            entrypoint: Some(vec!["sleep".into(), "60".into()]),
            env: Some(BTreeMap::from([("A".into(), "1".into())])),
            metadata: BTreeMap::from([("team".into(), "x".into())]),
            readiness: None,
            phase: Phase::Succeeded,
            message: None,
            created_at: t,
            updated_at: t,
        }
    }

    #[test]
    fn records_survive_a_reopen_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (rec(60), rec(1));
        {
            let s = TemplateStore::open(dir.path()).unwrap();
            s.insert(old.clone()).unwrap();
            s.insert(new.clone()).unwrap();
        }
        let s = TemplateStore::open(dir.path()).unwrap();
        assert_eq!(s.get(&old.id), Some(old.clone()));
        assert_eq!(s.list().iter().map(|r| r.id.clone()).collect::<Vec<_>>(), [new.id.clone(), old.id.clone()]);
        assert_eq!(s.remove(&old.id).unwrap(), Some(old.clone()));
        assert_eq!(s.remove(&old.id).unwrap(), None);
        let s = TemplateStore::open(dir.path()).unwrap();
        assert!(s.get(&old.id).is_none());
        assert!(s.get(&new.id).is_some());
    }

    #[test]
    fn foreign_and_broken_files_are_not_records() {
        let dir = tempfile::tempdir().unwrap();
        let good = rec(0);
        {
            let s = TemplateStore::open(dir.path()).unwrap();
            s.insert(good.clone()).unwrap();
        }
        let broken = new_id();
        std::fs::write(dir.path().join(format!("{broken}.json")), b"{not json").unwrap();
        std::fs::write(dir.path().join("notes.json"), b"{}").unwrap();
        std::fs::write(dir.path().join(format!("{}.json.tmp", new_id())), b"half").unwrap();
        let s = TemplateStore::open(dir.path()).unwrap();
        assert_eq!(s.list().len(), 1);
        assert!(s.get(&broken).is_none());
        assert!(dir.path().join(format!("{broken}.json")).exists(), "a broken record is left for a person");
    }
}

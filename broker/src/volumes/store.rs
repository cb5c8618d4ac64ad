//! Named volumes (`pvc` in the API, Docker's named volumes in the
//! reference): `<data>/volumes/<name>/_data` holds the content and
//! `<name>/volume.json` the metadata.
//!
//! "In use" is a lock, not a list: every sandbox mounting a volume holds a
//! shared `flock` on its `volume.json` for as long as it lives (the broker
//! keeps the open file in the sandbox's runtime, so it is released at
//! teardown and when the broker dies). `rm` takes the lock exclusively
//! without waiting and refuses while any sandbox holds it, so it works the
//! same from the CLI (another process) and the broker.
use super::error::VolumeError;
use chrono::{SecondsFormat, Utc};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const META: &str = "volume.json";
const DATA: &str = "_data";
/// `Labels` entry naming who created a volume (`api`: a sandbox create, `cli`).
pub const CREATED_BY: &str = "pvisor.io/created-by";

/// The metadata file, in `docker volume inspect`'s vocabulary.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VolumeInfo {
    pub name: String,
    pub driver: String,
    pub mountpoint: String,
    pub created_at: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub scope: String,
}

/// A volume's `volume.json` locked shared: the sandbox holding it uses the volume.
#[derive(Debug)]
pub struct InUse {
    _lock: Flock<File>,
}

/// A random name suffix for temporary directories.
fn suffix() -> String {
    let b: [u8; 8] = rand::random();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store under a data directory (`<data>/volumes`).
    pub fn new(data_dir: &Path) -> Self {
        Store { root: data_dir.join("volumes") }
    }

    fn err(name: &str, what: &str, e: impl std::fmt::Display) -> VolumeError {
        VolumeError::Store { name: name.to_string(), reason: format!("{what}: {e}") }
    }

    /// The directory a volume's content lives in (`Mountpoint`).
    pub fn data_dir(&self, name: &str) -> PathBuf {
        self.root.join(name).join(DATA)
    }

    /// The volume's metadata, or None if it does not exist.
    pub fn inspect(&self, name: &str) -> Result<Option<VolumeInfo>, VolumeError> {
        match std::fs::read(self.root.join(name).join(META)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| Self::err(name, "volume.json", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::err(name, "volume.json", e)),
        }
    }

    /// Every volume, by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::err("*", "list", e)),
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if let Some(v) = self.inspect(&name)? {
                out.push(v);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Creates a volume; Ok(false) if it already existed (left as it is).
    /// Atomic: built under a temporary name, then renamed into place.
    pub fn create(&self, name: &str, created_by: &str) -> Result<bool, VolumeError> {
        std::fs::create_dir_all(&self.root).map_err(|e| Self::err(name, "mkdir", e))?;
        if self.root.join(name).join(META).exists() {
            return Ok(false);
        }
        let tmp = self.root.join(format!(".new-{name}-{}", suffix()));
        let built = (|| {
            std::fs::create_dir_all(tmp.join(DATA)).map_err(|e| Self::err(name, "mkdir", e))?;
            let info = VolumeInfo {
                name: name.to_string(),
                driver: "local".into(),
                mountpoint: self.data_dir(name).to_string_lossy().into_owned(),
                created_at: Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true),
                labels: BTreeMap::from([(CREATED_BY.to_string(), created_by.to_string())]),
                scope: "local".into(),
            };
            let json = serde_json::to_vec_pretty(&info).map_err(|e| Self::err(name, "encode", e))?;
            std::fs::write(tmp.join(META), json).map_err(|e| Self::err(name, "write volume.json", e))
        })();
        let placed = built.and_then(|()| match std::fs::rename(&tmp, self.root.join(name)) {
            Ok(()) => Ok(true),
            // Someone else created it meanwhile (rename onto a non-empty dir).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => Ok(false),
            Err(e) => Err(Self::err(name, "rename", e)),
        });
        if let Err(e) = pvisor_fstree::remove_tree(&tmp) {
            if !e.is_not_found() {
                tracing::warn!("removing {}: {e}", tmp.display());
            }
        }
        placed
    }

    /// Marks a volume in use (a shared lock held until the result is dropped).
    pub fn hold(&self, name: &str) -> Result<InUse, VolumeError> {
        let path = self.root.join(name).join(META);
        let f = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VolumeError::PvcNotFound(name.to_string()),
            _ => Self::err(name, "open volume.json", e),
        })?;
        let lock = Flock::lock(f, FlockArg::LockShared).map_err(|(_, e)| Self::err(name, "lock", e))?;
        // An `rm` may have won between the open and the lock: the file we
        // locked must still be the volume's.
        let same = std::fs::metadata(&path).ok().zip(lock.metadata().ok()).is_some_and(|(a, b)| a.ino() == b.ino());
        if !same {
            return Err(VolumeError::PvcNotFound(name.to_string()));
        }
        Ok(InUse { _lock: lock })
    }

    /// Removes a volume and its content, unless a sandbox uses it.
    pub fn remove(&self, name: &str) -> Result<(), VolumeError> {
        let dir = self.root.join(name);
        let f = File::open(dir.join(META)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VolumeError::NotFound(name.to_string()),
            _ => Self::err(name, "open volume.json", e),
        })?;
        let lock = Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
            nix::errno::Errno::EWOULDBLOCK => VolumeError::InUse(name.to_string()),
            e => Self::err(name, "lock", e),
        })?;
        // Out of the namespace first (a create or hold now sees it missing), then deleted.
        let trash = self.root.join(format!(".rm-{name}-{}", suffix()));
        std::fs::rename(&dir, &trash).map_err(|e| Self::err(name, "rename", e))?;
        drop(lock);
        // The content is the sandboxes': iterative, fd-relative, any depth.
        pvisor_fstree::remove_tree(&trash).map(drop).map_err(|e| Self::err(name, "remove", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_hold_remove() {
        let d = tempfile::tempdir().expect("tempdir");
        let s = Store::new(d.path());
        assert!(s.create("v1", "cli").expect("create"));
        assert!(!s.create("v1", "cli").expect("again"));
        assert_eq!(s.list().expect("ls").len(), 1);
        let info = s.inspect("v1").expect("inspect").expect("exists");
        assert_eq!(Path::new(&info.mountpoint), s.data_dir("v1"));
        assert!(s.data_dir("v1").is_dir());
        let held = s.hold("v1").expect("hold");
        assert_eq!(s.remove("v1").map_err(|e| e.code()), Err("VOLUME::IN_USE"));
        drop(held);
        s.remove("v1").expect("rm");
        assert!(s.inspect("v1").expect("inspect").is_none());
        assert_eq!(s.remove("v1").map_err(|e| e.code()), Err("VOLUME::NOT_FOUND"));
        assert_eq!(s.hold("v1").map(|_| ()).map_err(|e| e.code()), Err("VOLUME::PVC_NOT_FOUND"));
    }
}

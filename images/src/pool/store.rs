//! On-disk layout, metadata files and locking.
//!
//! ```text
//! root/
//!   lock           flock'ed (exclusively) while names or the image set change
//!   gc.lock        flock'ed shared by imports and readers loading a catalog,
//!                  exclusively by gc (so gc never sees a half-imported image)
//!   names.json     name -> id, rewritten atomically (temp file, fsync, rename)
//!   images/<hex>/  image.json + index; only complete images ever appear here
//!   packs/         chunk packs and their catalogs (see `pack`)
//!   tmp/<unique>   imports in progress (directories and packs) and images
//!                  being deleted, each flock'ed by its owner; unlocked
//!                  leftovers are removed by open
//! ```

use pvisor_fstree::replace::{replace_file, Durability};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::reference::is_hex;
use crate::ImageConfig;

const NAMES_FILE: &str = "names.json";
const IMAGE_META: &str = "image.json";
pub(crate) const INDEX_FILE: &str = "index";

/// What `images/<hex>/image.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredImage {
    pub id: String,
    pub config: ImageConfig,
    pub size_bytes: u64,
    pub imported_at: String,
    /// Bytes of the compressed index.
    #[serde(default)]
    pub index_bytes: u64,
    #[serde(default)]
    pub manifest_digests: Vec<String>,
    #[serde(default)]
    pub layers: Vec<String>,
}

#[derive(Default, Serialize, Deserialize)]
struct NameTable {
    version: u32,
    names: BTreeMap<String, String>,
}

/// The store's directories.
pub(crate) struct Store {
    pub(crate) root: PathBuf,
    pub(crate) images: PathBuf,
    pub(crate) packs: PathBuf,
    pub(crate) tmp: PathBuf,
}

/// A directory under `tmp/` owned (flock'ed) by this process; removed on
/// drop unless it was moved into place.
pub(crate) struct TmpDir {
    path: PathBuf,
    _lock: Flock<File>,
    keep: bool,
}

impl TmpDir {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        if !self.keep {
            if let Err(e) = fs::remove_dir_all(&self.path) {
                tracing::warn!(path = %self.path.display(), "cannot remove temporary image directory: {e}");
            }
        }
    }
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn fsync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|d| d.sync_all()).map_err(|e| Error::io(path, e))
}

fn open_dir_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(path)
}

/// Writes `bytes` to `path` atomically and durably (temp file, fsync, rename, fsync dir).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_file(path, bytes, Durability::Synced).map_err(|e| Error::io(path, e))
}

pub(crate) fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{prefix}-{}-{}-{nanos:x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The hex part of an id (`sha256:<hex>`), validated so it is safe as a file name.
pub(crate) fn id_hex(id: &str) -> Result<&str> {
    match id.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && is_hex(hex) => Ok(hex),
        _ => Err(Error::NotFound(id.to_owned())),
    }
}

impl Store {
    /// Creates the layout if needed and removes leftovers of killed imports.
    pub(crate) fn open(root: &Path) -> Result<Store> {
        fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        let store = Store {
            root: root.to_path_buf(),
            images: root.join("images"),
            packs: root.join("packs"),
            tmp: root.join("tmp"),
        };
        mkdir(&store.images, 0o755)?;
        mkdir(&store.packs, 0o755)?;
        mkdir(&store.tmp, 0o700)?;
        store.clean_tmp()?;
        Ok(store)
    }

    /// Removes every `tmp/` entry nobody holds a lock on.
    fn clean_tmp(&self) -> Result<()> {
        let _lock = self.lock()?;
        let entries = fs::read_dir(&self.tmp).map_err(|e| Error::io(&self.tmp, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.tmp, e))?;
            let path = entry.path();
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            let opened = if is_dir {
                open_dir_nofollow(&path)
            } else {
                OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path)
            };
            let dir = match opened {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
                Ok(_held) => {
                    tracing::info!(path = %path.display(), "removing leftover of an interrupted import");
                    if is_dir {
                        fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
                    } else {
                        fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                    }
                }
                Err((_, Errno::EWOULDBLOCK)) => {} // in use by a live import
                Err((_, e)) => return Err(Error::io(&path, e)),
            }
        }
        // A name-table rewrite killed before its rename leaves its temp file
        // in the root; only a holder of the store lock (held here) writes it.
        let names_tmp = self.root.join(format!("{NAMES_FILE}.tmp"));
        match fs::remove_file(&names_tmp) {
            Ok(()) => tracing::info!(path = %names_tmp.display(), "removed an interrupted name-table write"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&names_tmp, e)),
        }
        Ok(())
    }

    /// Takes the store-wide lock (blocks until available).
    pub(crate) fn lock(&self) -> Result<Flock<File>> {
        self.lock_file("lock", FlockArg::LockExclusive)
    }

    /// Takes the gc lock: shared for imports and catalog readers,
    /// exclusive for gc.
    pub(crate) fn gc_lock(&self, exclusive: bool) -> Result<Flock<File>> {
        self.lock_file("gc.lock", if exclusive { FlockArg::LockExclusive } else { FlockArg::LockShared })
    }

    /// Locks `root/<name>` (created if missing).
    fn lock_file(&self, name: &str, how: FlockArg) -> Result<Flock<File>> {
        let path = self.root.join(name);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Flock::lock(f, how).map_err(|(_, e)| Error::io(&path, e))
    }

    /// Creates and locks a fresh directory under `tmp/`.
    ///
    /// This takes the store lock briefly (so `clean_tmp` never sees the
    /// directory before it is locked); pass the caller's guard in `held` if
    /// it already holds it (flock is per open file, so taking it again
    /// would deadlock).
    pub(crate) fn tmp_dir(&self, prefix: &str, held: Option<&Flock<File>>) -> Result<TmpDir> {
        let _lock = match held {
            Some(_) => None,
            None => Some(self.lock()?),
        };
        loop {
            let path = self.tmp.join(unique_name(prefix));
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&path, e)),
            }
            let dir = open_dir_nofollow(&path).map_err(|e| Error::io(&path, e))?;
            let lock = Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| Error::io(&path, e))?;
            return Ok(TmpDir { path, _lock: lock, keep: false });
        }
    }

    pub(crate) fn image_dir(&self, id: &str) -> Result<PathBuf> {
        Ok(self.images.join(id_hex(id)?))
    }

    /// Reads an image's metadata; None if the image is not in the store.
    pub(crate) fn read_image(&self, id: &str) -> Result<Option<StoredImage>> {
        let Ok(dir) = self.image_dir(id) else {
            return Ok(None);
        };
        let path = dir.join(IMAGE_META);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::Corrupt { path, reason: e.to_string() })
    }

    /// Writes `image.json` into an image directory (staged or published).
    pub(crate) fn write_image(dir: &Path, meta: &StoredImage) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(meta).map_err(|e| Error::io(dir, io::Error::other(e)))?;
        write_atomic(&dir.join(IMAGE_META), &bytes)
    }

    /// Ids of all complete images.
    pub(crate) fn ids(&self) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        let entries = fs::read_dir(&self.images).map_err(|e| Error::io(&self.images, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.images, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.len() == 64 && is_hex(name) && entry.path().join(IMAGE_META).exists() {
                ids.push(format!("sha256:{name}"));
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The name table (empty if none yet).
    pub(crate) fn names(&self) -> Result<BTreeMap<String, String>> {
        let path = self.root.join(NAMES_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let table: NameTable =
            serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt { path, reason: e.to_string() })?;
        Ok(table.names)
    }

    /// Replaces the name table atomically. The caller holds [`Store::lock`].
    pub(crate) fn save_names(&self, names: &BTreeMap<String, String>) -> Result<()> {
        let table = NameTable { version: 1, names: names.clone() };
        let bytes = serde_json::to_vec_pretty(&table).map_err(|e| Error::io(&self.root, io::Error::other(e)))?;
        write_atomic(&self.root.join(NAMES_FILE), &bytes)
    }

    /// Moves a finished staging directory into place as image `id`.
    /// The caller holds [`Store::lock`] and checked that `id` is absent.
    pub(crate) fn publish(&self, mut staged: TmpDir, id: &str) -> Result<()> {
        let dest = self.image_dir(id)?;
        fs::set_permissions(staged.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| Error::io(staged.path(), e))?;
        fs::rename(staged.path(), &dest).map_err(|e| Error::io(&dest, e))?;
        staged.keep = true;
        fsync_dir(&self.images)
    }

    /// Moves image `id` out of `images/` into a locked `tmp/` directory,
    /// which deletes it when dropped. The caller holds [`Store::lock`].
    pub(crate) fn retire(&self, id: &str) -> Result<Option<TmpDir>> {
        let src = self.image_dir(id)?;
        let dir = match open_dir_nofollow(&src) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&src, e)),
        };
        let lock = Flock::lock(dir, FlockArg::LockExclusive).map_err(|(_, e)| Error::io(&src, e))?;
        let dest = self.tmp.join(unique_name("rm"));
        fs::rename(&src, &dest).map_err(|e| Error::io(&src, e))?;
        fsync_dir(&self.images)?;
        Ok(Some(TmpDir { path: dest, _lock: lock, keep: false }))
    }
}

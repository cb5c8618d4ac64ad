//! pvisor image store.
//!
//! Imports container images from `docker save` archives or OCI image layout
//! tarballs into one unpacked, read-only tree per image (usable as an overlay
//! lower directory), and keeps a table of names (`busybox:latest`) → image ids
//! (`sha256:<hex>` of the image config).
//!
//! ```no_run
//! # fn main() -> Result<(), pvisor_images::Error> {
//! let store = pvisor_images::ImageStore::open(std::path::Path::new("/var/lib/pvisor/images"))?;
//! let imported = store.import(std::path::Path::new("busybox.tar"))?;
//! let image = store.resolve("docker.io/library/busybox")?;
//! let lower = store.rootfs(&image);
//! # let _ = (imported, lower); Ok(()) }
//! ```
//!
//! Storage is an implementation detail: callers only see [`ImageRecord`]s and
//! the path returned by [`ImageStore::rootfs`].

mod archive;
mod config;
mod docker;
mod error;
mod fsops;
mod layer;
mod oci;
mod reference;
mod safepath;
mod store;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
pub use reference::normalize_name;

use archive::{Archive, Compression, Format, HashingReader, ImagePlan, LayerCheck, LayerPlan};
use reference::Reference;
use store::{Store, StoredImage, TmpDir};

/// Uid/gid shift used by [`ImageStore::open`] when running as root.
pub const DEFAULT_ID_SHIFT: u32 = 100_000;
/// Size of the id range an image may use (ids 0..65536), which the sandbox's
/// user namespace maps onto `shift..shift+65536`.
pub const ID_RANGE: u32 = layer::ID_RANGE as u32;

/// Trailing bytes allowed after a layer's end-of-archive marker.
const MAX_TRAILING: u64 = 16 << 20;
const READ_BUF: usize = 1 << 20;

/// Runtime configuration of an image as recorded in its config blob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `K=V` strings.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// An image in the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `sha256:<hex>` of the image config blob.
    pub id: String,
    /// Normalized names (`busybox:latest`), sorted; may be empty.
    pub names: Vec<String>,
    pub config: ImageConfig,
    /// Apparent size of the unpacked files.
    pub size_bytes: u64,
    /// RFC 3339 time of the first import.
    pub imported_at: String,
    /// Uid/gid shift the tree was unpacked with (None: owned by the importer).
    #[serde(default)]
    pub id_shift: Option<u32>,
}

/// Store settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Add this to every uid/gid in the image when unpacking (root only;
    /// ids must be below [`ID_RANGE`]). None: files belong to the importer.
    pub id_shift: Option<u32>,
}

impl Options {
    /// [`DEFAULT_ID_SHIFT`] when running as root, None otherwise.
    pub fn detect() -> Options {
        Options { id_shift: nix::unistd::geteuid().is_root().then_some(DEFAULT_ID_SHIFT) }
    }
}

/// The image store rooted at one directory.
pub struct ImageStore {
    store: Store,
    id_shift: Option<u32>,
    privileged: bool,
    /// Serializes name-table changes within this process (the flock on
    /// `root/lock` does so across processes).
    mutex: Mutex<()>,
}

/// A built (or reused) image waiting to be published.
struct Prepared {
    plan: ImagePlan,
    staged: Option<TmpDir>,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `root` with [`Options::detect`].
    pub fn open(root: &Path) -> Result<Self> {
        Self::open_with(root, Options::detect())
    }

    /// Opens (creating if needed) the store at `root`. Leftovers of
    /// interrupted imports are removed.
    pub fn open_with(root: &Path, options: Options) -> Result<Self> {
        if let Some(s) = options.id_shift {
            if s.checked_add(ID_RANGE).is_none() {
                return Err(Error::Options(format!("id_shift {s} leaves no room for {ID_RANGE} ids")));
            }
        }
        Ok(ImageStore {
            store: Store::open(root)?,
            id_shift: options.id_shift,
            privileged: nix::unistd::geteuid().is_root(),
            mutex: Mutex::new(()),
        })
    }

    /// The uid/gid shift applied to newly unpacked images.
    pub fn id_shift(&self) -> Option<u32> {
        self.id_shift
    }

    /// Imports every image of a docker-archive or OCI-layout tarball.
    ///
    /// All images are unpacked and verified before any is published, so on
    /// error the store is unchanged. Images already present (same id, same
    /// id shift) are reused and only gain names.
    pub fn import(&self, archive: &Path) -> Result<Vec<ImageRecord>> {
        let ar = Archive::open(archive)?;
        let plans = match ar.format()? {
            Format::Docker => docker::plan(&ar)?,
            Format::Oci => oci::plan(&ar)?,
        };
        let plans = merge_plans(plans);
        let order: Vec<String> = plans.iter().map(|p| p.id.clone()).collect();

        let mut prepared = Vec::with_capacity(plans.len());
        for plan in plans {
            let staged = match self.store.read_image(&plan.id)? {
                Some(meta) if meta.id_shift == self.id_shift => None,
                _ => Some(self.build(&ar, &plan, None)?),
            };
            prepared.push(Prepared { plan, staged });
        }

        let _guard = self.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let lock = self.store.lock()?;
        let mut names = self.store.names()?;
        let mut retired = Vec::new();
        for p in prepared {
            retired.extend(self.publish(&ar, p.plan.clone(), p.staged, &lock)?);
            for name in &p.plan.names {
                names.insert(name.clone(), p.plan.id.clone());
            }
        }
        self.store.save_names(&names)?;
        drop(lock);
        drop(retired); // deletes replaced trees outside the lock

        order.iter().map(|id| self.record(id, &names)).collect()
    }

    /// Finds an image by name, id, id prefix (≥ 12 hex digits) or digest reference.
    pub fn resolve(&self, reference: &str) -> Result<ImageRecord> {
        let names = self.store.names()?;
        let id = self.find_id(reference, &names)?;
        self.record(&id, &names)
    }

    /// All images, sorted by id.
    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        let names = self.store.names()?;
        let mut out = Vec::new();
        for id in self.store.ids()? {
            match self.record(&id, &names) {
                Ok(r) => out.push(r),
                Err(Error::NotFound(_)) => {} // removed meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Removes a name; the image goes when no name is left. Given an id (or
    /// id prefix or digest reference), removes the image and all its names.
    pub fn remove(&self, reference: &str) -> Result<()> {
        let _guard = self.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let lock = self.store.lock()?;
        let mut names = self.store.names()?;
        let by_name = match reference::parse(reference)? {
            Reference::Name(n) => Some(n),
            Reference::Prefix { name: Some(n), .. } if names.contains_key(&n) => Some(n),
            _ => None,
        };
        let id = match by_name {
            Some(name) => {
                let id = names.remove(&name).ok_or_else(|| Error::NotFound(reference.to_owned()))?;
                if names.values().any(|v| *v == id) {
                    self.store.save_names(&names)?;
                    return Ok(());
                }
                id
            }
            None => {
                let id = self.find_id(reference, &names)?;
                names.retain(|_, v| *v != id);
                id
            }
        };
        self.store.save_names(&names)?;
        let doomed = self.store.retire(&id)?;
        drop(lock);
        drop(doomed); // the tree is deleted outside the lock
        Ok(())
    }

    /// The unpacked tree of an image (use read-only, e.g. as overlay lower dir).
    pub fn rootfs(&self, image: &ImageRecord) -> PathBuf {
        self.store.rootfs(&image.id)
    }

    /// Unpacks one image into a staging directory.
    /// `held`: the store lock, when the caller holds it.
    fn build(&self, ar: &Archive, plan: &ImagePlan, held: Option<&Flock<File>>) -> Result<TmpDir> {
        let staged = self.store.tmp_dir("import", held)?;
        let rootfs = staged.rootfs();
        std::fs::create_dir(&rootfs).map_err(|e| Error::io(&rootfs, e))?;
        let mut tree = layer::TreeBuilder::new(&rootfs, self.id_shift, self.privileged)?;
        for (i, layer) in plan.layers.iter().enumerate() {
            apply_layer(ar, &mut tree, layer, i + 1)?;
        }
        let size_bytes = tree.finish()?;
        let meta = StoredImage {
            id: plan.id.clone(),
            config: plan.config.clone(),
            size_bytes,
            imported_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            id_shift: self.id_shift,
            manifest_digests: plan.manifest_digests.clone(),
            layers: plan.layers.iter().map(|l| l.member.clone()).collect(),
        };
        Store::write_image(staged.path(), &meta)?;
        staged.sync()?;
        tracing::info!(id = %plan.id, size_bytes, layers = plan.layers.len(), "unpacked image");
        Ok(staged)
    }

    /// Puts a prepared image in place (caller holds the store lock).
    /// Returns a replaced tree to delete once the lock is released.
    fn publish(
        &self,
        ar: &Archive,
        plan: ImagePlan,
        staged: Option<TmpDir>,
        held: &Flock<File>,
    ) -> Result<Option<TmpDir>> {
        let existing = self.store.read_image(&plan.id)?;
        match (existing, staged) {
            (Some(meta), Some(staged)) if meta.id_shift != self.id_shift => {
                // Same image unpacked with another id shift: swap the tree.
                tracing::info!(id = %plan.id, "replacing image tree unpacked with a different id shift");
                let old = self.store.retire(&plan.id)?;
                self.store.publish(staged, &plan.id)?;
                Ok(old)
            }
            (Some(mut meta), staged) => {
                // Already there (maybe another importer won the race): reuse it.
                drop(staged);
                let before = meta.manifest_digests.len();
                for d in &plan.manifest_digests {
                    if !meta.manifest_digests.contains(d) {
                        meta.manifest_digests.push(d.clone());
                    }
                }
                if meta.manifest_digests.len() != before {
                    Store::write_image(&self.store.image_dir(&plan.id)?, &meta)?;
                }
                Ok(None)
            }
            (None, Some(staged)) => {
                self.store.publish(staged, &plan.id)?;
                Ok(None)
            }
            (None, None) => {
                // Removed since we looked: unpack again (under the lock; rare).
                let staged = self.build(ar, &plan, Some(held))?;
                self.store.publish(staged, &plan.id)?;
                Ok(None)
            }
        }
    }

    fn record(&self, id: &str, names: &BTreeMap<String, String>) -> Result<ImageRecord> {
        let meta = self.store.read_image(id)?.ok_or_else(|| Error::NotFound(id.to_owned()))?;
        Ok(ImageRecord {
            names: names.iter().filter(|(_, v)| **v == meta.id).map(|(k, _)| k.clone()).collect(),
            id: meta.id,
            config: meta.config,
            size_bytes: meta.size_bytes,
            imported_at: meta.imported_at,
            id_shift: meta.id_shift,
        })
    }

    fn find_id(&self, reference: &str, names: &BTreeMap<String, String>) -> Result<String> {
        let not_found = || Error::NotFound(reference.to_owned());
        match reference::parse(reference)? {
            Reference::Name(n) => names.get(&n).cloned().ok_or_else(not_found),
            Reference::Id(id) => {
                if self.store.read_image(&id)?.is_some() {
                    return Ok(id);
                }
                // A manifest digest (`name@sha256:...` as pulled) also identifies an image.
                for candidate in self.store.ids()? {
                    if let Some(meta) = self.store.read_image(&candidate)? {
                        if meta.manifest_digests.contains(&id) {
                            return Ok(candidate);
                        }
                    }
                }
                Err(not_found())
            }
            Reference::Prefix { name, prefix } => {
                if let Some(id) = name.and_then(|n| names.get(&n).cloned()) {
                    return Ok(id);
                }
                let want = format!("sha256:{prefix}");
                let matches: Vec<String> = self.store.ids()?.into_iter().filter(|id| id.starts_with(&want)).collect();
                match matches.len() {
                    0 => Err(not_found()),
                    1 => Ok(matches.into_iter().next().unwrap_or_default()),
                    _ => Err(Error::Ambiguous { reference: reference.to_owned(), candidates: matches }),
                }
            }
        }
    }
}

/// Keeps one plan per image id, with the union of names and manifest digests.
fn merge_plans(plans: Vec<ImagePlan>) -> Vec<ImagePlan> {
    let mut out: Vec<ImagePlan> = Vec::new();
    for plan in plans {
        match out.iter_mut().find(|p| p.id == plan.id) {
            Some(p) => {
                for n in plan.names {
                    if !p.names.contains(&n) {
                        p.names.push(n);
                    }
                }
                for d in plan.manifest_digests {
                    if !p.manifest_digests.contains(&d) {
                        p.manifest_digests.push(d);
                    }
                }
            }
            None => out.push(plan),
        }
    }
    out
}

/// Streams one layer blob into the tree and verifies its digest.
fn apply_layer(ar: &Archive, tree: &mut layer::TreeBuilder, layer: &LayerPlan, index: usize) -> Result<()> {
    let member = ar.member(&layer.member)?;
    let label = format!("{index} ({})", layer.member);
    let io_err = |e: io::Error| Error::bad(Some(&layer.member), format!("reading layer: {e}"));
    let (hash_raw, hash_plain) = match &layer.check {
        LayerCheck::Blob { size, .. } => {
            if member.size != *size {
                return Err(Error::bad(
                    Some(&layer.member),
                    format!("blob is {} bytes but its descriptor says {size}", member.size),
                ));
            }
            (true, false)
        }
        LayerCheck::DiffId(_) => (false, true),
    };
    let mut raw = HashingReader::new(ar.reader(member), hash_raw);
    let plain_digest = {
        let mut buffered = BufReader::with_capacity(READ_BUF, &mut raw);
        let compression = Compression::detect(&mut buffered).map_err(io_err)?;
        let plain_size = (compression == Compression::Plain).then_some(member.size);
        let decoder = compression.decoder(buffered).map_err(io_err)?;
        let mut plain = HashingReader::new(decoder, hash_plain);
        tree.apply_layer(&mut plain, &label, plain_size)?;
        // Whatever follows the end-of-archive marker (padding) is part of the blob.
        let start = plain.count();
        io::copy(&mut (&mut plain).take(MAX_TRAILING + 1), &mut io::sink()).map_err(io_err)?;
        if plain.count() - start > MAX_TRAILING {
            return Err(Error::bad(Some(&layer.member), "unexpected data after the end of the layer tar"));
        }
        plain.digest()
    };
    io::copy(&mut raw, &mut io::sink()).map_err(io_err)?;
    let (expected, actual) = match (&layer.check, plain_digest) {
        (LayerCheck::Blob { digest, .. }, _) => (digest.clone(), raw.digest()),
        (LayerCheck::DiffId(diff_id), actual) => (diff_id.clone(), actual),
    };
    let actual = actual.unwrap_or_default();
    if actual != expected {
        return Err(Error::DigestMismatch { blob: layer.member.clone(), expected, actual });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_detect_matches_euid() {
        let o = Options::detect();
        assert_eq!(o.id_shift.is_some(), nix::unistd::geteuid().is_root());
        assert_eq!(Options::default().id_shift, None);
    }

    #[test]
    fn absurd_shift_refused() {
        let tmp = std::env::temp_dir().join(format!("pvisor-images-shift-{}", std::process::id()));
        let r = ImageStore::open_with(&tmp, Options { id_shift: Some(u32::MAX - 10) });
        assert!(matches!(r, Err(Error::Options(_))));
    }

    fn tar_of(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// The image vanished between the reuse check and publishing: it is
    /// unpacked again while the store lock is held (no self-deadlock).
    #[test]
    fn publish_rebuilds_vanished_image_under_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let layer = tar_of(&[("hello", b"world".to_vec())]);
        let diff_id = archive::sha256_digest(&layer);
        let config = serde_json::to_vec(&serde_json::json!({"rootfs": {"diff_ids": [diff_id]}})).unwrap();
        let manifest = br#"[{"Config":"c.json","RepoTags":["v:1"],"Layers":["l.tar"]}]"#.to_vec();
        let path = tmp.path().join("a.tar");
        std::fs::write(&path, tar_of(&[("manifest.json", manifest), ("c.json", config), ("l.tar", layer)])).unwrap();

        let store = ImageStore::open_with(&tmp.path().join("store"), Options::default()).unwrap();
        let ar = Archive::open(&path).unwrap();
        let plan = docker::plan(&ar).unwrap().remove(0);
        let lock = store.store.lock().unwrap();
        assert!(store.publish(&ar, plan.clone(), None, &lock).unwrap().is_none());
        drop(lock);
        let rec = store.resolve(&plan.id).unwrap();
        assert_eq!(std::fs::read(store.rootfs(&rec).join("hello")).unwrap(), b"world");
    }
}

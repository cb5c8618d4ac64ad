//! Deriving an image from one already in the pool plus one more layer: how
//! a sandbox snapshot becomes a pool image (its image, then its writes).
//!
//! The base tree is seeded from the base index, so none of its content is
//! read again; the layer (an uncompressed tar with OCI whiteouts) is applied
//! with the same rules as any imported layer, its content chunked and
//! deduplicated against the whole pool. Publishing follows import: packs,
//! then the image directory, then the name, all under the gc lock held
//! shared, so a gc meanwhile cannot take the new chunks for garbage.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::PoisonError;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::chunker::Chunker;
use super::index::Index;
use super::pack::Catalog;
use super::store::{Store, StoredImage, INDEX_FILE};
use super::Pool;
use crate::archive::HashingReader;
use crate::error::{Error, Result};
use crate::tree::TreeBuilder;
use crate::{ImageConfig, ImageRecord};

/// What a derived image is made of.
pub struct DerivedImage<'a> {
    /// Pool id of the base image.
    pub base: &'a str,
    /// An uncompressed layer tar (OCI whiteouts) applied over the base.
    pub layer: &'a Path,
    /// The new image's configuration.
    pub config: ImageConfig,
    /// The name the new image gets (e.g. `pvisor-snapshot/<id>:latest`).
    pub name: &'a str,
    /// Mixed into the image id, so that equal content under two labels
    /// (two snapshots) still makes two images that are removed separately.
    pub label: &'a str,
}

impl Pool {
    /// Publishes `base` + `layer` as a new image named `name`.
    pub fn import_layer(&self, d: &DerivedImage<'_>) -> Result<ImageRecord> {
        let started = Instant::now();
        let gc_guard = self.store.gc_lock(false)?;
        let base = self.index(d.base)?;
        let staged = self.store.tmp_dir("derive", None)?;
        let catalog = Catalog::load(&self.store.packs)?;
        let known = self.known_files()?;
        let mut chunker =
            Chunker::new(&catalog, self.store.tmp.clone(), self.store.packs.clone(), known, self.options.level)
                .map_err(|e| Error::io(&self.store.tmp, e))?;
        let mut tree = TreeBuilder::from_index(&base, &mut |c, o, l| chunker.reuse_extent(c, o, l));
        let file = File::open(d.layer).map_err(|e| Error::io(d.layer, e))?;
        let size = file.metadata().map_err(|e| Error::io(d.layer, e))?.len();
        let mut hashed = HashingReader::new(BufReader::with_capacity(1 << 20, file), true);
        tree.apply_layer(&mut hashed, d.label, Some(size), &mut chunker)?;
        let layer_digest = hashed.digest().unwrap_or_default();
        let inodes = tree.finish(&mut chunker).map_err(|e| Error::io(&self.store.packs, e))?;
        let (chunks, cstats) = chunker.finish().map_err(|e| Error::io(&self.store.packs, e))?;
        let mut index = Index { inodes, chunks };
        index.compact_chunks();
        index.check().map_err(|reason| Error::Corrupt { path: staged.path().to_path_buf(), reason })?;
        let blob = config_blob(&d.config, d.base, &layer_digest, d.label);
        let id = format!("sha256:{}", hex::encode(Sha256::digest(&blob)));
        let encoded = index.encode()?;
        super::write_atomic(&staged.path().join(INDEX_FILE), &encoded)?;
        let meta = StoredImage {
            id: id.clone(),
            config: d.config.clone(),
            size_bytes: index.logical_size(),
            imported_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            index_bytes: encoded.len() as u64,
            manifest_digests: Vec::new(),
            layers: vec![d.base.to_owned(), layer_digest],
        };
        Store::write_image(staged.path(), &meta)?;

        let _guard = self.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let lock = self.store.lock()?;
        if self.store.read_image(&id)?.is_none() {
            self.store.publish(staged, &id)?;
        }
        let mut names = self.store.names()?;
        let name = crate::reference::normalize_name(d.name)?;
        names.insert(name, id.clone());
        self.store.save_names(&names)?;
        drop(lock);
        drop(gc_guard);
        tracing::info!(%id, base = d.base, new_bytes = cstats.new_bytes, seconds = started.elapsed().as_secs_f64(), "derived image");
        self.record(&id, &names)
    }
}

/// An OCI-style config blob naming what the image is made of; its digest is
/// the image id.
fn config_blob(config: &ImageConfig, base: &str, layer: &str, label: &str) -> Vec<u8> {
    let v = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": config.entrypoint,
            "Cmd": config.cmd,
            "Env": config.env,
            "WorkingDir": config.working_dir,
            "User": config.user,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer]},
        "pvisor.io/base": base,
        "pvisor.io/label": label,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

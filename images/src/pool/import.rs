//! Importing image archives into the pool.
//!
//! Each layer is streamed once: decompressed, its digest checked, its
//! entries applied to an in-memory tree while file content is cut into
//! chunks and written to a new pack. The image appears only when its index
//! is published (rename into `images/`), after the packs it needs: a killed
//! import leaves either the whole image or no image, and the packs it
//! already published are reused by the next import.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::PoisonError;
use std::time::Instant;

use nix::fcntl::Flock;
use serde::Serialize;

use super::chunker::{Chunker, KnownFile, SMALL};
use super::index::{Data, Index};
use super::pack::Catalog;
use super::store::{Store, StoredImage, TmpDir, INDEX_FILE};
use super::Pool;
use crate::archive::{Archive, Compression, Format, HashingReader, ImagePlan, LayerCheck, LayerPlan};
use crate::error::{Error, Result};
use crate::tree::TreeBuilder;
use crate::{docker, oci, ImageRecord};

/// Trailing bytes allowed after a layer's end-of-archive marker.
const MAX_TRAILING: u64 = 16 << 20;
const READ_BUF: usize = 1 << 20;
/// Progress is reported every this many bytes of layer data.
const PROGRESS_STEP: u64 = 8 << 20;

/// What an import is doing, for progress displays.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ImportEvent {
    /// Starting an image (`layers` blobs of `bytes` in total).
    Image { id: String, names: Vec<String>, layers: usize, bytes: u64 },
    /// Bytes of layer `layer` (1-based) read so far.
    Layer { id: String, layer: usize, layers: usize, done: u64, total: u64 },
    /// The image is in the pool (`reused`: it already was).
    Done { id: String, names: Vec<String>, reused: bool, stats: ImportStats },
}

/// What importing one image cost and added.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ImportStats {
    /// Uncompressed layer tar bytes read.
    pub layer_bytes: u64,
    /// File content in the layers (every copy counted).
    pub file_bytes: u64,
    /// Chunks new to the pool, their uncompressed and stored bytes.
    pub new_chunks: u64,
    pub new_bytes: u64,
    pub new_compressed: u64,
    /// Chunk bytes written for content a later layer replaced (gc frees them).
    pub replaced_bytes: u64,
    pub seconds: f64,
}

type Progress<'a> = &'a mut dyn FnMut(ImportEvent);

impl Pool {
    /// Imports every image of a docker-archive or OCI-layout tarball.
    pub fn import(&self, archive: &Path) -> Result<Vec<ImageRecord>> {
        self.import_with(archive, &mut |_| {})
    }

    /// [`Pool::import`], reporting progress.
    ///
    /// Images already present (same id) are reused and only gain names. On
    /// error, no image or name of this archive is published (chunks already
    /// written stay for the next attempt, or for gc).
    pub fn import_with(&self, archive: &Path, progress: Progress<'_>) -> Result<Vec<ImageRecord>> {
        let ar = Archive::open(archive)?;
        let plans = match ar.format()? {
            Format::Docker => docker::plan(&ar)?,
            Format::Oci => oci::plan(&ar)?,
        };
        let plans = merge_plans(plans);
        let order: Vec<String> = plans.iter().map(|p| p.id.clone()).collect();

        // Held (shared) until the images are published: their chunks are
        // referenced by no published index before that, and a gc meanwhile
        // would take them for garbage.
        let gc_guard = self.store.gc_lock(false)?;
        let mut prepared = Vec::with_capacity(plans.len());
        let mut garbage = false;
        // Small files of the images built so far, shared with the next ones
        // (images of one archive often share layers).
        let mut built = HashMap::new();
        for plan in plans {
            let staged = match self.store.read_image(&plan.id)? {
                Some(_) => {
                    progress(ImportEvent::Done {
                        id: plan.id.clone(),
                        names: plan.names.clone(),
                        reused: true,
                        stats: ImportStats::default(),
                    });
                    None
                }
                None => {
                    let (staged, stats) = self.build(&ar, &plan, None, &mut built, progress)?;
                    garbage |= stats.replaced_bytes > 0;
                    Some(staged)
                }
            };
            prepared.push((plan, staged));
        }

        let _guard = self.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let lock = self.store.lock()?;
        let mut names = self.store.names()?;
        for (plan, staged) in prepared {
            self.publish(&ar, &plan, staged, &lock)?;
            for name in &plan.names {
                names.insert(name.clone(), plan.id.clone());
            }
        }
        self.store.save_names(&names)?;
        drop(lock);
        drop(gc_guard);
        if garbage {
            // Content that later layers replaced was written before that was
            // known; nothing references it now.
            self.gc()?;
        }
        order.iter().map(|id| self.record(id, &names)).collect()
    }

    /// Files of every image in the pool that new images can share by content.
    pub(super) fn known_files(&self) -> Result<HashMap<[u8; 32], KnownFile>> {
        let mut known = HashMap::new();
        for id in self.store.ids()? {
            let index = match self.index(&id) {
                Ok(i) => i,
                Err(Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            add_known(&mut known, &index);
        }
        Ok(known)
    }

    /// Builds one image's index (writing its new chunks) into a staging dir.
    /// `held`: the store lock, when the caller holds it. `built`: small
    /// files of images built (not yet published) by this import, to reuse;
    /// this image's are added.
    fn build(
        &self,
        ar: &Archive,
        plan: &ImagePlan,
        held: Option<&Flock<File>>,
        built: &mut HashMap<[u8; 32], KnownFile>,
        progress: Progress<'_>,
    ) -> Result<(TmpDir, ImportStats)> {
        let started = Instant::now();
        // Shared: gc waits until this import is published (or gone).
        let _gc = self.store.gc_lock(false)?;
        let staged = self.store.tmp_dir("import", held)?;
        let catalog = Catalog::load(&self.store.packs)?;
        let mut known = self.known_files()?;
        for (digest, file) in built.iter() {
            known.entry(*digest).or_insert_with(|| file.clone());
        }
        let mut chunker =
            Chunker::new(&catalog, self.store.tmp.clone(), self.store.packs.clone(), known, self.options.level)
                .map_err(|e| Error::io(&self.store.tmp, e))?;
        let mut tree = TreeBuilder::new();
        let total: u64 = plan.layers.iter().filter_map(|l| ar.member(&l.member).ok()).map(|m| m.size).sum();
        progress(ImportEvent::Image {
            id: plan.id.clone(),
            names: plan.names.clone(),
            layers: plan.layers.len(),
            bytes: total,
        });
        let mut layer_bytes = 0;
        for (i, layer) in plan.layers.iter().enumerate() {
            let mut report = |done: u64, total: u64| {
                progress(ImportEvent::Layer {
                    id: plan.id.clone(),
                    layer: i + 1,
                    layers: plan.layers.len(),
                    done,
                    total,
                })
            };
            layer_bytes += apply_layer(ar, &mut tree, &mut chunker, layer, i + 1, &mut report)?;
        }
        let inodes = tree.finish(&mut chunker).map_err(|e| Error::io(&self.store.packs, e))?;
        let (chunks, cstats) = chunker.finish().map_err(|e| Error::io(&self.store.packs, e))?;
        let mut index = Index { inodes, chunks };
        let replaced = index.compact_chunks();
        index.check().map_err(|reason| Error::Corrupt { path: staged.path().to_path_buf(), reason })?;
        add_known(built, &index);
        let encoded = index.encode()?;
        super::write_atomic(&staged.path().join(INDEX_FILE), &encoded)?;
        let meta = StoredImage {
            id: plan.id.clone(),
            config: plan.config.clone(),
            size_bytes: index.logical_size(),
            imported_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            index_bytes: encoded.len() as u64,
            manifest_digests: plan.manifest_digests.clone(),
            layers: plan.layers.iter().map(|l| l.member.clone()).collect(),
        };
        Store::write_image(staged.path(), &meta)?;
        let stats = ImportStats {
            layer_bytes,
            file_bytes: cstats.logical,
            new_chunks: cstats.new_chunks,
            new_bytes: cstats.new_bytes,
            new_compressed: cstats.new_compressed,
            replaced_bytes: replaced,
            seconds: started.elapsed().as_secs_f64(),
        };
        tracing::info!(id = %plan.id, inodes = index.inodes.len(), ?stats, "indexed image");
        progress(ImportEvent::Done { id: plan.id.clone(), names: plan.names.clone(), reused: false, stats });
        Ok((staged, stats))
    }

    /// Puts a prepared image in place (caller holds the store lock).
    fn publish(&self, ar: &Archive, plan: &ImagePlan, staged: Option<TmpDir>, held: &Flock<File>) -> Result<()> {
        match (self.store.read_image(&plan.id)?, staged) {
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
                Ok(())
            }
            (None, Some(staged)) => self.store.publish(staged, &plan.id),
            (None, None) => {
                // Removed since we looked: build again (under the lock; rare).
                let (staged, _) = self.build(ar, plan, Some(held), &mut HashMap::new(), &mut |_| {})?;
                self.store.publish(staged, &plan.id)
            }
        }
    }
}

/// Adds the small files of `index` to `known` (by content).
fn add_known(known: &mut HashMap<[u8; 32], KnownFile>, index: &Index) {
    for inode in &index.inodes {
        if let Data::File { size, digest, extents } = &inode.data {
            if *size < SMALL && *size > 0 {
                known.entry(*digest).or_insert_with(|| KnownFile {
                    extents: extents.iter().map(|x| (index.chunks[x.chunk as usize], x.offset, x.len)).collect(),
                });
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

/// Counts bytes read and reports them every [`PROGRESS_STEP`].
struct Counted<'a, R> {
    inner: R,
    done: u64,
    total: u64,
    next: u64,
    report: &'a mut dyn FnMut(u64, u64),
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if self.done >= self.next || (n == 0 && self.done > 0) {
            (self.report)(self.done, self.total);
            self.next = self.done + PROGRESS_STEP;
        }
        Ok(n)
    }
}

/// Streams one layer blob into the tree and verifies its digest. Returns
/// the uncompressed bytes read.
fn apply_layer(
    ar: &Archive,
    tree: &mut TreeBuilder,
    chunker: &mut Chunker<'_>,
    layer: &LayerPlan,
    index: usize,
    report: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
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
    let counted = Counted { inner: ar.reader(member), done: 0, total: member.size, next: 0, report };
    let mut raw = HashingReader::new(counted, hash_raw);
    let (plain_digest, plain_bytes) = {
        let mut buffered = BufReader::with_capacity(READ_BUF, &mut raw);
        let compression = Compression::detect(&mut buffered).map_err(io_err)?;
        let plain_size = (compression == Compression::Plain).then_some(member.size);
        let decoder = compression.decoder(buffered).map_err(io_err)?;
        let mut plain = HashingReader::new(decoder, hash_plain);
        tree.apply_layer(&mut plain, &label, plain_size, chunker)?;
        // Whatever follows the end-of-archive marker (padding) is part of the blob.
        let start = plain.count();
        io::copy(&mut (&mut plain).take(MAX_TRAILING + 1), &mut io::sink()).map_err(io_err)?;
        if plain.count() - start > MAX_TRAILING {
            return Err(Error::bad(Some(&layer.member), "unexpected data after the end of the layer tar"));
        }
        (plain.digest(), plain.count())
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
    Ok(plain_bytes)
}

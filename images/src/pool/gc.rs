//! Garbage collection (mark and sweep over the image indexes) and disk usage.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use serde::Serialize;

use super::pack::{cat_path, pack_path, Catalog, PackWriter};
use super::Pool;
use crate::error::{Error, Result};

/// Packs smaller than this are merged by gc once there are [`MERGE_AT`] of them.
const MERGE_BELOW: u64 = 16 << 20;
const MERGE_AT: usize = 8;

/// What [`Pool::gc`] did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    /// Packs deleted because none of their chunks was referenced.
    pub packs_removed: usize,
    /// Packs rewritten without their unreferenced chunks.
    pub packs_rewritten: usize,
    /// Small packs merged into one.
    pub packs_merged: usize,
    pub chunks_removed: u64,
    pub chunks_kept: u64,
    /// Allocated bytes before and after.
    pub allocated_before: u64,
    pub allocated_after: u64,
}

/// One image's share of the pool.
#[derive(Clone, Debug, Serialize)]
pub struct ImageUsage {
    pub id: String,
    pub names: Vec<String>,
    /// Apparent size of its files.
    pub logical_bytes: u64,
    /// Its compressed index.
    pub index_bytes: u64,
    /// Distinct chunks it references, uncompressed and stored.
    pub chunk_bytes: u64,
    pub compressed_bytes: u64,
}

/// What [`Pool::du`] reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DuReport {
    /// Bytes allocated on disk for the whole pool (`st_blocks × 512`,
    /// hardlinked files once).
    pub allocated_bytes: u64,
    /// Apparent size of all images' files added up.
    pub logical_bytes: u64,
    /// Distinct referenced content, uncompressed (after deduplication).
    pub deduplicated_bytes: u64,
    /// The same, as stored (after compression).
    pub compressed_bytes: u64,
    /// Bytes of chunks no image references (freed by gc).
    pub unreferenced_bytes: u64,
    pub chunks: u64,
    pub packs: usize,
    pub images: Vec<ImageUsage>,
}

/// Allocated bytes under `path`, each inode once.
pub fn allocated(path: &Path) -> Result<u64> {
    fn walk(p: &Path, seen: &mut HashSet<(u64, u64)>) -> std::io::Result<u64> {
        let md = fs::symlink_metadata(p)?;
        let mut total = 0;
        if seen.insert((md.dev(), md.ino())) {
            total += md.blocks() * 512;
        }
        if md.is_dir() {
            for e in fs::read_dir(p)? {
                match walk(&e?.path(), seen) {
                    Ok(n) => total += n,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(total)
    }
    walk(path, &mut HashSet::new()).map_err(|e| Error::io(path, e))
}

impl Pool {
    /// Digests referenced by any image.
    fn live_chunks(&self) -> Result<HashSet<[u8; 32]>> {
        let mut live = HashSet::new();
        for id in self.store.ids()? {
            match self.index(&id) {
                Ok(index) => live.extend(index.chunks.iter().map(|c| c.digest)),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(live)
    }

    /// Deletes chunks no image references. Packs with no live chunk are
    /// deleted; packs with some are rewritten with only those (the new pack
    /// is published before the old one goes). Waits for running imports.
    /// Safe while sandboxes run: their servers hold the packs they read
    /// open, so a deleted pack stays readable to them.
    pub fn gc(&self) -> Result<GcReport> {
        let _gc = self.store.gc_lock(true)?;
        let mut report = GcReport { allocated_before: allocated(&self.store.root)?, ..GcReport::default() };
        // Leftovers: packs whose catalog never got written.
        for e in fs::read_dir(&self.store.packs).map_err(|e| Error::io(&self.store.packs, e))? {
            let e = e.map_err(|e| Error::io(&self.store.packs, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".pack") {
                if !cat_path(&self.store.packs, stem).exists() {
                    fs::remove_file(e.path()).map_err(|err| Error::io(e.path(), err))?;
                }
            } else if name.ends_with(".tmp") {
                fs::remove_file(e.path()).map_err(|err| Error::io(e.path(), err))?;
            }
        }
        let live = self.live_chunks()?;
        let catalog = Catalog::load(&self.store.packs)?;
        // A chunk is kept once, in the first pack (by name) that has it.
        let mut placed: HashSet<[u8; 32]> = HashSet::new();
        // Small packs (one per small import) are merged into one, so the
        // number of packs (files every reader holds open) stays bounded.
        let small = |p: &super::pack::Pack| p.size < MERGE_BELOW;
        let merge = catalog.packs.iter().filter(|p| small(p)).count() >= MERGE_AT;
        let mut merged: Option<PackWriter> = None;
        let mut merged_away = Vec::new();
        for pack in &catalog.packs {
            let keep: Vec<_> =
                pack.entries.iter().filter(|e| live.contains(&e.digest) && !placed.contains(&e.digest)).collect();
            for e in &keep {
                placed.insert(e.digest);
            }
            report.chunks_kept += keep.len() as u64;
            report.chunks_removed += (pack.entries.len() - keep.len()) as u64;
            let into_merged = merge && small(pack);
            if keep.len() == pack.entries.len() && !into_merged {
                continue;
            }
            let copy = |w: &mut PackWriter| -> Result<()> {
                for e in &keep {
                    let mut raw = vec![0u8; e.clen as usize];
                    pack.file
                        .read_exact_at(&mut raw, e.offset)
                        .map_err(|err| Error::io(pack_path(&self.store.packs, &pack.name), err))?;
                    w.append(e.digest, &raw, e.len)?;
                }
                Ok(())
            };
            if into_merged {
                if merged.is_none() {
                    merged = Some(PackWriter::create(&self.store.tmp)?);
                }
                if let Some(w) = merged.as_mut() {
                    copy(w)?;
                }
                // Deleted only once the merged pack is published.
                merged_away.push(pack.name.clone());
                continue;
            }
            if !keep.is_empty() {
                let mut w = PackWriter::create(&self.store.tmp)?;
                copy(&mut w)?;
                w.publish(&self.store.packs)?;
                report.packs_rewritten += 1;
            } else {
                report.packs_removed += 1;
            }
            self.delete_pack(&pack.name)?;
        }
        if let Some(w) = merged {
            if !w.is_empty() {
                w.publish(&self.store.packs)?;
            }
            report.packs_merged = merged_away.len();
            for name in merged_away {
                self.delete_pack(&name)?;
            }
        }
        report.allocated_after = allocated(&self.store.root)?;
        Ok(report)
    }

    /// Deletes a pack, catalog first (a pack without a catalog is a leftover anyway).
    fn delete_pack(&self, name: &str) -> Result<()> {
        for p in [cat_path(&self.store.packs, name), pack_path(&self.store.packs, name)] {
            fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
        Ok(())
    }

    /// Disk usage of the pool and of each image.
    pub fn du(&self) -> Result<DuReport> {
        let _gc = self.store.gc_lock(false)?;
        let catalog = Catalog::load(&self.store.packs)?;
        let mut report = DuReport {
            allocated_bytes: allocated(&self.store.root)?,
            packs: catalog.packs.len(),
            chunks: catalog.len() as u64,
            ..DuReport::default()
        };
        let mut live: HashSet<[u8; 32]> = HashSet::new();
        for rec in self.list()? {
            let index = self.index(&rec.id)?;
            let meta = self.store.read_image(&rec.id)?;
            let mut mine: HashSet<[u8; 32]> = HashSet::new();
            let (mut chunk_bytes, mut compressed) = (0, 0);
            for c in &index.chunks {
                if mine.insert(c.digest) {
                    chunk_bytes += u64::from(c.len);
                    compressed += catalog.get(&c.digest).map(|l| u64::from(l.clen)).unwrap_or(0);
                }
            }
            live.extend(mine);
            report.logical_bytes += rec.size_bytes;
            report.images.push(ImageUsage {
                id: rec.id.clone(),
                names: rec.names.clone(),
                logical_bytes: rec.size_bytes,
                index_bytes: meta.map(|m| m.index_bytes).unwrap_or(0),
                chunk_bytes,
                compressed_bytes: compressed,
            });
        }
        let mut seen = HashSet::new();
        for pack in &catalog.packs {
            for e in &pack.entries {
                if !seen.insert(e.digest) {
                    report.unreferenced_bytes += u64::from(e.clen); // a duplicate copy
                } else if live.contains(&e.digest) {
                    report.deduplicated_bytes += u64::from(e.len);
                    report.compressed_bytes += u64::from(e.clen);
                } else {
                    report.unreferenced_bytes += u64::from(e.clen);
                }
            }
        }
        Ok(report)
    }
}

//! Cutting file content into pool chunks during an import.
//!
//! Files of [`SMALL`] bytes or more are cut at fixed [`CHUNK_SIZE`]
//! boundaries from their start (file-aligned, so the same file, or the same
//! leading part of a file, always gives the same chunks) as they stream by.
//! Smaller files wait in an anonymous spool file until the image's final
//! tree is known; then those still in it are packed, in tree order, back to
//! back into shared "bundle" chunks of about `CHUNK_SIZE`, which compress far
//! better than each file alone, do not cost a block each, and never carry
//! content a later layer deleted. Every chunk is identified by the sha256 of
//! its uncompressed bytes and stored once in the whole pool; a small file
//! whose content is already in the pool (same sha256, any image) reuses the
//! extents it has there.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::index::{ChunkRef, Extent};
use super::pack::{Catalog, PackWriter, PACK_TARGET};
use super::FileContent;
use crate::tree::ContentSink;

/// Uncompressed size of a chunk.
pub const CHUNK_SIZE: usize = 128 << 10;
/// Files below this size go into bundles.
pub const SMALL: u64 = 64 << 10;

/// What an import added.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkStats {
    /// Uncompressed bytes of all file content seen (every copy counted).
    pub logical: u64,
    /// Chunks written (new to the pool) and their sizes.
    pub new_chunks: u64,
    pub new_bytes: u64,
    pub new_compressed: u64,
}

/// A file already in the pool, reusable by content.
#[derive(Clone)]
pub(crate) struct KnownFile {
    /// Extents by chunk digest (positions differ between indexes).
    pub extents: Vec<(ChunkRef, u32, u32)>,
}

pub(crate) struct Chunker<'a> {
    catalog: &'a Catalog,
    tmp: PathBuf,
    packs_dir: PathBuf,
    writer: Option<PackWriter>,
    /// The chunk table of the index being built.
    chunks: Vec<ChunkRef>,
    chunk_pos: HashMap<[u8; 32], u32>,
    /// Written by this import (not yet in `catalog`).
    written: HashSet<[u8; 32]>,
    known: HashMap<[u8; 32], KnownFile>,
    /// Small files of this import placed in bundles, by content (slots are stable).
    local: HashMap<[u8; 32], Extent>,
    /// Small files of this import waiting in the spool, by content.
    spooled: HashMap<[u8; 32], u64>,
    spool: File,
    spool_len: u64,
    bundle: Vec<u8>,
    /// The chunk-table slot the open bundle will take.
    bundle_slot: Option<u32>,
    compressor: zstd::bulk::Compressor<'static>,
    pub(crate) stats: ChunkStats,
    buf: Vec<u8>,
}

/// A temporary file with no name (nothing to clean up after a crash).
fn anonymous_file(dir: &std::path::Path) -> io::Result<File> {
    let path = dir.join(format!("{}.spool", super::unique_name()));
    let f = File::options().create_new(true).read(true).write(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

impl<'a> Chunker<'a> {
    pub(crate) fn new(
        catalog: &'a Catalog,
        tmp: PathBuf,
        packs_dir: PathBuf,
        known: HashMap<[u8; 32], KnownFile>,
        level: i32,
    ) -> io::Result<Self> {
        let tmp_for_spool = tmp.clone();
        Ok(Chunker {
            catalog,
            tmp,
            packs_dir,
            writer: None,
            chunks: Vec::new(),
            chunk_pos: HashMap::new(),
            written: HashSet::new(),
            known,
            local: HashMap::new(),
            spooled: HashMap::new(),
            spool: anonymous_file(&tmp_for_spool)?,
            spool_len: 0,
            bundle: Vec::with_capacity(CHUNK_SIZE * 2),
            bundle_slot: None,
            compressor: zstd::bulk::Compressor::new(level)?,
            stats: ChunkStats::default(),
            buf: vec![0u8; CHUNK_SIZE],
        })
    }

    /// Slot of a chunk in this index's table (added if new to the table).
    fn slot(&mut self, c: ChunkRef) -> u32 {
        if let Some(&i) = self.chunk_pos.get(&c.digest) {
            return i;
        }
        let i = self.chunks.len() as u32;
        self.chunks.push(c);
        self.chunk_pos.insert(c.digest, i);
        i
    }

    /// Stores `data` as a chunk unless the pool already has it.
    fn store(&mut self, data: &[u8]) -> io::Result<ChunkRef> {
        let c = ChunkRef { digest: sha256(data), len: data.len() as u32 };
        if self.catalog.contains(&c.digest) || self.written.contains(&c.digest) {
            return Ok(c);
        }
        let compressed = self.compressor.compress(data)?;
        if self.writer.is_none() {
            self.writer = Some(PackWriter::create(&self.tmp).map_err(io::Error::other)?);
        }
        let w = self.writer.as_mut().ok_or_else(|| io::Error::other("no pack"))?;
        w.append(c.digest, &compressed, c.len).map_err(io::Error::other)?;
        self.written.insert(c.digest);
        self.stats.new_chunks += 1;
        self.stats.new_bytes += data.len() as u64;
        self.stats.new_compressed += compressed.len() as u64;
        if w.bytes() >= PACK_TARGET {
            self.publish_pack()?;
        }
        Ok(c)
    }

    /// Publishes the open pack (if any).
    fn publish_pack(&mut self) -> io::Result<()> {
        if let Some(w) = self.writer.take() {
            if !w.is_empty() {
                w.publish(&self.packs_dir).map_err(io::Error::other)?;
            }
        }
        Ok(())
    }

    fn seal_bundle(&mut self) -> io::Result<()> {
        let Some(slot) = self.bundle_slot.take() else { return Ok(()) };
        let data = std::mem::take(&mut self.bundle);
        let c = self.store(&data)?;
        // The slot was reserved with a placeholder; a bundle identical to an
        // earlier chunk simply has two slots with the same digest.
        self.chunks[slot as usize] = c;
        self.chunk_pos.entry(c.digest).or_insert(slot);
        self.bundle = data;
        self.bundle.clear();
        Ok(())
    }

    /// An extent of a chunk the pool already holds, in this index's table.
    pub(crate) fn reuse_extent(&mut self, c: ChunkRef, offset: u32, len: u32) -> Extent {
        Extent { chunk: self.slot(c), offset, len }
    }

    fn reuse(&mut self, k: &KnownFile) -> Vec<Extent> {
        k.extents.iter().map(|&(c, offset, len)| Extent { chunk: self.slot(c), offset, len }).collect()
    }

    fn small_file(&mut self, data: Vec<u8>) -> io::Result<FileContent> {
        let digest = sha256(&data);
        let size = data.len() as u64;
        if let Some(k) = self.known.get(&digest).cloned() {
            return Ok(FileContent { size, digest, extents: self.reuse(&k), spooled: None });
        }
        if let Some(&off) = self.spooled.get(&digest) {
            return Ok(FileContent { size, digest, extents: Vec::new(), spooled: Some(off) });
        }
        let off = self.spool_len;
        self.spool.write_all(&data)?;
        self.spool_len += size;
        self.spooled.insert(digest, off);
        Ok(FileContent { size, digest, extents: Vec::new(), spooled: Some(off) })
    }

    /// Bundles a spooled small file (called in final tree order).
    fn bundle_file(&mut self, c: &FileContent, off: u64) -> io::Result<Vec<Extent>> {
        if let Some(&x) = self.local.get(&c.digest) {
            return Ok(vec![x]);
        }
        let len = c.size as usize;
        if self.bundle.len() + len > CHUNK_SIZE {
            self.seal_bundle()?;
        }
        let slot = match self.bundle_slot {
            Some(s) => s,
            None => {
                let s = self.chunks.len() as u32;
                self.chunks.push(ChunkRef { digest: [0; 32], len: 0 });
                self.bundle_slot = Some(s);
                s
            }
        };
        let extent = Extent { chunk: slot, offset: self.bundle.len() as u32, len: len as u32 };
        let start = self.bundle.len();
        self.bundle.resize(start + len, 0);
        self.spool.read_exact_at(&mut self.bundle[start..], off)?;
        self.local.insert(c.digest, extent);
        Ok(vec![extent])
    }

    /// Finishes the import's content: seals the last bundle, publishes the
    /// last pack. Returns the chunk table of the index.
    pub(crate) fn finish(mut self) -> io::Result<(Vec<ChunkRef>, ChunkStats)> {
        self.seal_bundle()?;
        self.publish_pack()?;
        Ok((self.chunks, self.stats))
    }
}

impl ContentSink for Chunker<'_> {
    fn place(&mut self, c: &FileContent) -> io::Result<Vec<Extent>> {
        match c.spooled {
            Some(off) => self.bundle_file(c, off),
            None => Ok(c.extents.clone()),
        }
    }

    fn add_file(&mut self, data: &mut dyn Read, size: u64) -> io::Result<FileContent> {
        self.stats.logical += size;
        if size < SMALL {
            let mut buf = Vec::with_capacity(size as usize);
            data.take(size).read_to_end(&mut buf)?;
            if (buf.len() as u64) < size {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated file data"));
            }
            return self.small_file(buf);
        }
        let mut hasher = Sha256::new();
        let mut extents = Vec::new();
        let mut remaining = size;
        let mut buf = std::mem::take(&mut self.buf);
        while remaining > 0 {
            let want = (remaining as usize).min(CHUNK_SIZE);
            data.read_exact(&mut buf[..want])?;
            hasher.update(&buf[..want]);
            let c = self.store(&buf[..want])?;
            extents.push(Extent { chunk: self.slot(c), offset: 0, len: want as u32 });
            remaining -= want as u64;
        }
        self.buf = buf;
        Ok(FileContent { size, digest: hasher.finalize().into(), extents, spooled: None })
    }
}

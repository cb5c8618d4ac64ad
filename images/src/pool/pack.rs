//! Chunk packs: append-only files of zstd frames, one per chunk, each with a
//! catalog file listing `(digest, offset, compressed length, length)`.
//!
//! ```text
//! packs/<name>.pack   PACK_MAGIC, then zstd frames back to back
//! packs/<name>.cat    CAT_MAGIC, then CAT_ENTRY-byte records
//! ```
//!
//! A pack is written under `tmp/`, fsync'ed, and renamed into `packs/`
//! before its catalog is: a catalog only ever describes a complete pack, and
//! a pack without a catalog is an interrupted write that [`super::gc`]
//! removes. Packs are immutable once published; gc replaces a pack by
//! writing a new one with the live chunks and only then deleting the old.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

pub(crate) const PACK_MAGIC: &[u8; 8] = b"PVPACK\x00\x01";
pub(crate) const CAT_MAGIC: &[u8; 8] = b"PVCAT\x00\x00\x01";
const CAT_ENTRY: usize = 32 + 8 + 4 + 4;
/// A pack is published once it holds this many compressed bytes, so an
/// interrupted import keeps (and the next one reuses) what it wrote.
pub(crate) const PACK_TARGET: u64 = 64 << 20;

/// Where a chunk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Position in [`Catalog::packs`].
    pub pack: u32,
    pub offset: u64,
    pub clen: u32,
    pub len: u32,
}

/// One catalog record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CatEntry {
    pub digest: [u8; 32],
    pub offset: u64,
    pub clen: u32,
    pub len: u32,
}

impl CatEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.digest);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.clen.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }
    fn decode(b: &[u8]) -> CatEntry {
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&b[..32]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        CatEntry { digest, offset: u64_at(32), clen: u32_at(40), len: u32_at(44) }
    }
}

/// A published pack, open for reading.
pub struct Pack {
    pub name: String,
    pub file: File,
    /// Bytes of the pack file.
    pub size: u64,
    pub(crate) entries: Vec<CatEntry>,
}

/// Every published chunk, by digest. Holds the pack files open, so it stays
/// valid even if gc replaces packs afterwards.
#[derive(Default)]
pub struct Catalog {
    pub packs: Vec<Pack>,
    map: HashMap<[u8; 32], Location>,
}

pub(crate) fn pack_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pack"))
}
pub(crate) fn cat_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.cat"))
}

fn read_catalog(path: &Path, pack_size: u64) -> Result<Vec<CatEntry>> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    let corrupt = |reason: &str| Error::Corrupt { path: path.to_path_buf(), reason: reason.into() };
    let body = bytes.strip_prefix(CAT_MAGIC.as_slice()).ok_or_else(|| corrupt("not a pack catalog"))?;
    if body.len() % CAT_ENTRY != 0 {
        return Err(corrupt("truncated"));
    }
    let entries: Vec<CatEntry> = body.chunks_exact(CAT_ENTRY).map(CatEntry::decode).collect();
    if entries.iter().any(|e| e.offset.checked_add(u64::from(e.clen)).is_none_or(|end| end > pack_size)) {
        return Err(corrupt("a chunk lies past the end of its pack"));
    }
    Ok(entries)
}

impl Catalog {
    /// Opens every published pack in `dir` (the caller holds the pool's gc
    /// lock shared, so no pack disappears meanwhile).
    pub fn load(dir: &Path) -> Result<Catalog> {
        let mut cat = Catalog::default();
        let mut names: Vec<String> = fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".cat")).map(str::to_owned))
            .collect();
        names.sort();
        for name in names {
            let path = pack_path(dir, &name);
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            let size = file.metadata().map_err(|e| Error::io(&path, e))?.len();
            let entries = read_catalog(&cat_path(dir, &name), size)?;
            cat.add(Pack { name, file, size, entries });
        }
        Ok(cat)
    }

    fn add(&mut self, pack: Pack) {
        let idx = self.packs.len() as u32;
        for e in &pack.entries {
            self.map.entry(e.digest).or_insert(Location { pack: idx, offset: e.offset, clen: e.clen, len: e.len });
        }
        self.packs.push(pack);
    }

    pub fn get(&self, digest: &[u8; 32]) -> Option<Location> {
        self.map.get(digest).copied()
    }

    pub fn contains(&self, digest: &[u8; 32]) -> bool {
        self.map.contains_key(digest)
    }

    /// Number of distinct chunks.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The compressed bytes of a chunk. The range then leaves the page
    /// cache: readers keep what they read decompressed (the FUSE mount's
    /// page cache), and caching it compressed as well would charge every
    /// chunk twice.
    pub fn read_raw(&self, loc: Location) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; loc.clen as usize];
        let file = &self.packs[loc.pack as usize].file;
        file.read_exact_at(&mut buf, loc.offset)?;
        let _ = nix::fcntl::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(file),
            loc.offset as i64,
            i64::from(loc.clen),
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        Ok(buf)
    }

    /// The uncompressed bytes of a chunk.
    pub fn read(&self, loc: Location) -> io::Result<Vec<u8>> {
        let raw = self.read_raw(loc)?;
        thread_local! {
            // One decompression context per thread, reused: creating one
            // costs about as much as decompressing a small chunk.
            static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
                const { std::cell::RefCell::new(None) };
        }
        let out = DCTX.with(|d| -> io::Result<Vec<u8>> {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new()?);
            }
            match d.as_mut() {
                Some(d) => d.decompress(&raw, loc.len as usize),
                None => Err(io::Error::other("no decompressor")),
            }
        })?;
        if out.len() != loc.len as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "chunk decompressed to the wrong length"));
        }
        Ok(out)
    }
}

/// A pack being written under `tmp/`, flock'ed so that a concurrent open
/// does not take it for a leftover.
pub(crate) struct PackWriter {
    name: String,
    tmp: PathBuf,
    file: Flock<File>,
    offset: u64,
    entries: Vec<CatEntry>,
}

impl PackWriter {
    pub(crate) fn create(tmp_dir: &Path) -> Result<PackWriter> {
        let name = super::unique_name();
        let tmp = tmp_dir.join(format!("{name}.pack"));
        let mut file = File::options().create_new(true).write(true).open(&tmp).map_err(|e| Error::io(&tmp, e))?;
        file.write_all(PACK_MAGIC).map_err(|e| Error::io(&tmp, e))?;
        let file = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| Error::io(&tmp, e))?;
        Ok(PackWriter { name, tmp, file, offset: PACK_MAGIC.len() as u64, entries: Vec::new() })
    }

    /// Appends one compressed chunk.
    pub(crate) fn append(&mut self, digest: [u8; 32], compressed: &[u8], len: u32) -> Result<()> {
        self.file.write_all(compressed).map_err(|e| Error::io(&self.tmp, e))?;
        self.entries.push(CatEntry { digest, offset: self.offset, clen: compressed.len() as u32, len });
        self.offset += compressed.len() as u64;
        Ok(())
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.offset
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Publishes the pack into `packs`: pack first, then its catalog, each
    /// fsync'ed.
    pub(crate) fn publish(self, packs: &Path) -> Result<()> {
        self.file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        let dest = pack_path(packs, &self.name);
        fs::rename(&self.tmp, &dest).map_err(|e| Error::io(&dest, e))?;
        let mut bytes = CAT_MAGIC.to_vec();
        for e in &self.entries {
            e.encode(&mut bytes);
        }
        super::write_atomic(&cat_path(packs, &self.name), &bytes)
    }
}

impl Drop for PackWriter {
    fn drop(&mut self) {
        // Unpublished (error or abandoned): the partial pack goes. After a
        // publish the tmp path no longer exists and this is a no-op.
        let _ = fs::remove_file(&self.tmp);
    }
}

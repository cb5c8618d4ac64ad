//! Read access to one image of the pool: its index and the content of its
//! files, decompressed chunk by chunk on demand. This is what the FUSE server
//! (ns backend) and the erofs block view (vm backend) serve from.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use super::index::{Data, Index, Ino};
use super::pack::{Catalog, Location};
use crate::error::{Error, Result};

/// Decompressed chunks kept by a view (most recently used last): enough for
/// reads that straddle chunks and for the threads of a server; the kernel's
/// page cache keeps the rest.
const CACHE_CHUNKS: usize = 16;

/// One image, ready to read. Holds its pack files open: valid for as long
/// as it lives, whatever gc does meanwhile.
pub struct ImageView {
    index: Index,
    catalog: Arc<Catalog>,
    /// Location of each of `index.chunks`.
    locations: Vec<Location>,
    cache: Mutex<VecDeque<(u32, Arc<Vec<u8>>)>>,
}

impl ImageView {
    /// `what` names the image in errors.
    pub fn new(index: Index, catalog: Arc<Catalog>, what: &str) -> Result<ImageView> {
        let locations = index
            .chunks
            .iter()
            .map(|c| {
                catalog.get(&c.digest).filter(|l| l.len == c.len).ok_or_else(|| Error::Corrupt {
                    path: what.into(),
                    reason: format!("chunk {} is missing from the pool", hex::encode(c.digest)),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ImageView { index, catalog, locations, cache: Mutex::new(VecDeque::new()) })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The uncompressed bytes of chunk `i` of the index.
    pub fn chunk(&self, i: u32) -> io::Result<Arc<Vec<u8>>> {
        {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(pos) = cache.iter().position(|(k, _)| *k == i) {
                let hit = cache.remove(pos).map(|(_, v)| v).unwrap_or_default();
                cache.push_back((i, hit.clone()));
                return Ok(hit);
            }
        }
        let loc = *self.locations.get(i as usize).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let data = Arc::new(self.catalog.read(loc)?);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHE_CHUNKS {
            cache.pop_front();
        }
        cache.push_back((i, data.clone()));
        Ok(data)
    }

    /// Reads file content at `offset` into `buf`; returns the bytes read
    /// (0 at or past the end). Not a regular file: `InvalidInput`.
    pub fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let Some(Data::File { size, extents, .. }) = self.index.inode(ino).map(|i| &i.data) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        if offset >= *size {
            return Ok(0);
        }
        let mut done = 0usize;
        let mut pos = 0u64; // file offset where the current extent starts
        for x in extents {
            let end = pos + u64::from(x.len);
            if end > offset + done as u64 && done < buf.len() {
                let within = (offset + done as u64 - pos) as usize;
                let n = (x.len as usize - within).min(buf.len() - done);
                let chunk = self.chunk(x.chunk)?;
                let start = x.offset as usize + within;
                buf[done..done + n].copy_from_slice(&chunk[start..start + n]);
                done += n;
            }
            if done == buf.len() {
                break;
            }
            pos = end;
        }
        Ok(done)
    }

    /// The whole content of the regular file at `path` (symlinks not
    /// followed). For tests and tools; servers use [`ImageView::read`].
    pub fn read_path(&self, path: &str) -> io::Result<Vec<u8>> {
        let ino = self.index.lookup_path(path).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let size = self.index.inodes[ino as usize].size();
        let mut out = vec![0u8; size as usize];
        let n = self.read(ino, 0, &mut out)?;
        out.truncate(n);
        Ok(out)
    }
}

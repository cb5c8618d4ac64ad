//! [`ErofsView`]: an image of the pool as a read-only erofs block device.

use std::fmt;
use std::io;
use std::sync::Arc;

use super::build;
use super::error::Result;
use super::format::{DataLayout, BLOCK_SIZE};
use super::layout;
use crate::pool::index::{Data, Ino};
use crate::pool::view::ImageView;

/// A regular file's data in the image: `size` bytes at byte `start`,
/// zero-padded to a block.
#[derive(Clone, Copy, Debug)]
struct Mapped {
    start: u64,
    size: u64,
    ino: Ino,
}

/// What a view consists of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Inodes in the file system (one per index inode).
    pub inodes: u64,
    /// Of which stored as 64-byte extended inodes (the rest are compact).
    pub extended_inodes: u64,
    /// Directories and symlinks whose (tail) data is inline after the inode.
    pub inline_inodes: u64,
    /// Bytes of metadata held in memory (superblock, inodes, xattrs,
    /// directories, symlinks; whole blocks).
    pub meta_bytes: u64,
    /// Regular files whose data is mapped into the image.
    pub mapped_files: u64,
    /// Bytes of the file data area (each file padded to a block).
    pub data_bytes: u64,
    /// Size of the image in blocks.
    pub blocks: u64,
    /// Xattrs erofs cannot hold, left out (each logged as a warning).
    pub skipped_xattrs: u64,
}

/// An image presented as an uncompressed erofs file system with 4 KiB
/// blocks, for serving as a read-only block device.
///
/// Only the metadata is built (in memory); the file data area is a sorted
/// map from block ranges to files, and reads there go through
/// [`ImageView::read`], which decompresses pool chunks on demand. Nothing
/// of the content is copied or decompressed up front.
pub struct ErofsView {
    image: Arc<ImageView>,
    /// Bytes `0..meta.len()` of the image.
    meta: Vec<u8>,
    /// Sorted by `start`, non-overlapping, all at or after `meta.len()`.
    files: Vec<Mapped>,
    len: u64,
    stats: Stats,
}

impl ErofsView {
    /// Lays out the image's tree and builds its metadata.
    pub fn new(image: Arc<ImageView>) -> Result<ErofsView> {
        let index = image.index();
        let plan = layout::plan(index)?;
        let meta = build::metadata(index, &plan);
        let bs = BLOCK_SIZE as u64;
        let mut files = Vec::new();
        let mut stats = Stats {
            inodes: plan.nodes.len() as u64,
            meta_bytes: meta.len() as u64,
            blocks: plan.total_blocks,
            skipped_xattrs: plan.skipped_xattrs as u64,
            ..Stats::default()
        };
        for (ino, (node, inode)) in plan.nodes.iter().zip(&index.inodes).enumerate() {
            stats.extended_inodes += u64::from(node.disk.extended);
            stats.inline_inodes += u64::from(node.disk.layout == DataLayout::FlatInline);
            if let Data::File { size, .. } = inode.data {
                if size > 0 {
                    files.push(Mapped { start: u64::from(node.disk.i_u) * bs, size, ino: ino as Ino });
                    stats.mapped_files += 1;
                    stats.data_bytes += size.div_ceil(bs) * bs;
                }
            }
        }
        // Assigned in index order, so already sorted by address.
        debug_assert!(files.windows(2).all(|w| w[0].start + w[0].size <= w[1].start));
        let len = plan.total_blocks * bs;
        drop(plan);
        Ok(ErofsView { image, meta, files, len, stats })
    }

    /// Size of the image in bytes (a multiple of [`ErofsView::BLOCK_SIZE`]).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: an image has at least a superblock and a root directory.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file system's block size.
    pub const BLOCK_SIZE: u64 = BLOCK_SIZE as u64;

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The image this view presents.
    pub fn image(&self) -> &Arc<ImageView> {
        &self.image
    }

    /// Reads the image's bytes at `offset` into `buf`: metadata from memory,
    /// file data from the pool, zeros for padding. Returns the bytes read:
    /// all of `buf` unless it reaches past [`ErofsView::len`] (0 at or past
    /// the end). Errors are those of reading the pool.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if offset >= self.len {
            return Ok(0);
        }
        let want = buf.len().min((self.len - offset).try_into().unwrap_or(usize::MAX));
        let buf = &mut buf[..want];
        let mut done = 0;
        while done < want {
            let pos = offset + done as u64;
            let out = &mut buf[done..];
            let n = if pos < self.meta.len() as u64 {
                let src = &self.meta[pos as usize..];
                let n = src.len().min(out.len());
                out[..n].copy_from_slice(&src[..n]);
                n
            } else {
                // The last mapped file starting at or before pos.
                let i = self.files.partition_point(|m| m.start <= pos);
                match i.checked_sub(1).map(|i| self.files[i]) {
                    Some(m) if pos < m.start + m.size => {
                        let n = (m.start + m.size - pos).min(out.len() as u64) as usize;
                        self.read_file(m, pos - m.start, &mut out[..n])?;
                        n
                    }
                    _ => {
                        // Padding up to the next file (or the end).
                        let next = self.files.get(i).map_or(self.len, |m| m.start);
                        let n = (next - pos).min(out.len() as u64) as usize;
                        out[..n].fill(0);
                        n
                    }
                }
            };
            done += n;
        }
        Ok(want)
    }

    /// Fills `out` with file content from `offset` (zeros should the pool
    /// have less than the index promised).
    fn read_file(&self, m: Mapped, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < out.len() {
            let n = self.image.read(m.ino, offset + done as u64, &mut out[done..])?;
            if n == 0 {
                out[done..].fill(0);
                break;
            }
            done += n;
        }
        Ok(())
    }
}

impl fmt::Debug for ErofsView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErofsView").field("len", &self.len).field("stats", &self.stats).finish_non_exhaustive()
    }
}

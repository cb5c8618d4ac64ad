//! Where everything goes in the erofs image of an index.
//!
//! The image is laid out as
//!
//! ```text
//! block 0            superblock at byte 1024, then the inodes from byte 1152
//! ...                inodes in index order (root first), each followed by its
//!                    inline xattrs and, when it fits in the same block, the
//!                    tail of its directory or symlink data (FLAT_INLINE)
//! meta_end           whole directory (and long symlink) blocks
//! data_start         file data: each regular file in consecutive blocks
//!                    (FLAT_PLAIN), in index order, zero-padded to a block
//! total_blocks
//! ```
//!
//! Everything before `data_start` is metadata, built in memory; everything
//! after is file content, mapped to the files it belongs to.
//!
//! `meta_blkaddr` is 0, so a node number is the inode's byte offset / 32.
//! An inode record (inode, xattrs, inline tail) never straddles a block
//! boundary unless it is larger than a block (xattrs over 4 KiB, never with
//! inline data; such a record starts a block), so readers never stitch an
//! inode or an inline tail together.

use std::collections::HashMap;

use super::error::{Error, Result};
use super::format::{self, DataLayout, DiskInode, BLOCK_SIZE, DIRENT_SIZE, INODE_SLOT, NAME_LEN};
use super::xattr;
use crate::pool::index::{Data, Index, Ino, ROOT};

const BS: u64 = BLOCK_SIZE as u64;

/// Byte offset of the first inode: right after the superblock.
const FIRST_INODE: u64 = (format::SUPER_OFFSET + format::SUPER_SIZE) as u64;

/// The complete placement of an image.
pub(crate) struct Plan<'a> {
    /// The superblock's `build_time`: the most common mtime, so that as many
    /// inodes as possible can be compact.
    pub epoch: i64,
    /// By inode number.
    pub nodes: Vec<Node<'a>>,
    /// Blocks before the file data: superblock, inodes, directory blocks.
    pub meta_blocks: u64,
    /// Size of the file system in blocks.
    pub total_blocks: u64,
    /// Xattrs that erofs cannot hold and were left out.
    pub skipped_xattrs: usize,
}

/// One inode's place and on-disk form.
pub(crate) struct Node<'a> {
    /// Byte offset of the on-disk inode.
    pub pos: u64,
    /// The inode as written (its `i_u` holds the first block of its data).
    pub disk: DiskInode,
    /// Encoded inline xattr body (empty without xattrs).
    pub xattrs: Vec<u8>,
    /// For directories: the entries in on-disk order.
    pub dir: Option<DirPlan<'a>>,
}

/// A directory's entries packed into blocks.
pub(crate) struct DirPlan<'a> {
    /// (name, target) sorted bytewise by name, `.` and `..` included.
    pub entries: Vec<(&'a [u8], Ino)>,
    /// Index in `entries` of the first entry of each block.
    pub block_starts: Vec<usize>,
}

impl Node<'_> {
    /// The node number: where the inode is, in 32-byte slots.
    pub fn nid(&self) -> u64 {
        self.pos / INODE_SLOT as u64
    }

    /// Bytes of data stored right after the inode and its xattrs.
    pub fn inline_len(&self) -> usize {
        match self.disk.layout {
            DataLayout::FlatInline => (self.disk.size % BS) as usize,
            DataLayout::FlatPlain => 0,
        }
    }

    /// Bytes of data stored in whole blocks from block `disk.i_u`.
    pub fn block_len(&self) -> u64 {
        self.disk.size - self.inline_len() as u64
    }

    /// Byte offset of the inline data.
    pub fn inline_pos(&self) -> u64 {
        self.pos + (self.disk.disk_size() + self.xattrs.len()) as u64
    }

    fn record_len(&self) -> u64 {
        (self.disk.disk_size() + self.xattrs.len() + self.inline_len()) as u64
    }
}

/// Places every inode of `index`.
pub(crate) fn plan(index: &Index) -> Result<Plan<'_>> {
    index.check().map_err(Error::BadIndex)?;
    let epoch = common_mtime(index);
    let mut skipped_xattrs = 0;
    let mut nodes = Vec::with_capacity(index.inodes.len());
    for (i, inode) in index.inodes.iter().enumerate() {
        let ino = i as Ino;
        let (xattrs, skipped) = xattr::encode_ibody(ino, &inode.xattrs);
        skipped_xattrs += skipped;
        let xattr_icount = format::xattr_icount(xattrs.len()).unwrap_or(0);
        let mut dir = None;
        let (size, i_u) = match &inode.data {
            Data::Dir { parent, entries } => {
                let d = pack_dir(ino, *parent, entries)?;
                let size = d.size();
                dir = Some(d);
                (size, 0)
            }
            Data::File { size, .. } => (*size, 0),
            Data::Symlink { target } => (target.len() as u64, 0),
            Data::Device { rdev } => (0, device_number(ino, *rdev)),
            Data::Fifo => (0, 0),
        };
        let mut disk = DiskInode {
            extended: false,
            layout: DataLayout::FlatPlain,
            xattr_icount,
            mode: inode.mode as u16,
            // 0 would make the kernel take the inode for a deleted one.
            nlink: inode.nlink.max(1),
            size,
            i_u,
            ino: ino.wrapping_add(1),
            uid: inode.uid,
            gid: inode.gid,
            mtime: inode.mtime,
        };
        disk.extended = !disk.fits_compact(epoch);
        // Directory and symlink tails go inline when the whole record fits
        // in one block; file data always lives in (mapped) blocks.
        let tail = (size % BS) as usize;
        let meta_data = matches!(inode.data, Data::Dir { .. } | Data::Symlink { .. });
        if meta_data && tail > 0 && disk.disk_size() + xattrs.len() + tail <= BLOCK_SIZE {
            disk.layout = DataLayout::FlatInline;
        }
        nodes.push(Node { pos: 0, disk, xattrs, dir });
    }

    // Inode records, 32-byte aligned, moved to the next block rather than
    // straddling a boundary (one larger than a block starts a block).
    let mut pos = FIRST_INODE;
    for node in &mut nodes {
        pos = pos.next_multiple_of(INODE_SLOT as u64);
        let len = node.record_len();
        if pos % BS + len.min(BS) > BS {
            pos = pos.next_multiple_of(BS);
        }
        node.pos = pos;
        pos += len;
    }
    let root_nid = nodes[ROOT as usize].nid();
    if root_nid > u64::from(u16::MAX) {
        return Err(Error::RootNid { nid: root_nid });
    }

    // Whole blocks: directories and symlinks (metadata) first, then files.
    let mut next = pos.div_ceil(BS);
    for (node, inode) in nodes.iter_mut().zip(&index.inodes) {
        if matches!(inode.data, Data::Dir { .. } | Data::Symlink { .. }) {
            next = place_blocks(node, next)?;
        }
    }
    let meta_blocks = next;
    for (node, inode) in nodes.iter_mut().zip(&index.inodes) {
        if matches!(inode.data, Data::File { .. }) {
            next = place_blocks(node, next)?;
        }
    }
    if next > u64::from(u32::MAX) {
        return Err(Error::TooLarge { blocks: next });
    }
    Ok(Plan { epoch, nodes, meta_blocks, total_blocks: next, skipped_xattrs })
}

/// Gives `node`'s whole blocks the addresses from `next`; returns the next free block.
fn place_blocks(node: &mut Node<'_>, next: u64) -> Result<u64> {
    let blocks = node.block_len().div_ceil(BS);
    if blocks == 0 {
        return Ok(next);
    }
    node.disk.i_u = u32::try_from(next).map_err(|_| Error::TooLarge { blocks: next + blocks })?;
    Ok(next + blocks)
}

/// The most common non-negative mtime (the smallest among equals).
fn common_mtime(index: &Index) -> i64 {
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for inode in index.inodes.iter().filter(|i| i.mtime >= 0) {
        *counts.entry(inode.mtime).or_default() += 1;
    }
    counts.into_iter().max_by_key(|&(t, n)| (n, std::cmp::Reverse(t))).map_or(0, |(t, _)| t)
}

/// The erofs form of a glibc `dev_t`.
fn device_number(ino: Ino, rdev: u64) -> u32 {
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    if major > 0xfff || minor > 0xf_ffff {
        tracing::warn!(ino, major, minor, "erofs: device number does not fit 32 bits, truncated");
    }
    format::encode_dev(major, minor)
}

/// Sorts a directory's entries (with `.` and `..`) and packs them into blocks.
fn pack_dir(ino: Ino, parent: Ino, entries: &[crate::pool::index::Dirent]) -> Result<DirPlan<'_>> {
    let mut all: Vec<(&[u8], Ino)> = Vec::with_capacity(entries.len() + 2);
    all.push((b".", ino));
    all.push((b"..", parent));
    for e in entries {
        if e.name.len() > NAME_LEN {
            return Err(Error::NameTooLong { dir: ino, len: e.name.len() });
        }
        all.push((&e.name, e.ino));
    }
    all.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut block_starts = vec![0];
    let mut used = 0;
    for (i, (name, _)) in all.iter().enumerate() {
        let need = DIRENT_SIZE + name.len();
        if used + need > BLOCK_SIZE {
            block_starts.push(i);
            used = 0;
        }
        used += need;
    }
    Ok(DirPlan { entries: all, block_starts })
}

impl DirPlan<'_> {
    /// The entries of block `b`.
    pub fn block(&self, b: usize) -> &[(&[u8], Ino)] {
        let end = self.block_starts.get(b + 1).copied().unwrap_or(self.entries.len());
        &self.entries[self.block_starts[b]..end]
    }

    /// The directory's size: whole blocks, then the used part of the last one.
    pub fn size(&self) -> u64 {
        let last = self.block(self.block_starts.len() - 1);
        let used: usize = last.iter().map(|(name, _)| DIRENT_SIZE + name.len()).sum();
        (self.block_starts.len() as u64 - 1) * BS + used as u64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pool::index::{Dirent, Inode, Xattr, S_IFCHR, S_IFDIR, S_IFLNK, S_IFREG};

    fn inode(mode: u32, mtime: i64, data: Data) -> Inode {
        Inode { mode, uid: 0, gid: 0, mtime, nlink: 1, xattrs: Vec::new(), data }
    }

    fn file(size: u64) -> Data {
        let extents = if size == 0 {
            Vec::new()
        } else {
            vec![crate::pool::index::Extent { chunk: 0, offset: 0, len: size as u32 }]
        };
        Data::File { size, digest: [0; 32], extents }
    }

    /// Root with `n` files named `file-NNNN`, a long symlink, a device, and
    /// a file with an old mtime.
    pub(crate) fn sample(n: usize) -> Index {
        let mut inodes = vec![inode(S_IFDIR | 0o755, 100, Data::Fifo)];
        let mut entries = Vec::new();
        for i in 0..n {
            entries.push(Dirent { name: format!("file-{i:04}").into_bytes(), ino: inodes.len() as Ino });
            inodes.push(inode(S_IFREG | 0o644, 100, file(i as u64 * 1000)));
        }
        entries.push(Dirent { name: b"link".to_vec(), ino: inodes.len() as Ino });
        inodes.push(inode(S_IFLNK | 0o777, 100, Data::Symlink { target: vec![b'x'; 1000] }));
        entries.push(Dirent { name: b"null".to_vec(), ino: inodes.len() as Ino });
        inodes.push(inode(S_IFCHR | 0o666, 100, Data::Device { rdev: nix::sys::stat::makedev(1, 3) }));
        entries.push(Dirent { name: b"-old".to_vec(), ino: inodes.len() as Ino });
        let mut old = inode(S_IFREG | 0o600, 5, file(4096));
        old.xattrs.push(Xattr { name: b"user.k".to_vec(), value: b"v".to_vec() });
        inodes.push(old);
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let chunk_len = (n as u32 * 1000).max(4096);
        inodes[0].data = Data::Dir { parent: 0, entries };
        inodes[0].nlink = 2;
        Index { inodes, chunks: vec![crate::pool::index::ChunkRef { digest: [0; 32], len: chunk_len }] }
    }

    #[test]
    fn places_small_tree() {
        let index = sample(3);
        let plan = plan(&index).unwrap();
        assert_eq!(plan.epoch, 100);
        let root = &plan.nodes[0];
        assert_eq!(root.pos, 1152);
        assert_eq!(root.nid(), 36);
        assert_eq!(root.disk.layout, DataLayout::FlatInline, "a small directory is inline");
        assert!(!root.disk.extended);
        let dir = root.dir.as_ref().unwrap();
        let names: Vec<&[u8]> = dir.entries.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [&b"-old"[..], b".", b"..", b"file-0000", b"file-0001", b"file-0002", b"link", b"null"],
            "bytewise order, '-' before '.'"
        );
        // Every record is 32-byte aligned and within one block.
        for n in &plan.nodes {
            assert_eq!(n.pos % 32, 0);
            assert!(n.pos % BS + n.record_len() <= BS);
        }
        let link = &plan.nodes[4];
        assert_eq!(link.disk.layout, DataLayout::FlatInline);
        assert_eq!(link.inline_len(), 1000);
        let old = &plan.nodes[6];
        assert!(old.disk.extended, "mtime differs from the epoch");
        assert_eq!(old.xattrs.len(), 20);
        assert_eq!(old.disk.xattr_icount, 3);
        assert_eq!(plan.nodes[5].disk.i_u, 0x103);
        // Files: empty → no block; 1000 and 2000 bytes → one block each; 4096 → one.
        let data: Vec<(u32, u64)> =
            [1, 2, 3, 6].iter().map(|&i| (plan.nodes[i].disk.i_u, plan.nodes[i].block_len())).collect();
        let m = plan.meta_blocks as u32;
        assert_eq!(data, [(0, 0), (m, 1000), (m + 1, 2000), (m + 2, 4096)]);
        assert_eq!(plan.total_blocks, plan.meta_blocks + 3);
    }

    #[test]
    fn packs_large_directory() {
        let index = sample(500);
        let plan = plan(&index).unwrap();
        let dir = plan.nodes[0].dir.as_ref().unwrap();
        assert_eq!(dir.entries.len(), 505);
        // 505 entries of 12 + ~9 bytes: three blocks.
        assert_eq!(dir.block_starts.len(), 3);
        for b in 0..dir.block_starts.len() {
            let used: usize = dir.block(b).iter().map(|(n, _)| 12 + n.len()).sum();
            assert!(used <= BLOCK_SIZE);
        }
        let root = &plan.nodes[0];
        assert_eq!(root.disk.size, dir.size());
        assert_eq!(root.block_len(), 2 * BS);
        assert!(root.disk.i_u > 0 && u64::from(root.disk.i_u) < plan.meta_blocks);
        assert!(dir.entries.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn large_record_starts_a_block() {
        let mut index = sample(3);
        index.inodes[1].xattrs =
            (0..3).map(|i| Xattr { name: format!("user.{i}").into_bytes(), value: vec![b'v'; 3000] }).collect();
        let plan = plan(&index).unwrap();
        let big = &plan.nodes[1];
        assert!(big.record_len() > BS);
        assert_eq!(big.pos % BS, 0);
        assert_eq!(plan.nodes[2].pos, (big.pos + big.record_len()).next_multiple_of(32));
        for n in plan.nodes.iter().filter(|n| n.record_len() <= BS) {
            assert!(n.pos % BS + n.record_len() <= BS);
        }
    }

    #[test]
    fn rejects_long_names() {
        let mut index = sample(1);
        if let Data::Dir { entries, .. } = &mut index.inodes[0].data {
            entries[0].name = vec![b'a'; 256];
        }
        assert!(matches!(plan(&index), Err(Error::NameTooLong { dir: 0, len: 256 })));
    }
}

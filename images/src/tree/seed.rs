//! A tree seeded from an image already in the pool, so that one more layer
//! can be applied over it (snapshots: an image plus the sandbox's writes)
//! without reading any of the base image's content again: files keep their
//! extents, remapped onto the new index's chunk table.

use super::node::{Kind, Meta, Node, Nodes};
use super::TreeBuilder;
use crate::pool::index::{ChunkRef, Data, Extent, Index, S_IFMT};
use crate::pool::FileContent;

impl TreeBuilder {
    /// The tree of `index`. `remap` gives the extent in the new index's
    /// chunk table of `(chunk, offset, len)` of the base.
    pub(crate) fn from_index(index: &Index, remap: &mut dyn FnMut(ChunkRef, u32, u32) -> Extent) -> TreeBuilder {
        // Node ids are the base's inode numbers (the root is 0 in both), so a
        // hardlinked inode stays one node with several names.
        let nodes = index
            .inodes
            .iter()
            .map(|inode| {
                let meta = Meta {
                    mode: inode.mode & 0o7777,
                    uid: inode.uid,
                    gid: inode.gid,
                    mtime: inode.mtime,
                    xattrs: inode.xattrs.clone(),
                };
                let kind = match &inode.data {
                    Data::Dir { entries, .. } => {
                        Kind::Dir(entries.iter().map(|d| (d.name.clone(), d.ino as usize)).collect())
                    }
                    Data::File { size, digest, extents } => Kind::File(FileContent {
                        size: *size,
                        digest: *digest,
                        extents: extents
                            .iter()
                            .filter_map(|x| index.chunks.get(x.chunk as usize).map(|c| remap(*c, x.offset, x.len)))
                            .collect(),
                        spooled: None,
                    }),
                    Data::Symlink { target } => Kind::Symlink(target.clone()),
                    Data::Device { rdev } => Kind::Device(inode.mode & S_IFMT, *rdev),
                    Data::Fifo => Kind::Fifo,
                };
                Node { meta, kind }
            })
            .collect::<Vec<_>>();
        if nodes.is_empty() {
            return TreeBuilder::new();
        }
        TreeBuilder { nodes: Nodes { nodes } }
    }
}

//! Writes the metadata part of the image (everything before the file data)
//! from a [`Plan`]: superblock, inodes, xattrs, directory blocks, symlinks.

use sha2::{Digest, Sha256};

use super::format::{self, DiskDirent, SuperBlock, BLOCK_SIZE, DIRENT_SIZE};
use super::layout::{DirPlan, Node, Plan};
use crate::pool::index::{Data, Index};

/// Volume label of every image.
const VOLUME_NAME: &[u8] = b"pvisor";

/// The first `plan.meta_blocks` blocks of the image.
pub(crate) fn metadata(index: &Index, plan: &Plan<'_>) -> Vec<u8> {
    let mut meta = vec![0u8; plan.meta_blocks as usize * BLOCK_SIZE];
    for (node, inode) in plan.nodes.iter().zip(&index.inodes) {
        let pos = node.pos as usize;
        node.disk.encode_into(&mut meta[pos..]);
        let xattrs_at = pos + node.disk.disk_size();
        meta[xattrs_at..xattrs_at + node.xattrs.len()].copy_from_slice(&node.xattrs);
        let content = match (&inode.data, &node.dir) {
            (Data::Dir { .. }, Some(dir)) => dir_content(dir, plan),
            (Data::Symlink { target }, _) => target.clone(),
            _ => continue,
        };
        place(&mut meta, node, &content);
    }
    let mut sb = SuperBlock {
        feature_compat: 0,
        root_nid: plan.nodes[0].nid() as u16,
        inos: plan.nodes.len() as u64,
        build_time: plan.epoch as u64,
        build_time_nsec: 0,
        blocks: plan.total_blocks as u32,
        meta_blkaddr: 0,
        xattr_blkaddr: 0,
        uuid: [0; 16],
        volume_name: [0; 16],
        feature_incompat: 0,
    };
    sb.volume_name[..VOLUME_NAME.len()].copy_from_slice(VOLUME_NAME);
    sb.uuid = uuid(&meta, index, plan);
    meta[format::SUPER_OFFSET..format::SUPER_OFFSET + format::SUPER_SIZE].copy_from_slice(&sb.encode());
    meta
}

/// Stores directory or symlink `content`: whole blocks at the node's block
/// address, the tail inline after the inode when the layout says so.
fn place(meta: &mut [u8], node: &Node<'_>, content: &[u8]) {
    let blocks = node.block_len() as usize;
    if blocks > 0 {
        let at = node.disk.i_u as usize * BLOCK_SIZE;
        meta[at..at + blocks].copy_from_slice(&content[..blocks]);
    }
    let tail = &content[blocks..];
    if !tail.is_empty() {
        let at = node.inline_pos() as usize;
        meta[at..at + tail.len()].copy_from_slice(tail);
    }
}

/// A directory's blocks: in each, the entries, then their names
/// (unterminated); every block but the last padded with zeros.
fn dir_content(dir: &DirPlan<'_>, plan: &Plan<'_>) -> Vec<u8> {
    let size = dir.size() as usize;
    let mut out = vec![0u8; size];
    for b in 0..dir.block_starts.len() {
        let block = &mut out[b * BLOCK_SIZE..size.min((b + 1) * BLOCK_SIZE)];
        let entries = dir.block(b);
        let mut nameoff = entries.len() * DIRENT_SIZE;
        for (i, &(name, ino)) in entries.iter().enumerate() {
            let target = &plan.nodes[ino as usize];
            let dirent = DiskDirent {
                nid: target.nid(),
                nameoff: nameoff as u16,
                file_type: format::file_type::from_mode(u32::from(target.disk.mode)),
            };
            dirent.encode_into(&mut block[i * DIRENT_SIZE..]);
            block[nameoff..nameoff + name.len()].copy_from_slice(name);
            nameoff += name.len();
        }
    }
    out
}

/// A stable volume UUID: a hash of the metadata and of the files' digests
/// (RFC 4122 variant, version 8: custom).
fn uuid(meta: &[u8], index: &Index, plan: &Plan<'_>) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(meta);
    h.update(plan.total_blocks.to_le_bytes());
    for inode in &index.inodes {
        if let Data::File { digest, .. } = &inode.data {
            h.update(digest);
        }
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize()[..16]);
    id[6] = (id[6] & 0x0f) | 0x80;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// A minimal reader of the metadata, to check what was written.
#[cfg(test)]
pub(crate) mod read {
    use super::*;
    use crate::erofs::format::{DataLayout, DiskInode};

    pub struct Reader<'a> {
        pub meta: &'a [u8],
        pub sb: SuperBlock,
    }

    impl<'a> Reader<'a> {
        pub fn new(meta: &'a [u8]) -> Reader<'a> {
            let sb = SuperBlock::decode(&meta[format::SUPER_OFFSET..]).expect("superblock");
            Reader { meta, sb }
        }

        pub fn inode(&self, nid: u64) -> (DiskInode, usize) {
            let pos = nid as usize * format::INODE_SLOT;
            (DiskInode::decode(&self.meta[pos..], self.sb.build_time as i64).expect("inode"), pos)
        }

        /// The data of a directory or symlink (which live in the metadata).
        pub fn content(&self, nid: u64) -> Vec<u8> {
            let (inode, pos) = self.inode(nid);
            let size = inode.size as usize;
            let inline = match inode.layout {
                DataLayout::FlatInline => size % BLOCK_SIZE,
                DataLayout::FlatPlain => 0,
            };
            let blocks = size - inline;
            let mut out = Vec::with_capacity(size);
            let at = inode.i_u as usize * BLOCK_SIZE;
            out.extend_from_slice(&self.meta[at..at + blocks]);
            let at = pos + inode.disk_size() + format::xattr_ibody_size(inode.xattr_icount);
            out.extend_from_slice(&self.meta[at..at + inline]);
            out
        }

        pub fn xattrs(&self, nid: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
            let (inode, pos) = self.inode(nid);
            let at = pos + inode.disk_size();
            let body = &self.meta[at..at + format::xattr_ibody_size(inode.xattr_icount)];
            crate::erofs::xattr::decode_ibody(body).expect("xattr body")
        }

        /// (name, nid, file type) of every entry, block by block, checking
        /// the block structure on the way.
        pub fn dir(&self, nid: u64) -> Vec<(Vec<u8>, u64, u8)> {
            let content = self.content(nid);
            let mut out = Vec::new();
            for block in content.chunks(BLOCK_SIZE) {
                let first = DiskDirent::decode(block);
                let count = usize::from(first.nameoff) / DIRENT_SIZE;
                assert!(count > 0 && usize::from(first.nameoff) % DIRENT_SIZE == 0);
                for i in 0..count {
                    let d = DiskDirent::decode(&block[i * DIRENT_SIZE..]);
                    let end = if i + 1 < count {
                        usize::from(DiskDirent::decode(&block[(i + 1) * DIRENT_SIZE..]).nameoff)
                    } else {
                        let rest = &block[usize::from(d.nameoff)..];
                        usize::from(d.nameoff) + rest.iter().position(|&c| c == 0).unwrap_or(rest.len())
                    };
                    out.push((block[usize::from(d.nameoff)..end].to_vec(), d.nid, d.file_type));
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read::Reader;
    use super::*;
    use crate::erofs::format::{file_type, DataLayout};
    use crate::erofs::layout;

    #[test]
    fn metadata_reads_back() {
        let index = layout::tests::sample(500);
        let plan = layout::plan(&index).unwrap();
        let meta = metadata(&index, &plan);
        assert_eq!(meta.len() as u64, plan.meta_blocks * BLOCK_SIZE as u64);
        let r = Reader::new(&meta);
        assert_eq!(r.sb.root_nid, 36);
        assert_eq!(r.sb.inos, index.inodes.len() as u64);
        assert_eq!(u64::from(r.sb.blocks), plan.total_blocks);
        assert_eq!(r.sb.build_time, 100);
        assert_eq!(&r.sb.volume_name[..6], b"pvisor");
        assert_ne!(r.sb.uuid, [0; 16]);

        let entries = r.dir(36);
        assert_eq!(entries.len(), 505);
        assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "sorted across blocks");
        let find = |name: &[u8]| entries.iter().find(|e| e.0 == name).cloned().unwrap();
        assert_eq!(find(b".").1, 36);
        assert_eq!(find(b"..").1, 36);
        assert_eq!(find(b".").2, file_type::DIR);
        let link = find(b"link");
        assert_eq!(link.2, file_type::SYMLINK);
        assert_eq!(r.content(link.1), vec![b'x'; 1000]);
        assert_eq!(r.inode(link.1).0.layout, DataLayout::FlatInline);
        let null = find(b"null");
        assert_eq!(null.2, file_type::CHRDEV);
        assert_eq!(format::decode_dev(r.inode(null.1).0.i_u), (1, 3));
        let old = find(b"-old");
        let (inode, _) = r.inode(old.1);
        assert!(inode.extended);
        assert_eq!(inode.mtime, 5);
        assert_eq!(inode.mode, 0o100600);
        assert_eq!(u64::from(inode.i_u) + 1, plan.total_blocks, "the last file, one block");
        assert_eq!(r.xattrs(old.1), vec![(b"user.k".to_vec(), b"v".to_vec())]);
        let f = find(b"file-0007");
        assert_eq!(f.2, file_type::REG_FILE);
        assert_eq!(r.inode(f.1).0.size, 7000);
        // Names never run into the next entry: every block's padding is zero.
        let root = r.inode(36).0;
        assert_eq!(root.layout, DataLayout::FlatInline);
        assert_eq!(r.content(36).len() as u64, root.size);
    }
}

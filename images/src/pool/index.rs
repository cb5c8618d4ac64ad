//! The flattened index of one image: every inode of the final tree (after
//! all layers, whiteouts and opaque directories) with its metadata, and for
//! regular files the extents of pool chunks that hold their content.
//!
//! Inode numbers are positions in [`Index::inodes`]; inode 0 is the root
//! directory. Directory entries are sorted by name (bytewise), so a lookup is
//! a binary search. A hardlinked file is one inode named by several entries.
//! Uids and gids are the image's own (unshifted): a server applies the id
//! mapping of whoever it serves.
//!
//! On disk: `MAGIC`, then the zstd-compressed postcard encoding of [`Index`].

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// File magic and format version of a stored index.
pub const MAGIC: &[u8; 8] = b"PVIDX\x00\x00\x01";

/// File type bits of `st_mode`.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFCHR: u32 = 0o020000;
pub const S_IFBLK: u32 = 0o060000;
pub const S_IFIFO: u32 = 0o010000;

/// A position in [`Index::inodes`].
pub type Ino = u32;
/// The root directory's inode.
pub const ROOT: Ino = 0;

/// The whole image tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub inodes: Vec<Inode>,
    /// Chunks the extents point into, by position.
    pub chunks: Vec<ChunkRef>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    /// `st_mode`: type bits and permission bits (setuid etc. included).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the epoch (also used as ctime/atime).
    pub mtime: i64,
    /// Number of directory entries naming this inode (plus `.`/`..` for
    /// directories, as on Linux).
    pub nlink: u32,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<Xattr>,
    pub data: Data,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// What an inode holds, by type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Data {
    Dir {
        /// The parent directory (the root is its own parent).
        parent: Ino,
        /// Sorted by name, without `.` and `..`.
        entries: Vec<Dirent>,
    },
    File {
        size: u64,
        /// sha256 of the whole content.
        digest: [u8; 32],
        /// In file order; their lengths add up to `size`.
        extents: Vec<Extent>,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Character or block device (see `mode`).
    Device {
        rdev: u64,
    },
    Fifo,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dirent {
    pub name: Vec<u8>,
    pub ino: Ino,
}

/// `len` bytes at `offset` of the uncompressed chunk `chunk` (a position in
/// [`Index::chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub chunk: u32,
    pub offset: u32,
    pub len: u32,
}

/// A pool chunk, by content: sha256 of its uncompressed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkRef {
    pub digest: [u8; 32],
    /// Uncompressed length.
    pub len: u32,
}

impl Inode {
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }
    /// Bytes of content (files), target length (symlinks), else 0.
    pub fn size(&self) -> u64 {
        match &self.data {
            Data::File { size, .. } => *size,
            Data::Symlink { target } => target.len() as u64,
            _ => 0,
        }
    }
    pub fn entries(&self) -> &[Dirent] {
        match &self.data {
            Data::Dir { entries, .. } => entries,
            _ => &[],
        }
    }
}

impl Index {
    pub fn inode(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(ino as usize)
    }

    /// The entry `name` of directory `dir`.
    pub fn lookup(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        let entries = self.inode(dir)?.entries();
        entries.binary_search_by(|e| e.name.as_slice().cmp(name)).ok().map(|i| entries[i].ino)
    }

    /// The inode at `path` (components separated by `/`, relative to the
    /// root); symlinks are not followed.
    pub fn lookup_path(&self, path: &str) -> Option<Ino> {
        path.split('/').filter(|c| !c.is_empty() && *c != ".").try_fold(ROOT, |dir, c| self.lookup(dir, c.as_bytes()))
    }

    /// Sum of file sizes, each inode once.
    pub fn logical_size(&self) -> u64 {
        self.inodes.iter().map(|i| if let Data::File { size, .. } = i.data { size } else { 0 }).sum()
    }

    /// Drops chunks no extent references (content a later layer replaced)
    /// and renumbers the extents; returns the uncompressed bytes dropped.
    pub fn compact_chunks(&mut self) -> u64 {
        let mut map = vec![u32::MAX; self.chunks.len()];
        let mut kept = Vec::new();
        for inode in &mut self.inodes {
            if let Data::File { extents, .. } = &mut inode.data {
                for x in extents {
                    let slot = &mut map[x.chunk as usize];
                    if *slot == u32::MAX {
                        *slot = kept.len() as u32;
                        kept.push(self.chunks[x.chunk as usize]);
                    }
                    x.chunk = *slot;
                }
            }
        }
        let dropped =
            self.chunks.iter().zip(&map).filter(|(_, m)| **m == u32::MAX).map(|(c, _)| u64::from(c.len)).sum();
        self.chunks = kept;
        dropped
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        let raw = postcard::to_stdvec(self).map_err(|e| Error::Options(format!("encoding index: {e}")))?;
        let mut out = MAGIC.to_vec();
        out.extend(zstd::bulk::compress(&raw, 3).map_err(|e| Error::Options(format!("compressing index: {e}")))?);
        Ok(out)
    }

    /// Decodes a stored index; `what` names it in errors.
    pub fn decode(bytes: &[u8], what: &std::path::Path) -> Result<Index> {
        let corrupt = |reason: String| Error::Corrupt { path: what.to_path_buf(), reason };
        let body = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(|| corrupt("not a pvisor index".into()))?;
        let raw = zstd::stream::decode_all(body).map_err(|e| corrupt(format!("decompressing: {e}")))?;
        let index: Index = postcard::from_bytes(&raw).map_err(|e| corrupt(format!("decoding: {e}")))?;
        index.check().map_err(corrupt)?;
        Ok(index)
    }

    /// Structural checks a reader relies on: references in range, sorted
    /// entries, extents within their chunks and adding up to the file size.
    pub fn check(&self) -> std::result::Result<(), String> {
        let n = self.inodes.len();
        match self.inodes.first() {
            Some(root) if root.is_dir() => {}
            _ => return Err("the root inode is not a directory".into()),
        }
        for (i, inode) in self.inodes.iter().enumerate() {
            match &inode.data {
                Data::Dir { parent, entries } => {
                    if *parent as usize >= n || !inode.is_dir() {
                        return Err(format!("inode {i}: bad directory"));
                    }
                    if entries.windows(2).any(|w| w[0].name >= w[1].name)
                        || entries.iter().any(|e| e.ino as usize >= n || e.ino == ROOT || e.name.is_empty())
                    {
                        return Err(format!("inode {i}: bad directory entries"));
                    }
                }
                Data::File { size, extents, .. } => {
                    let mut total = 0u64;
                    for x in extents {
                        let c = self.chunks.get(x.chunk as usize).ok_or(format!("inode {i}: bad chunk"))?;
                        if u64::from(x.offset) + u64::from(x.len) > u64::from(c.len) {
                            return Err(format!("inode {i}: extent past its chunk"));
                        }
                        total += u64::from(x.len);
                    }
                    if total != *size || inode.kind() != S_IFREG {
                        return Err(format!("inode {i}: extents do not match the size"));
                    }
                }
                Data::Symlink { .. } if inode.kind() != S_IFLNK => return Err(format!("inode {i}: bad symlink")),
                Data::Device { .. } if !matches!(inode.kind(), S_IFCHR | S_IFBLK) => {
                    return Err(format!("inode {i}: bad device"))
                }
                Data::Fifo if inode.kind() != S_IFIFO => return Err(format!("inode {i}: bad fifo")),
                _ => {}
            }
        }
        Ok(())
    }
}

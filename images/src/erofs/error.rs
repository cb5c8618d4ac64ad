//! Errors of building an erofs view.

use crate::pool::index::Ino;

/// Why an image cannot be presented as an erofs file system.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The index is inconsistent (see `Index::check`).
    #[error("image index is inconsistent: {0}")]
    BadIndex(String),

    /// A directory entry name is longer than erofs allows.
    #[error("directory inode {dir}: entry name of {len} bytes exceeds the erofs limit of 255")]
    NameTooLong { dir: Ino, len: usize },

    /// The file system would need more blocks than 32-bit block numbers address.
    #[error("the image needs {blocks} blocks of 4 KiB, more than erofs addresses without 48-bit block numbers")]
    TooLarge { blocks: u64 },

    /// The root directory's node number does not fit the superblock.
    #[error("the root directory's node number {nid} does not fit the superblock's 16-bit field")]
    RootNid { nid: u64 },
}

/// Shorthand result type of the erofs module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

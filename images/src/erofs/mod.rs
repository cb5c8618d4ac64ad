//! An image of the pool as a read-only erofs file system, for the vm
//! backend to serve as a block device (virtio-blk).
//!
//! [`ErofsView`] synthesizes the file system from an image's index: the
//! metadata (superblock, inodes, xattrs, directories, symlinks) is built in
//! memory, while file data blocks are *mapped*, not copied: a read in the
//! data area is served by reading the file through [`crate::ImageView`],
//! which decompresses the pool chunk holding it on demand.
//!
//! The format is the uncompressed subset of erofs that Linux has mounted
//! since 5.4: 4 KiB blocks, compact or extended inodes, `FLAT_PLAIN` files,
//! `FLAT_INLINE` directory and symlink tails, inline xattrs, no superblock
//! checksum. Image uids, gids and mtimes are kept as they are.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! let pool = pvisor_images::Pool::open(std::path::Path::new("/var/lib/pvisor/images"))?;
//! let image = pool.resolve("busybox:latest")?;
//! let fs = pvisor_images::erofs::ErofsView::new(Arc::new(pool.view(&image)?))?;
//! let mut block = vec![0u8; 4096];
//! fs.read_at(0, &mut block)?;
//! # Ok(()) }
//! ```

mod build;
mod error;
pub mod format;
mod layout;
mod view;
mod xattr;

pub use error::{Error, Result};
pub use view::{ErofsView, Stats};

/// The metadata blocks of `index`'s erofs image and the image's size in
/// blocks (for [`crate::fuzzing`]).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_metadata(index: &crate::pool::index::Index) -> Result<(Vec<u8>, u64)> {
    let plan = layout::plan(index)?;
    Ok((build::metadata(index, &plan), plan.total_blocks))
}

//! A sandbox's root filesystem, as its backend needs it.
//!
//! The broker asks the provider of the sandbox's backend for the image's
//! root: the ns backend overlays the image server's FUSE mount (started on
//! the first create of the image); the vm backend gets the pool's erofs view
//! of the image, served by its worker as a read-only virtio-blk disk, and no
//! FUSE mount is made for it.
use super::images::ImageMounts;
use pvisor_images::ImageRecord;
use pvisor_worker::config::ImageDisk;
use std::path::PathBuf;

/// The root an image gives a sandbox.
#[derive(Clone, Debug)]
pub enum RootFs {
    /// A read-only directory tree (the overlay's lower layer).
    Tree(PathBuf),
    /// An image of the pool, to be served as a block device.
    Disk(ImageDisk),
}

/// Provides sandboxes of one backend with their roots.
pub trait RootFsProvider: Send + Sync {
    /// The root for `image`; may start serving it (blocking).
    fn root(&self, image: &ImageRecord) -> Result<RootFs, String>;
}

/// ns: the image server's FUSE mount.
pub struct FuseRoots<'a>(pub &'a ImageMounts);

impl RootFsProvider for FuseRoots<'_> {
    fn root(&self, image: &ImageRecord) -> Result<RootFs, String> {
        self.0.ensure(image).map(RootFs::Tree)
    }
}

/// vm: the pool's erofs view of the image, opened by the worker.
pub struct BlockRoots {
    pub pool_dir: PathBuf,
}

impl RootFsProvider for BlockRoots {
    fn root(&self, image: &ImageRecord) -> Result<RootFs, String> {
        Ok(RootFs::Disk(ImageDisk {
            pool_dir: self.pool_dir.to_string_lossy().into_owned(),
            image_id: image.id.clone(),
        }))
    }
}

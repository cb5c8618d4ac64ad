//! pvisor image pool.
//!
//! Imports container images (docker-archive or OCI image-layout tarballs, or
//! pulled from a registry) into one compressed, deduplicated,
//! content-addressed pool shared by all images: each image is a flattened
//! index of its tree, and file content lives in zstd-compressed chunks
//! stored once for the whole pool. Images are served from the pool, read
//! lazily, and never unpacked into a root file system.
//!
//! ```no_run
//! # fn main() -> Result<(), pvisor_images::Error> {
//! let pool = pvisor_images::Pool::open(std::path::Path::new("/var/lib/pvisor/images"))?;
//! let imported = pool.import(std::path::Path::new("busybox.tar"))?;
//! let image = pool.resolve("docker.io/library/busybox")?;
//! let view = pool.view(&image)?;
//! let passwd = view.read_path("etc/passwd");
//! # let _ = (imported, passwd); Ok(()) }
//! ```

mod archive;
mod config;
mod docker;
pub mod erofs;
mod error;
pub mod fuse;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod oci;
pub mod pool;
mod reference;
pub mod registry;
mod tree;

use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
pub use pool::view::ImageView;
pub use pool::{DerivedImage, DuReport, GcReport, ImportEvent, ImportStats, Pool, PullProgress};
pub use reference::normalize_name;

/// Uid/gid shift used by [`Pool::open`] when running as root.
pub const DEFAULT_ID_SHIFT: u32 = 100_000;
/// Size of the id range an image may use (ids 0..65536), which the sandbox's
/// user namespace maps onto `shift..shift+65536`.
pub const ID_RANGE: u32 = tree::ID_RANGE as u32;

/// Runtime configuration of an image as recorded in its config blob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `K=V` strings.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// An image in the pool.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `sha256:<hex>` of the image config blob.
    pub id: String,
    /// Normalized names (`busybox:latest`), sorted; may be empty.
    pub names: Vec<String>,
    pub config: ImageConfig,
    /// Apparent size of the image's files (each inode once).
    pub size_bytes: u64,
    /// RFC 3339 time of the first import.
    pub imported_at: String,
}

/// Pool settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The uid/gid shift images are served with (root only; see
    /// [`DEFAULT_ID_SHIFT`]). None: served as owned by the current user.
    pub id_shift: Option<u32>,
    /// zstd level for new chunks.
    pub level: i32,
}

impl Default for Options {
    fn default() -> Self {
        Options { id_shift: None, level: 3 }
    }
}

impl Options {
    /// [`DEFAULT_ID_SHIFT`] when running as root, None otherwise.
    pub fn detect() -> Options {
        Options { id_shift: nix::unistd::geteuid().is_root().then_some(DEFAULT_ID_SHIFT), ..Options::default() }
    }
}

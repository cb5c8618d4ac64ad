//! Serving one image of the pool read-only through FUSE.
//!
//! [`ImageFs`] answers the kernel's FUSE requests from an [`ImageView`](crate::ImageView): the
//! tree and metadata come from the image's index, file content from its chunks, decompressed on
//! demand. Images are immutable, so the kernel is told to cache everything for a long time
//! (entries, attributes, page cache, directory listings, symlink targets); a sandbox's root is
//! an overlay with this mount as its lower layer.
//!
//! [`server`] is the process around it, `pvisor-imaged`: one per image, shared by every sandbox
//! of that image. It opens the pool, mounts, then jails itself ([`jail`]: no capabilities,
//! `no_new_privs`, the seccomp allow list `pvisor_seccomp::image_server_filter`) before serving.
//!
//! Inode numbers: FUSE inode = index inode + 1 (the FUSE root is 1, the index root 0). Owners
//! are mapped by [`IdMap`]. Every write operation fails with `EROFS`.

mod attr;
mod error;
mod fs;
mod fusermount;
pub mod jail;
mod mount;
mod pipes;
mod prefetch;
pub mod server;
mod xattr;

pub use attr::{IdMap, TTL};
pub use error::{Error, Result};
pub use fs::{ImageFs, OpenMode};
pub use mount::{mount_config, MountSpec};

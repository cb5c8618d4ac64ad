//! virtio-blk: a disk over a [`BlockBackend`].
//!
//! Requests IN, OUT, FLUSH and GET_ID are served; every other type is
//! answered UNSUPP. A read-only backend makes the device offer
//! VIRTIO_BLK_F_RO and fail OUT with IOERR. Every request is bounds-checked
//! against the disk: one that reaches past its end, or a malformed chain,
//! is answered IOERR, never a panic.

mod backend;
mod device;
mod request;

pub use backend::{BlockBackend, FileBackend};
pub use device::Block;

/// Bytes per sector: virtio-blk addresses and sizes the disk in 512-byte
/// sectors whatever the backend's block size.
pub const SECTOR_SIZE: u64 = 512;
/// Size of the queue (the only one).
pub const QUEUE_SIZE: u16 = 256;
/// Length of the id string answered to GET_ID.
pub const ID_LEN: usize = 20;

#[cfg(test)]
mod tests;

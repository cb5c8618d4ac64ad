//! virtio-blk: a disk over a [`BlockBackend`].
//!
//! Requests IN, OUT, FLUSH and GET_ID are served, DISCARD and WRITE_ZEROES
//! where the backend can drop ranges (a sparse file: the space goes back to
//! the host); every other type is answered UNSUPP. A read-only backend makes the device offer
//! VIRTIO_BLK_F_RO and fail OUT with IOERR. Every request is bounds-checked
//! against the disk: one that reaches past its end, or a malformed chain,
//! is answered IOERR, never a panic.

mod backend;
mod device;
mod request;

pub use backend::{BlockBackend, FileBackend, ReadOnlyBackend};
pub use device::Block;

/// Bytes per sector: virtio-blk addresses and sizes the disk in 512-byte
/// sectors whatever the backend's block size.
pub const SECTOR_SIZE: u64 = 512;
/// Size of the queue (the only one).
pub const QUEUE_SIZE: u16 = 256;
/// Length of the id string answered to GET_ID.
pub const ID_LEN: usize = 20;
/// Largest DISCARD / WRITE_ZEROES segment, in sectors (256 MiB).
pub const MAX_DISCARD_SECTORS: u32 = 1 << 19;
/// Segments per DISCARD / WRITE_ZEROES request.
pub const MAX_DISCARD_SEGMENTS: u32 = 16;

#[cfg(test)]
mod tests;

//! virtio-balloon (device id 5) for **free page reporting** only: the guest
//! tells the VMM which of its pages are free, and the VMM gives them back to
//! the host, so an idle guest costs the host what it uses, not what it once
//! touched (the page cache of a boot, an unpacked initramfs, a finished
//! build's heap).
//!
//! * Features: VERSION_1 and PAGE_REPORTING. The device never asks the guest
//!   to inflate (`num_pages` stays 0), so the inflate and deflate queues only
//!   ever see what a driver sends on its own; their chains are returned
//!   unread. No stats queue, no free page hinting, no page poisoning: with
//!   those off, Linux numbers the queues 0 inflate, 1 deflate, 2 reporting.
//! * Reporting: each chain is a batch of free blocks (one device-writable
//!   descriptor per block, at most 32, each 2 or 4 MiB in Linux). Every block
//!   is given back before the chain is returned (the guest reuses a block
//!   only after that), see [`discard`]. A block outside guest memory is
//!   skipped and counted; never a panic.
//! * Memory after a report reads as the mapping's backing: zeros for the
//!   guest RAM memfd and for anonymous RAM, the snapshot's page for a private
//!   restore. The guest assumes nothing about a reported page's content.
//!
//! Files: `device` (the [`VirtioDevice`](super::VirtioDevice)), `discard`
//! (guest ranges back to the host, per mapping kind).

mod device;
mod discard;

pub use device::{Balloon, BalloonCounters};

/// The device type a balloon reports (virtio id 5).
pub const DEVICE_TYPE: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
/// Feature bit 5: the driver may report free pages on the reporting queue.
pub const VIRTIO_BALLOON_F_REPORTING: u32 = 5;
/// Queue indices with only PAGE_REPORTING negotiated.
pub const INFLATE_QUEUE: usize = 0;
pub const DEFLATE_QUEUE: usize = 1;
pub const REPORTING_QUEUE: usize = 2;
/// Size of each queue (Linux refuses a reporting queue under 32 entries).
pub const QUEUE_SIZE: u16 = 64;
/// `struct virtio_balloon_config`: num_pages, actual, free_page_hint_cmd_id, poison_val.
pub const CONFIG_LEN: usize = 16;

#[cfg(test)]
mod tests;

//! Host to guest: one frame into the rx queue, a zero `virtio_net_hdr`
//! (with `num_buffers`) in front.
//!
//! With MRG_RXBUF the frame may span several chains: as many are taken as
//! it needs, the header (in the first) says how many, and they are used
//! back to back. Without it, one chain must hold header and frame. When the
//! guest has not posted enough buffers yet the chains taken are put back
//! (the avail index rewound) and the frame waits; a frame no posting could
//! hold (it needs more than a full ring, or a lone chain is too small) is
//! dropped. A malformed chain is used with length 0 (the guest frees it).

use std::io::Write;

use virtio_queue::{Queue, QueueOwnedT, QueueT, Writer};

use super::state::NetCounters;
use super::HDR_LEN;
use crate::devices::virtio::GuestMemory;

/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFFSET: usize = 10;

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// In the guest's buffers.
    Delivered,
    /// Not enough buffers yet; the frame waits, the ring is as it was.
    NoBuffers,
    /// The frame is gone (it cannot fit, or a chain was malformed).
    Dropped,
}

/// The outcome and whether any chain was used (an interrupt is due).
pub(super) struct Outcome {
    pub delivery: Delivery,
    pub used: bool,
}

/// Puts `frame` into `queue`.
pub(super) fn deliver(
    frame: &[u8],
    queue: &mut Queue,
    mem: &GuestMemory,
    mergeable: bool,
    counters: &mut NetCounters,
) -> Outcome {
    let total = HDR_LEN + frame.len();
    let mut parts: Vec<(u16, Writer<'_>)> = Vec::new();
    let mut room = 0usize;
    let mut used = false;
    while room < total {
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            // Everything the guest posted is taken and still short: if the
            // ring was full, no posting could hold the frame.
            let ring_full = parts.len() >= usize::from(queue.size());
            rewind(queue, parts.len());
            let delivery = if ring_full { Delivery::Dropped } else { Delivery::NoBuffers };
            return Outcome { delivery, used };
        };
        let head = chain.head_index();
        let writer = match Writer::new(mem, chain) {
            Ok(w) if w.available_bytes() >= HDR_LEN || (!parts.is_empty() && w.available_bytes() > 0) => w,
            other => {
                if let Err(e) = other {
                    tracing::debug!("virtio-net: rx chain: {e}");
                }
                counters.bad_chains += 1;
                used |= give_back(queue, mem, head);
                if parts.is_empty() {
                    continue;
                }
                // Chains taken before it cannot be put back past it.
                for (head, _) in parts {
                    used |= give_back(queue, mem, head);
                }
                return Outcome { delivery: Delivery::Dropped, used };
            }
        };
        if !mergeable && writer.available_bytes() < total {
            // One chain per frame and this one is too small: keep it for
            // the next frame, drop this one.
            rewind(queue, 1);
            return Outcome { delivery: Delivery::Dropped, used };
        }
        room += writer.available_bytes();
        parts.push((head, writer));
    }
    let mut header = [0u8; HDR_LEN];
    let count = u16::try_from(parts.len()).unwrap_or(u16::MAX);
    header[NUM_BUFFERS_OFFSET..].copy_from_slice(&count.to_le_bytes());
    let mut rest: &[u8] = frame;
    let mut lens = Vec::with_capacity(parts.len());
    let mut ok = true;
    for (i, (_, writer)) in parts.iter_mut().enumerate() {
        if i == 0 {
            ok &= writer.write_all(&header).is_ok();
        }
        let n = writer.available_bytes().min(rest.len());
        ok &= writer.write_all(&rest[..n]).is_ok();
        rest = &rest[n..];
        lens.push(u32::try_from(writer.bytes_written()).unwrap_or(u32::MAX));
    }
    for ((head, _), len) in parts.iter().zip(lens) {
        if let Err(e) = queue.add_used(mem, *head, if ok { len } else { 0 }) {
            tracing::warn!("virtio-net: add_used: {e}");
        }
    }
    let delivery = if ok { Delivery::Delivered } else { Delivery::Dropped };
    Outcome { delivery, used: true }
}

/// Returns a chain to the guest unused.
fn give_back(queue: &mut Queue, mem: &GuestMemory, head: u16) -> bool {
    match queue.add_used(mem, head, 0) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("virtio-net: add_used: {e}");
            false
        }
    }
}

/// Puts the last `n` chains taken back into the avail ring.
fn rewind(queue: &mut Queue, n: usize) {
    for _ in 0..n {
        queue.go_to_previous_position();
    }
}

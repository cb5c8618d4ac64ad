//! The virtio-blk device model: features, config space, and its one queue.

use std::sync::Arc;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueT};

use super::{request, BlockBackend, ID_LEN, MAX_DISCARD_SECTORS, MAX_DISCARD_SEGMENTS, QUEUE_SIZE, SECTOR_SIZE};
use crate::devices::virtio::{
    read_config_bytes, GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_INDIRECT_DESC,
};

/// Size of `struct virtio_blk_config` up to and including the
/// write-zeroes fields.
pub const CONFIG_LEN: usize = 60;

/// A virtio-blk disk.
pub struct Block {
    disk: Arc<dyn BlockBackend>,
    id: [u8; ID_LEN],
    config: [u8; CONFIG_LEN],
    acked: u64,
    buf: Vec<u8>,
}

impl Block {
    /// A disk over `disk`; `id` (at most 20 bytes kept) answers GET_ID.
    pub fn new(disk: Arc<dyn BlockBackend>, id: &str) -> Self {
        let mut id_bytes = [0u8; ID_LEN];
        let n = id.len().min(ID_LEN);
        id_bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
        let mut config = [0u8; CONFIG_LEN];
        // capacity, in 512-byte sectors (a partial last sector is not exposed).
        config[0..8].copy_from_slice(&(disk.len() / SECTOR_SIZE).to_le_bytes());
        // seg_max: data descriptors per request (the queue minus header and status).
        config[12..16].copy_from_slice(&u32::from(QUEUE_SIZE - 2).to_le_bytes());
        // num_queues
        config[34..36].copy_from_slice(&1u16.to_le_bytes());
        if disk.can_discard() {
            // max_discard_sectors, max_discard_seg, discard_sector_alignment
            config[36..40].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
            config[40..44].copy_from_slice(&MAX_DISCARD_SEGMENTS.to_le_bytes());
            config[44..48].copy_from_slice(&1u32.to_le_bytes());
            // max_write_zeroes_sectors, max_write_zeroes_seg, write_zeroes_may_unmap
            config[48..52].copy_from_slice(&MAX_DISCARD_SECTORS.to_le_bytes());
            config[52..56].copy_from_slice(&MAX_DISCARD_SEGMENTS.to_le_bytes());
            config[56] = 1;
        }
        Self { disk, id: id_bytes, config, acked: 0, buf: Vec::new() }
    }

    /// The config space image (also served by the vhost-user back-end).
    pub fn config(&self) -> &[u8] {
        &self.config
    }

    /// The features the driver acked.
    pub fn acked_features(&self) -> u64 {
        self.acked
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let mut features = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_FLUSH;
        if self.disk.read_only() {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        if self.disk.can_discard() {
            features |= 1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        features
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features;
    }

    /// Requests are served to completion inside `process_queue`: between two calls the device
    /// holds nothing but its acked features and its backend (which a restore reopens).
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        let Some(queue) = queues.get_mut(index).filter(|_| index == 0) else {
            return used;
        };
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = request::serve(chain, mem, &*self.disk, &self.id, &mut self.buf);
            if let Err(e) = queue.add_used(mem, head, len) {
                tracing::warn!("virtio-blk: add_used: {e}");
                break;
            }
            used.set(0);
        }
        used
    }
}

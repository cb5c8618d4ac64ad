//! The virtio-balloon device model: features, config space, and its queues.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{Queue, QueueT};

use super::{discard, CONFIG_LEN, QUEUE_SIZE, REPORTING_QUEUE, VIRTIO_BALLOON_F_REPORTING};
use crate::devices::virtio::{read_config_bytes, GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1};

/// What the device has done, readable from any thread.
#[derive(Debug, Default)]
pub struct BalloonCounters {
    /// Bytes the guest reported free and the host got back.
    pub reported_bytes: AtomicU64,
    /// Reported blocks that could not be given back (outside guest memory,
    /// a refused `madvise`).
    pub bad_blocks: AtomicU64,
}

/// A virtio-balloon that serves free page reporting.
pub struct Balloon {
    config: [u8; CONFIG_LEN],
    acked: u64,
    counters: Arc<BalloonCounters>,
}

impl Balloon {
    /// A balloon whose target stays 0 pages.
    pub fn new() -> Self {
        Self { config: [0; CONFIG_LEN], acked: 0, counters: Arc::default() }
    }

    /// The device's counters (shared: they stay readable after the device moved to its thread).
    pub fn counters(&self) -> Arc<BalloonCounters> {
        self.counters.clone()
    }

    /// Gives back every block of one reporting chain.
    fn report(&self, chain: virtio_queue::DescriptorChain<&GuestMemory>, mem: &GuestMemory) {
        for desc in chain {
            match discard::discard(mem, desc.addr().0, u64::from(desc.len())) {
                Ok(n) => {
                    self.counters.reported_bytes.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counters.bad_blocks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("virtio-balloon: reported block not given back: {e}");
                }
            }
        }
    }
}

impl Default for Balloon {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_BALLOON_F_REPORTING
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features;
    }

    /// Reports are served to completion inside `process_queue`: between two calls the device
    /// holds only its acked features and the `actual` the driver wrote (restored by the guest's
    /// next write; the device never reads it).
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    /// The driver writes `actual` (bytes 4..8); the rest is the device's.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            let at = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
            if let Some(at @ 4..=7) = at {
                self.config[at] = *byte;
            }
        }
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        let Some(queue) = queues.get_mut(index) else {
            return used;
        };
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            if index == REPORTING_QUEUE {
                self.report(chain, mem);
            }
            // Inflate and deflate chains (never asked for) are returned unread.
            if let Err(e) = queue.add_used(mem, head, 0) {
                tracing::warn!("virtio-balloon: add_used: {e}");
                break;
            }
            used.set(index);
        }
        used
    }
}

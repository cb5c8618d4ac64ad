//! The virtio-vsock device model: three queues (rx, tx, event), config =
//! the guest's CID, and the muxer's epoll fd as its host event source.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::muxer::Muxer;
use super::{packet, Error, VsockHandle, EVENT_QUEUE, QUEUE_SIZE, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::{
    read_config_bytes, GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_INDIRECT_DESC,
};

/// The virtio device id of vsock.
pub const VIRTIO_ID_VSOCK: u32 = 19;
/// `struct virtio_vsock_event { le32 id; }` with id VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (0).
const TRANSPORT_RESET_EVENT: [u8; 4] = 0u32.to_le_bytes();

/// A virtio-vsock device.
pub struct Vsock {
    guest_cid: u64,
    config: [u8; 8],
    muxer: Muxer,
    handle: VsockHandle,
    acked: u64,
    payload: Vec<u8>,
    /// Restored from a snapshot: the guest is told its transport was reset
    /// (on the first event-queue buffer it offers).
    reset_pending: bool,
}

impl Vsock {
    /// A device for guest `guest_cid` (≥ 3). With `uds_path`, guest
    /// connections to port P go to `<uds_path>_P` and a listener is bound at
    /// `<uds_path>` (replacing a stale socket); without, only
    /// [`VsockHandle::connect`] reaches the guest.
    pub fn new(guest_cid: u64, uds_path: Option<PathBuf>) -> Result<Self, Error> {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(Error::Setup)?);
        let muxer = Muxer::new(guest_cid, uds_path, rx, wake.clone())?;
        Ok(Self {
            guest_cid,
            config: guest_cid.to_le_bytes(),
            muxer,
            handle: VsockHandle::new(tx, wake),
            acked: 0,
            payload: Vec::new(),
            reset_pending: false,
        })
    }

    /// A handle for in-process connections to the guest.
    pub fn handle(&self) -> VsockHandle {
        self.handle.clone()
    }

    /// The guest's CID.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Live connections (for tests and metrics).
    pub fn connection_count(&self) -> usize {
        self.muxer.connection_count()
    }

    fn process_tx(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        let Some(tx) = queues.get_mut(TX_QUEUE) else { return used };
        while let Some(chain) = tx.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let parsed = packet::read_tx(chain, mem, &mut self.payload);
            if tx.add_used(mem, head, 0).is_err() {
                break;
            }
            used.set(TX_QUEUE);
            match parsed {
                Ok(header) => self.muxer.handle_tx(&header, &self.payload),
                Err(e) => tracing::debug!("vsock: dropping malformed tx packet: {e}"),
            }
        }
        used
    }

    /// Sends a pending transport reset on the event queue, once the guest has a buffer there.
    fn process_event(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        if !self.reset_pending {
            return used;
        }
        let Some(ev) = queues.get_mut(EVENT_QUEUE) else { return used };
        if let Some(chain) = ev.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let written = packet::write_event(chain, mem, &TRANSPORT_RESET_EVENT);
            match written {
                Ok(n) if ev.add_used(mem, head, n).is_ok() => {
                    used.set(EVENT_QUEUE);
                    self.reset_pending = false;
                }
                Ok(_) => {}
                Err(e) => {
                    // A buffer too small for an event: used empty, the next one is tried.
                    tracing::debug!("vsock: event buffer: {e}");
                    if ev.add_used(mem, head, 0).is_ok() {
                        used.set(EVENT_QUEUE);
                    }
                }
            }
        }
        used
    }

    fn process_rx(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        if let Some(rx) = queues.get_mut(RX_QUEUE) {
            if self.muxer.fill_rx(rx, mem) {
                used.set(RX_QUEUE);
            }
        }
        used
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_INDIRECT_DESC
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features;
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        // Guest packets first: they may queue answers for rx. The event
        // queue only holds buffers for the transport reset of a restore.
        let used = if index == TX_QUEUE { self.process_tx(queues, mem) } else { UsedQueues::NONE };
        used.union(self.process_event(queues, mem)).union(self.process_rx(queues, mem))
    }

    fn event_fd(&self) -> Option<RawFd> {
        Some(self.muxer.epoll_fd())
    }

    fn handle_event(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        self.muxer.poll();
        self.process_rx(queues, mem)
    }

    fn reset(&mut self) {
        self.muxer.reset();
        self.reset_pending = false;
    }

    /// The host's connections are not carried (they were the source VM's): a restored device
    /// starts with none and resets the guest's transport (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET,
    /// as QEMU's vhost-vsock does after a migration): the guest drops its connections and keeps
    /// its listening sockets, so the host connects again.
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn restored(&mut self) {
        self.muxer.reset();
        self.reset_pending = true;
    }
}

//! The virtio-net device model: two queues (rx, tx), config = MAC, status
//! (link up), MTU; its event source is the link's epoll set.

use std::os::fd::{OwnedFd, RawFd};

use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::epoll::EventSet;

use super::link::{self, Link};
use super::rx::{self, Delivery};
use super::state::{NetCounters, State};
use super::{tx, Error, ETH_OVERHEAD, MIN_MTU, QUEUE_SIZE, RX_QUEUE, TX_QUEUE};
use crate::devices::virtio::{
    read_config_bytes, GuestMemory, UsedQueues, VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_INDIRECT_DESC,
};

/// `struct virtio_net_config` up to and including `mtu`.
pub const CONFIG_LEN: usize = 12;
/// Frames moved per queue per wake-up, so one busy direction cannot hold
/// the device thread (the level-triggered set brings it back).
const BATCH: usize = QUEUE_SIZE as usize;

/// A virtio-net device whose wire is a SOCK_SEQPACKET socket.
pub struct Net {
    config: [u8; CONFIG_LEN],
    acked: u64,
    link: Link,
    state: State,
}

impl Net {
    /// A device with Ethernet address `mac` and MTU `mtu`, passing frames
    /// over `link` (one end of a SOCK_SEQPACKET socketpair).
    pub fn new(link: OwnedFd, mac: [u8; 6], mtu: u16) -> Result<Self, Error> {
        if mtu < MIN_MTU {
            return Err(Error::Mtu(mtu));
        }
        let mut config = [0u8; CONFIG_LEN];
        config[0..6].copy_from_slice(&mac);
        config[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        // max_virtqueue_pairs (read only with MQ, which is not offered)
        config[8..10].copy_from_slice(&1u16.to_le_bytes());
        config[10..12].copy_from_slice(&mtu.to_le_bytes());
        let max_frame = usize::from(mtu) + ETH_OVERHEAD;
        Ok(Self { config, acked: 0, link: Link::new(link)?, state: State::new(max_frame) })
    }

    /// The config space image.
    pub fn config(&self) -> &[u8] {
        &self.config
    }

    /// The features the driver acked.
    pub fn acked_features(&self) -> u64 {
        self.acked
    }

    /// The counters so far.
    pub fn counters(&self) -> NetCounters {
        self.state.counters
    }

    /// Whether netd is still connected.
    pub fn link_up(&self) -> bool {
        self.link.is_up()
    }

    /// What waits in the device now (a frame each way, the socket
    /// interest), for diagnosing a stalled transfer.
    pub fn describe(&self) -> String {
        format!(
            "rx frame waiting {:?}, tx frame waiting {:?}, link up {}, watching {:?}",
            self.state.rx_len,
            self.state.tx_len,
            self.link.is_up(),
            self.link.interest()
        )
    }

    fn mergeable(&self) -> bool {
        self.acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0
    }

    /// Sends the waiting tx frame, then the guest's chains, until the socket
    /// is full or the ring empty.
    fn process_tx(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        if !self.flush_tx() {
            return used;
        }
        let Some(queue) = queues.get_mut(TX_QUEUE) else { return used };
        for _ in 0..BATCH {
            let Some(chain) = queue.pop_descriptor_chain(mem) else { break };
            let head = chain.head_index();
            let frame = tx::read_frame(chain, mem, &mut self.state.tx_buf);
            if let Err(e) = queue.add_used(mem, head, 0) {
                tracing::warn!("virtio-net: add_used: {e}");
                break;
            }
            used.set(TX_QUEUE);
            match frame {
                Ok(len) => {
                    self.state.tx_len = Some(len);
                    if !self.flush_tx() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!("virtio-net: dropping tx chain: {e}");
                    if matches!(e, Error::Chain(_) | Error::ShortHeader(_) | Error::Guest(_)) {
                        self.state.counters.bad_chains += 1;
                    }
                    self.state.counters.tx_dropped += 1;
                }
            }
        }
        used
    }

    /// Sends the waiting tx frame, if any; false while it still waits.
    fn flush_tx(&mut self) -> bool {
        let Some(len) = self.state.tx_len else { return true };
        let c = &mut self.state.counters;
        match self.link.send(&self.state.tx_buf[..len]) {
            link::Send::Sent => {
                c.tx_frames += 1;
                c.tx_bytes += len as u64;
            }
            link::Send::WouldBlock => return false,
            link::Send::TooLarge | link::Send::Closed => c.tx_dropped += 1,
        }
        self.state.tx_len = None;
        true
    }

    /// Delivers the waiting rx frame, then netd's, until the guest runs out
    /// of buffers or netd of frames.
    fn process_rx(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let mut used = UsedQueues::NONE;
        let mergeable = self.mergeable();
        let Some(queue) = queues.get_mut(RX_QUEUE) else { return used };
        let max_frame = self.state.tx_buf.len();
        for _ in 0..BATCH {
            let len = match self.state.rx_len {
                Some(len) => len,
                None => match self.link.recv(&mut self.state.rx_buf) {
                    link::Recv::Frame(len) if len <= max_frame => len,
                    link::Recv::Frame(len) => {
                        tracing::debug!("virtio-net: dropping a {len}-byte frame from netd (max {max_frame})");
                        self.state.counters.rx_dropped += 1;
                        continue;
                    }
                    link::Recv::WouldBlock | link::Recv::Closed => break,
                },
            };
            if !queue.ready() {
                // The driver has not set the ring up yet: the frame waits
                // (and the socket is not read) until it kicks rx.
                self.state.rx_len = Some(len);
                break;
            }
            let out = rx::deliver(&self.state.rx_buf[..len], queue, mem, mergeable, &mut self.state.counters);
            if out.used {
                used.set(RX_QUEUE);
            }
            match out.delivery {
                Delivery::Delivered => {
                    self.state.counters.rx_frames += 1;
                    self.state.counters.rx_bytes += len as u64;
                    self.state.rx_len = None;
                }
                Delivery::Dropped => {
                    self.state.counters.rx_dropped += 1;
                    self.state.rx_len = None;
                }
                Delivery::NoBuffers => {
                    self.state.rx_len = Some(len);
                    break;
                }
            }
        }
        used
    }

    /// Watches the socket for what the device can act on now.
    fn update_interest(&mut self) {
        let mut wanted = EventSet::empty();
        if self.state.rx_len.is_none() {
            wanted |= EventSet::IN;
        }
        if self.state.tx_len.is_some() {
            wanted |= EventSet::OUT;
        }
        self.link.set_interest(wanted);
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_NET_F_MAC
            | 1 << VIRTIO_NET_F_MTU
            | 1 << VIRTIO_NET_F_STATUS
            | 1 << VIRTIO_NET_F_MRG_RXBUF
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features;
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 2]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn process_queue(&mut self, index: usize, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        let used = match index {
            TX_QUEUE => self.process_tx(queues, mem),
            // New rx buffers: the waiting frame, and what netd sent meanwhile.
            RX_QUEUE => self.process_rx(queues, mem),
            _ => UsedQueues::NONE,
        };
        self.update_interest();
        used
    }

    fn event_fd(&self) -> Option<RawFd> {
        Some(self.link.epoll_fd())
    }

    fn handle_event(&mut self, queues: &mut [Queue], mem: &GuestMemory) -> UsedQueues {
        self.link.poll();
        // Room in the socket: the waiting tx frame and the chains behind it.
        let mut used = if self.state.tx_len.is_some() { self.process_tx(queues, mem) } else { UsedQueues::NONE };
        used = used.union(self.process_rx(queues, mem));
        self.update_interest();
        used
    }

    fn reset(&mut self) {
        self.state.clear();
        self.acked = 0;
        self.update_interest();
    }

    /// Everything but the acked features and the queues is rebuilt by whoever makes the device
    /// again: its link (a restored guest's is a new one, to its own netd) and its config (MAC
    /// and MTU, the same for every sandbox). The frame waiting in each direction is not carried:
    /// a clone loses at most one frame each way, as a dropped packet on a wire (its chain was
    /// already returned to the guest, or its buffers are posted again by the kick).
    fn snapshot_support(&self) -> Result<(), &'static str> {
        Ok(())
    }
}

//! The device's mutable state apart from the queues: the frame (at most
//! one) waiting in each direction, and the counters.

/// Frame and error counters of one device (for metrics and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetCounters {
    /// Frames (and their bytes, without the virtio header) passed to netd.
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Guest frames not passed on: too large, link down, malformed chain.
    pub tx_dropped: u64,
    /// Frames (and bytes) delivered into the guest's rx buffers.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// netd frames not delivered: larger than the MTU allows, or than the
    /// guest's buffers can hold.
    pub rx_dropped: u64,
    /// Chains returned unused because they were malformed (either queue).
    pub bad_chains: u64,
}

/// The frames in flight and their buffers (allocated once, at the largest
/// frame size).
pub(super) struct State {
    /// netd's frame waiting for guest rx buffers: `rx_buf[..len]`.
    pub rx_buf: Vec<u8>,
    pub rx_len: Option<usize>,
    /// The guest's frame waiting for room in the socket: `tx_buf[..len]`.
    pub tx_buf: Vec<u8>,
    pub tx_len: Option<usize>,
    pub counters: NetCounters,
}

impl State {
    /// Buffers for frames of up to `max_frame` bytes (rx one more, to tell
    /// an oversized frame from one that fits exactly).
    pub fn new(max_frame: usize) -> Self {
        Self {
            rx_buf: vec![0; max_frame + 1],
            rx_len: None,
            tx_buf: vec![0; max_frame],
            tx_len: None,
            counters: NetCounters::default(),
        }
    }

    /// Drops the frames in flight (device reset); counters stay.
    pub fn clear(&mut self) {
        self.rx_len = None;
        self.tx_len = None;
    }
}

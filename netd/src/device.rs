//! The link as a smoltcp [`Device`]: frames the stack decided smoltcp should
//! see (ARP for netd's addresses, TCP of spliced flows, held SYNs) are queued
//! here, and smoltcp's output goes straight to the link.
//!
//! Frame buffers are pooled: a burst allocates a few, steady state none.
//!
//! Backpressure: when the link cannot take a frame (its peer reads slower
//! than netd writes), that frame is kept and the link is *full*: smoltcp gets
//! no transmit token (its data waits in the sockets' buffers instead of being
//! dropped and retransmitted), and frames netd builds itself are dropped,
//! until the link is writable again ([`Device::writable`]).
use std::collections::VecDeque;
use std::io;

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use crate::link::{Link, MAX_FRAME};

/// Frames queued for smoltcp at most (one link read batch).
pub const RX_QUEUE: usize = 64;
/// Idle frame buffers kept for reuse.
const POOL: usize = 16;

pub struct Device {
    link: Link,
    rx: VecDeque<(Vec<u8>, usize)>,
    pool: Vec<Vec<u8>>,
    tx: Vec<u8>,
    mtu: usize,
    /// The link refused a frame, kept in `stash` (if `stashed`).
    full: bool,
    stash: Vec<u8>,
    stashed: bool,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    /// A link write error smoltcp's token could not return.
    pub error: Option<io::Error>,
}

impl Device {
    /// `mtu` is the largest Ethernet frame (header included) netd sends.
    pub fn new(link: Link, mtu: usize) -> Device {
        Device {
            link,
            rx: VecDeque::with_capacity(RX_QUEUE),
            pool: Vec::new(),
            tx: Vec::new(),
            mtu,
            full: false,
            stash: Vec::new(),
            stashed: false,
            tx_bytes: 0,
            tx_dropped: 0,
            error: None,
        }
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// A frame buffer of [`MAX_FRAME`] bytes.
    pub fn buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| vec![0; MAX_FRAME])
    }

    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < POOL {
            self.pool.push(buf);
        }
    }

    /// Queues a frame for smoltcp; false (and the buffer recycled) when full.
    pub fn push_rx(&mut self, buf: Vec<u8>, len: usize) -> bool {
        if self.rx.len() >= RX_QUEUE {
            self.recycle(buf);
            return false;
        }
        self.rx.push_back((buf, len));
        true
    }

    /// Whether the link refused a frame and smoltcp is held back.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// Whether a refused frame waits to be sent again.
    pub fn is_stashed(&self) -> bool {
        self.stashed
    }

    /// Frames queued for smoltcp.
    pub fn rx_queued(&self) -> usize {
        self.rx.len()
    }

    pub fn rx_full(&self) -> bool {
        self.rx.len() >= RX_QUEUE
    }

    /// Sends a frame netd built itself (dropped while the link is full).
    pub fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.full {
            self.tx_dropped += 1;
            return Ok(());
        }
        if self.link.send(frame)? {
            self.tx_bytes += frame.len() as u64;
        } else {
            self.keep(frame);
        }
        Ok(())
    }

    fn keep(&mut self, frame: &[u8]) {
        self.stash.clear();
        self.stash.extend_from_slice(frame);
        self.stashed = true;
        self.full = true;
    }

    /// The link reported room: sends the kept frame, and lets smoltcp transmit again.
    pub fn writable(&mut self) -> io::Result<()> {
        if self.stashed {
            if !self.link.send(&self.stash)? {
                return Ok(());
            }
            self.tx_bytes += self.stash.len() as u64;
            self.stashed = false;
        }
        self.full = false;
        Ok(())
    }
}

pub struct RxToken<'a> {
    buf: Vec<u8>,
    len: usize,
    pool: &'a mut Vec<Vec<u8>>,
}

pub struct TxToken<'a> {
    link: &'a Link,
    tx: &'a mut Vec<u8>,
    full: &'a mut bool,
    stash: &'a mut Vec<u8>,
    stashed: &'a mut bool,
    tx_bytes: &'a mut u64,
    tx_dropped: &'a mut u64,
    error: &'a mut Option<io::Error>,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let r = f(&self.buf[..self.len]);
        if self.pool.len() < POOL {
            self.pool.push(self.buf);
        }
        r
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.tx.resize(len, 0);
        let r = f(&mut self.tx[..len]);
        if *self.full {
            // Only a receive token's reply can get here while full (ARP, RST).
            *self.tx_dropped += 1;
            return r;
        }
        match self.link.send(&self.tx[..len]) {
            Ok(true) => *self.tx_bytes += len as u64,
            Ok(false) => {
                std::mem::swap(self.stash, self.tx);
                *self.stashed = true;
                *self.full = true;
            }
            Err(e) => *self.error = Some(e),
        }
        r
    }
}

impl phy::Device for Device {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        let (buf, len) = self.rx.pop_front()?;
        let Device { link, pool, tx, full, stash, stashed, tx_bytes, tx_dropped, error, .. } = self;
        Some((RxToken { buf, len, pool }, TxToken { link, tx, full, stash, stashed, tx_bytes, tx_dropped, error }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        if self.full {
            return None;
        }
        let Device { link, tx, full, stash, stashed, tx_bytes, tx_dropped, error, .. } = self;
        Some(TxToken { link, tx, full, stash, stashed, tx_bytes, tx_dropped, error })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu;
        caps.max_burst_size = None;
        caps
    }
}

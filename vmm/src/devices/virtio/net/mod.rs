//! virtio-net (device id 1) whose wire is a `SOCK_SEQPACKET` socket to the
//! sandbox's network process (`pvisor-netd`): one Ethernet frame per message.
//!
//! The device never reaches the network itself: it reads and writes the one
//! socket it was given (`recvfrom`/`sendto` on an fd; no `socket`, no
//! `connect`), so a compromised VMM gains no network access from it.
//!
//! * Features: VERSION_1, MAC (the sandbox's fixed address), MTU, STATUS
//!   (link always up), MRG_RXBUF, INDIRECT_DESC. No control queue, no
//!   checksum or segmentation offload: the guest sends complete frames with
//!   checksums filled in, which is what netd's user-space stack expects.
//! * Header: with VERSION_1 the `virtio_net_hdr` is always 12 bytes. It is
//!   stripped from every tx frame (its content is ignored: no offload was
//!   offered) and a zero header (with `num_buffers`) prepended on rx.
//! * MTU: chosen by the caller (the worker uses 65520, as the ns backend's
//!   tap): fewer, larger frames through netd. A frame that large fits the
//!   guest's rx buffers because of MRG_RXBUF (a frame spans several buffers,
//!   counted in `num_buffers`); a driver that does not take MRG_RXBUF must
//!   post chains holding a whole frame (Linux does, "big packets"), and a
//!   frame its chain cannot hold is dropped, the chain kept for the next.
//! * Flow control: at most one frame waits in each direction. Host to
//!   guest: while the guest has no rx buffers the waiting frame stays in the
//!   device and the socket is not read (netd's writes then block or fail
//!   with EAGAIN: its problem, not the guest's). Guest to host: while the
//!   socket is full the device stops taking tx chains, so the guest's tx
//!   ring fills and its stack stops sending; it resumes when the socket
//!   drains. Frames larger than the MTU allows are dropped and counted.
//! * A malformed chain (outside guest memory, no header, nothing writable)
//!   is returned to the guest used with length 0 and counted; never a panic.
//! * When netd goes away (EOF, error), the link is down: tx frames are
//!   dropped (the guest keeps running), nothing arrives on rx.
//!
//! Files: `device` (the [`VirtioDevice`](super::VirtioDevice)), `link` (the
//! socket and its readiness), `rx`, `tx` (queue handling), `state`
//! (counters and the frames in flight).

mod device;
mod link;
mod rx;
mod state;
mod tx;

pub use device::Net;
pub use state::NetCounters;

/// Queue indices (no control queue).
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Length of `virtio_net_hdr_mrg_rxbuf`, the header of every frame under VERSION_1.
pub const HDR_LEN: usize = 12;
/// Ethernet header plus one VLAN tag: a frame is at most MTU + this.
pub const ETH_OVERHEAD: usize = 18;
/// Smallest MTU the device accepts (IPv4's minimum datagram, 576, and
/// Linux's 68 both fit; anything below is a configuration error).
pub const MIN_MTU: u16 = 68;

/// Errors of the net device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the link fd is not a SOCK_SEQPACKET socket (type {0})")]
    NotSeqpacket(i32),
    #[error("inspecting the link fd: {0}")]
    Link(#[source] std::io::Error),
    #[error("MTU {0} is below the minimum of {MIN_MTU}")]
    Mtu(u16),
    #[error("creating the device's epoll: {0}")]
    Setup(#[source] std::io::Error),
    #[error("descriptor chain outside guest memory: {0}")]
    Chain(#[source] virtio_queue::Error),
    #[error("tx chain of {0} bytes has no complete virtio-net header")]
    ShortHeader(usize),
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("guest memory: {0}")]
    Guest(#[source] std::io::Error),
}

#[cfg(test)]
mod tests;

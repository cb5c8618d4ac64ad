//! virtio-vsock (device id 19, stream sockets) with a user-space back-end
//! whose host side is Unix sockets, in the manner of Firecracker:
//!
//! * a guest connection to port `P` connects to the Unix socket
//!   `<uds_path>_P` (RST if nothing listens there);
//! * a host peer connects to the listener at `<uds_path>`, writes
//!   `CONNECT <port>\n`, reads `OK <host_port>\n` once the guest accepted,
//!   then exchanges raw bytes;
//! * in process, [`VsockHandle::connect`] returns one end of a socketpair
//!   whose other end the back-end drives (the worker reaches the guest agent
//!   this way, with no socket in the filesystem).
//!
//! Flow control is the virtio credit scheme in both directions: the device
//! never sends the guest more than its advertised `buf_alloc - (rx_cnt -
//! fwd_cnt)`, host data waits in its socket while the guest has no credit
//! or no rx buffers, and guest data the host is slow to read is buffered up
//! to the credit the device advertised ([`BUF_ALLOC`]).
//!
//! Files: [`packet`] (header, chain parsing), `connection` (one stream's
//! state and credit), `muxer` (the connection table and host sockets),
//! `device` (the [`VirtioDevice`](super::VirtioDevice)), `handle`.

mod connection;
mod device;
mod handle;
mod muxer;
pub mod packet;

pub use device::Vsock;
pub use handle::VsockHandle;

/// The host's CID (VMADDR_CID_HOST).
pub const HOST_CID: u64 = 2;
/// Queue indices.
pub const RX_QUEUE: usize = 0;
pub const TX_QUEUE: usize = 1;
pub const EVENT_QUEUE: usize = 2;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of guest data the device buffers per connection (its advertised
/// `buf_alloc`).
pub const BUF_ALLOC: u32 = 256 * 1024;
/// At most this many connections at once; more are refused with RST.
pub const MAX_CONNECTIONS: usize = 512;
/// At most this many host connections may be waiting to send `CONNECT`.
pub const MAX_PENDING_ACCEPTS: usize = 64;
/// At most this many control packets wait for rx buffers; beyond, RSTs to
/// unknown connections are dropped.
pub const MAX_CONTROL_PACKETS: usize = 4096;

/// Errors of the vsock device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("descriptor chain: {0}")]
    Chain(#[source] virtio_queue::Error),
    #[error("packet header missing or short")]
    ShortHeader,
    #[error("payload of {0} bytes exceeds the maximum")]
    PayloadTooLarge(u32),
    #[error("packet declares {declared} payload bytes, chain holds {present}")]
    ShortPayload { declared: u32, present: usize },
    #[error("rx chain cannot hold a packet header")]
    RxChainTooSmall,
    #[error("guest memory: {0}")]
    Guest(#[source] std::io::Error),
    #[error("creating the back-end's epoll or eventfd: {0}")]
    Setup(#[source] std::io::Error),
    #[error("binding the host listener {path}: {source}")]
    Listen {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;

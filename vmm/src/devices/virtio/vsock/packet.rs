//! The virtio-vsock packet header (`struct virtio_vsock_hdr`, 44 bytes,
//! little-endian) and moving packets out of tx chains and into rx chains.
//! Every access goes through virtio-queue's bounds-checked `Reader` and
//! `Writer`, so a malformed chain is an error, never a panic.

use std::io::{Read, Write};

use virtio_queue::{DescriptorChain, Reader, Writer};

use super::Error;
use crate::devices::virtio::GuestMemory;

/// Size of the header on the wire.
pub const HEADER_LEN: usize = 44;
/// Largest payload the device accepts from the guest in one packet (Linux
/// sends at most 64 KiB).
pub const MAX_PAYLOAD: u32 = 64 * 1024;

/// `type`: stream socket, the only one served.
pub const TYPE_STREAM: u16 = 1;

/// Operations.
pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flags: the sender will receive no more / send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// A packet header.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub kind: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

fn u32_at(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

impl Header {
    /// Decodes the wire form.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Self {
        Self {
            src_cid: u64_at(b, 0),
            dst_cid: u64_at(b, 8),
            src_port: u32_at(b, 16),
            dst_port: u32_at(b, 20),
            len: u32_at(b, 24),
            kind: u16::from_le_bytes([b[28], b[29]]),
            op: u16::from_le_bytes([b[30], b[31]]),
            flags: u32_at(b, 32),
            buf_alloc: u32_at(b, 36),
            fwd_cnt: u32_at(b, 40),
        }
    }

    /// Encodes the wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// Reads a guest packet (header and payload) from a tx chain. The payload
/// is appended to `payload` (cleared first).
pub fn read_tx(
    chain: DescriptorChain<&GuestMemory>,
    mem: &GuestMemory,
    payload: &mut Vec<u8>,
) -> Result<Header, Error> {
    payload.clear();
    let mut reader = Reader::new(mem, chain).map_err(Error::Chain)?;
    let mut raw = [0u8; HEADER_LEN];
    reader.read_exact(&mut raw).map_err(|_| Error::ShortHeader)?;
    let header = Header::decode(&raw);
    if header.len > MAX_PAYLOAD {
        return Err(Error::PayloadTooLarge(header.len));
    }
    if header.op == OP_RW {
        let len = header.len as usize;
        if reader.available_bytes() < len {
            return Err(Error::ShortPayload { declared: header.len, present: reader.available_bytes() });
        }
        payload.resize(len, 0);
        reader.read_exact(payload).map_err(|_| Error::ShortHeader)?;
    }
    Ok(header)
}

/// Room for payload in an rx chain, or an error if it cannot even hold a header.
pub fn rx_capacity(writer: &Writer<'_>) -> Result<usize, Error> {
    writer.available_bytes().checked_sub(HEADER_LEN).ok_or(Error::RxChainTooSmall)
}

/// Writes `header` (whose `len` must equal `payload.len()`) and `payload`
/// into an rx chain; returns the bytes written.
pub fn write_rx(writer: &mut Writer<'_>, header: &Header, payload: &[u8]) -> Result<u32, Error> {
    writer.write_all(&header.encode()).map_err(Error::Guest)?;
    writer.write_all(payload).map_err(Error::Guest)?;
    u32::try_from(writer.bytes_written()).map_err(|_| Error::RxChainTooSmall)
}

/// Writes an event (`struct virtio_vsock_event`) into an event-queue chain; returns the bytes
/// written. A chain too small for it is an error (nothing is written).
pub fn write_event(chain: DescriptorChain<&GuestMemory>, mem: &GuestMemory, event: &[u8; 4]) -> Result<u32, Error> {
    let mut writer = Writer::new(mem, chain).map_err(Error::Chain)?;
    if writer.available_bytes() < event.len() {
        return Err(Error::RxChainTooSmall);
    }
    writer.write_all(event).map_err(Error::Guest)?;
    Ok(event.len() as u32)
}

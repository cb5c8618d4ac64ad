//! One virtio-blk request: parse the chain (16-byte header in the readable
//! part, data, and a status byte as the last writable byte), run it on the
//! backend and write the status.

use std::io::{self, Read, Write};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_queue::{DescriptorChain, Reader, Writer};

use super::{BlockBackend, MAX_DISCARD_SECTORS, MAX_DISCARD_SEGMENTS, SECTOR_SIZE};
use crate::devices::virtio::GuestMemory;

/// Size of `struct virtio_blk_outhdr`.
const HEADER_LEN: usize = 16;
/// Data moves through a bounce buffer of at most this many bytes at a time.
const CHUNK: usize = 64 * 1024;
/// Size of `struct virtio_blk_discard_write_zeroes`.
const SEGMENT_LEN: usize = 16;
/// Its `flags` bit: the device may unmap (allowed for WRITE_ZEROES only).
const SEGMENT_F_UNMAP: u32 = 1;

/// Why a request failed (answered IOERR or UNSUPP).
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    #[error("request header missing or short")]
    ShortHeader,
    #[error("request of {len} bytes at byte {offset} is outside the disk")]
    OutOfRange { offset: u64, len: u64 },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("unsupported request type {0}")]
    Unsupported(u32),
    #[error("malformed discard/write-zeroes segments")]
    BadSegments,
    #[error("backend: {0}")]
    Backend(#[source] io::Error),
    #[error("guest memory: {0}")]
    Guest(#[source] io::Error),
}

impl RequestError {
    fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported(_) => VIRTIO_BLK_S_UNSUPP as u8,
            _ => VIRTIO_BLK_S_IOERR as u8,
        }
    }
}

/// Serves one request; returns the number of bytes written into the
/// chain's writable part (the used length), 0 if the chain had no room for
/// even the status byte.
pub(super) fn serve(
    chain: DescriptorChain<&GuestMemory>,
    mem: &GuestMemory,
    disk: &dyn BlockBackend,
    id: &[u8],
    buf: &mut Vec<u8>,
) -> u32 {
    let (Ok(mut reader), Ok(mut writer)) = (Reader::new(mem, chain.clone()), Writer::new(mem, chain)) else {
        tracing::debug!("virtio-blk: chain points outside guest memory");
        return 0;
    };
    let Some(data_len) = writer.available_bytes().checked_sub(1) else {
        tracing::debug!("virtio-blk: chain without a status byte");
        return 0;
    };
    let Ok(mut status_writer) = writer.split_at(data_len) else {
        return 0;
    };
    let status = match run(&mut reader, &mut writer, disk, id, buf) {
        Ok(()) => VIRTIO_BLK_S_OK as u8,
        Err(e) => {
            tracing::debug!("virtio-blk: {e}");
            e.status()
        }
    };
    if status_writer.write_all(&[status]).is_err() {
        return 0;
    }
    u32::try_from(writer.bytes_written() + 1).unwrap_or(u32::MAX)
}

fn run(
    reader: &mut Reader<'_>,
    writer: &mut Writer<'_>,
    disk: &dyn BlockBackend,
    id: &[u8],
    buf: &mut Vec<u8>,
) -> Result<(), RequestError> {
    let mut header = [0u8; HEADER_LEN];
    reader.read_exact(&mut header).map_err(|_| RequestError::ShortHeader)?;
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector_bytes = [0u8; 8];
    sector_bytes.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector_bytes);
    match kind {
        VIRTIO_BLK_T_IN => {
            let len = writer.available_bytes() as u64;
            let offset = checked_range(disk, sector, len)?;
            read_into_guest(disk, offset, len, writer, buf)
        }
        VIRTIO_BLK_T_OUT => {
            if disk.read_only() {
                return Err(RequestError::ReadOnly);
            }
            let len = reader.available_bytes() as u64;
            let offset = checked_range(disk, sector, len)?;
            write_from_guest(disk, offset, len, reader, buf)
        }
        VIRTIO_BLK_T_FLUSH => disk.flush().map_err(RequestError::Backend),
        VIRTIO_BLK_T_GET_ID => {
            let n = id.len().min(writer.available_bytes());
            writer.write_all(&id[..n]).map_err(RequestError::Guest)
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES if disk.can_discard() => {
            discard(reader, disk, kind == VIRTIO_BLK_T_WRITE_ZEROES)
        }
        other => Err(RequestError::Unsupported(other)),
    }
}

/// DISCARD and WRITE_ZEROES: both drop the ranges (they read back as
/// zeros). All segments are checked before any is applied.
fn discard(reader: &mut Reader<'_>, disk: &dyn BlockBackend, write_zeroes: bool) -> Result<(), RequestError> {
    let count = reader.available_bytes() / SEGMENT_LEN;
    if count == 0 || count > MAX_DISCARD_SEGMENTS as usize || count * SEGMENT_LEN != reader.available_bytes() {
        return Err(RequestError::BadSegments);
    }
    let mut ranges = Vec::with_capacity(count);
    for _ in 0..count {
        let mut raw = [0u8; SEGMENT_LEN];
        reader.read_exact(&mut raw).map_err(RequestError::Guest)?;
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&raw[0..8]);
        let sector = u64::from_le_bytes(sector);
        let sectors = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
        let flags = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
        if sectors > MAX_DISCARD_SECTORS || flags & !SEGMENT_F_UNMAP != 0 {
            return Err(RequestError::BadSegments);
        }
        if !write_zeroes && flags != 0 {
            return Err(RequestError::Unsupported(VIRTIO_BLK_T_DISCARD));
        }
        let len = u64::from(sectors) * SECTOR_SIZE;
        ranges.push((checked_range(disk, sector, len)?, len));
    }
    for (offset, len) in ranges {
        disk.discard(offset, len).map_err(RequestError::Backend)?;
    }
    Ok(())
}

/// The byte offset of `sector` if `len` bytes from there lie on the disk.
fn checked_range(disk: &dyn BlockBackend, sector: u64, len: u64) -> Result<u64, RequestError> {
    let offset = sector.checked_mul(SECTOR_SIZE);
    match offset.and_then(|o| o.checked_add(len).map(|end| (o, end))) {
        Some((offset, end)) if end <= disk.len() => Ok(offset),
        _ => Err(RequestError::OutOfRange { offset: offset.unwrap_or(u64::MAX), len }),
    }
}

fn read_into_guest(
    disk: &dyn BlockBackend,
    mut offset: u64,
    len: u64,
    writer: &mut Writer<'_>,
    buf: &mut Vec<u8>,
) -> Result<(), RequestError> {
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        buf.resize(n, 0);
        let mut done = 0;
        while done < n {
            match disk.read_at(offset + done as u64, &mut buf[done..n]) {
                Ok(0) => return Err(RequestError::Backend(io::ErrorKind::UnexpectedEof.into())),
                Ok(k) => done += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RequestError::Backend(e)),
            }
        }
        writer.write_all(&buf[..n]).map_err(RequestError::Guest)?;
        offset += n as u64;
        left -= n as u64;
    }
    Ok(())
}

fn write_from_guest(
    disk: &dyn BlockBackend,
    mut offset: u64,
    len: u64,
    reader: &mut Reader<'_>,
    buf: &mut Vec<u8>,
) -> Result<(), RequestError> {
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        buf.resize(n, 0);
        reader.read_exact(&mut buf[..n]).map_err(RequestError::Guest)?;
        let mut done = 0;
        while done < n {
            match disk.write_at(offset + done as u64, &buf[done..n]) {
                Ok(0) => return Err(RequestError::Backend(io::ErrorKind::WriteZero.into())),
                Ok(k) => done += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RequestError::Backend(e)),
            }
        }
        offset += n as u64;
        left -= n as u64;
    }
    Ok(())
}

//! Guest to host: one tx chain is a 12-byte `virtio_net_hdr` and one
//! Ethernet frame, in the chain's readable part (any layout).

use std::io::Read;

use virtio_queue::{DescriptorChain, Reader};

use super::{Error, HDR_LEN};
use crate::devices::virtio::GuestMemory;

/// Copies the frame of `chain` (the header stripped) into `buf`, which holds
/// the largest frame allowed; returns its length.
pub(super) fn read_frame(
    chain: DescriptorChain<&GuestMemory>,
    mem: &GuestMemory,
    buf: &mut [u8],
) -> Result<usize, Error> {
    let mut reader = Reader::new(mem, chain).map_err(Error::Chain)?;
    let total = reader.available_bytes();
    let len = total.checked_sub(HDR_LEN).ok_or(Error::ShortHeader(total))?;
    if len > buf.len() {
        return Err(Error::FrameTooLarge { len, max: buf.len() });
    }
    // No offload was offered, so the header carries nothing to act on.
    let mut header = [0u8; HDR_LEN];
    reader.read_exact(&mut header).map_err(Error::Guest)?;
    reader.read_exact(&mut buf[..len]).map_err(Error::Guest)?;
    Ok(len)
}

//! The clone-identity device: where a guest learns that it was restored from a snapshot, and
//! gets fresh randomness and the wall clock for its new life (in the spirit of ACPI's VM
//! Generation ID, which a microVM without ACPI cannot offer).
//!
//! A read-only MMIO window at [`layout::CLONE_ID_START`](crate::layout::CLONE_ID_START),
//! little-endian, any access size within the block:
//!
//! ```text
//! 0x00  u64  magic "PVCLONE1"
//! 0x08  u64  generation: 0 at boot, the snapshot's generation + 1 in each restored VM
//! 0x10  [u8; 32]  seed: fresh host randomness (getrandom) at boot and at every restore
//! 0x30  u64  host wall clock (Unix ns) when the VM was built or restored
//! ```
//!
//! Every clone of one snapshot has the same generation and its own seed. A guest polls the
//! generation (cheap: one MMIO exit) and, when it changes, reseeds its random number generator
//! with the seed and steps its wall clock; a pvisor agent would do this before running the next
//! command. Writes are ignored.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::bus::BusDevice;

/// Size of the MMIO window.
pub const WINDOW_LEN: u64 = 0x1000;
/// "PVCLONE1", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PVCLONE1");
/// Offset of the generation counter.
pub const GENERATION: u64 = 0x08;
/// Offset of the 32-byte seed.
pub const SEED: u64 = 0x10;
/// Offset of the wall clock at build or restore.
pub const WALL_CLOCK_NS: u64 = 0x30;
const BLOCK_LEN: usize = 0x38;

/// Errors of [`CloneId::new`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host gave no randomness.
    #[error("reading fresh randomness for the clone seed: {0}")]
    Random(#[source] std::io::Error),
}

/// The device.
#[derive(Debug, Clone)]
pub struct CloneId {
    generation: u64,
    seed: [u8; 32],
    wall_clock_ns: u64,
}

/// Fills `buf` from the kernel's CSPRNG.
fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`, a live buffer.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

impl CloneId {
    /// The device of a VM at `generation` (0 for a booted VM), with a fresh seed and the
    /// current wall clock.
    pub fn new(generation: u64) -> Result<Self, Error> {
        let mut seed = [0u8; 32];
        getrandom(&mut seed).map_err(Error::Random)?;
        let wall_clock_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        Ok(CloneId { generation, seed, wall_clock_ns })
    }

    /// The generation the guest sees.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The seed the guest sees.
    pub fn seed(&self) -> [u8; 32] {
        self.seed
    }

    fn block(&self) -> [u8; BLOCK_LEN] {
        let mut b = [0u8; BLOCK_LEN];
        b[..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..48].copy_from_slice(&self.seed);
        b[48..56].copy_from_slice(&self.wall_clock_ns.to_le_bytes());
        b
    }
}

impl BusDevice for CloneId {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let block = self.block();
        let Ok(start) = usize::try_from(offset) else { return };
        if let Some(src) = block.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_u64(dev: &mut CloneId, offset: u64) -> u64 {
        let mut b = [0u8; 8];
        dev.read(offset, &mut b);
        u64::from_le_bytes(b)
    }

    #[test]
    fn the_registers_read_back_and_each_device_has_its_own_seed() {
        let mut a = CloneId::new(3).unwrap();
        let mut b = CloneId::new(3).unwrap();
        assert_eq!(read_u64(&mut a, 0), MAGIC);
        assert_eq!(read_u64(&mut a, GENERATION), 3);
        let mut seed = [0u8; 32];
        a.read(SEED, &mut seed);
        assert_eq!(seed, a.seed());
        assert_ne!(a.seed(), b.seed(), "two devices drew the same 32 random bytes");
        assert!(read_u64(&mut b, WALL_CLOCK_NS) > 1_600_000_000_000_000_000);
        assert_eq!(read_u64(&mut a, 0x800), 0, "past the block reads zero");
        a.write(GENERATION, &[9; 8]);
        assert_eq!(read_u64(&mut a, GENERATION), 3, "writes are ignored");
    }
}

//! Address spaces (port I/O and MMIO) that vCPU exits are dispatched on.

/// A device reachable at a range of a bus. `offset` is relative to the
/// start of the range the device was inserted at.
pub trait BusDevice: Send {
    /// A guest read of `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

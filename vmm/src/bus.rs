//! Address spaces (port I/O and MMIO) that vCPU exits are dispatched on.
//!
//! A [`Bus`] holds devices at non-overlapping ranges. It is built before the vCPUs start and
//! then shared read-only between them (`Arc<Bus>`); each device has its own lock, so vCPUs
//! touching different devices do not contend.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device reachable at a range of a bus. `offset` is relative to the
/// start of the range the device was inserted at.
pub trait BusDevice: Send {
    /// A guest read of `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A device shared between the bus and whoever else drives it (e.g. an event loop).
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Errors of [`Bus::insert`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The range is empty or wraps around.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// Start.
        base: u64,
        /// Length.
        len: u64,
    },
    /// The range overlaps a device already on the bus.
    #[error("bus range {base:#x}+{len:#x} overlaps the device at {other:#x}")]
    Overlap {
        /// Start.
        base: u64,
        /// Length.
        len: u64,
        /// Start of the device it overlaps.
        other: u64,
    },
}

struct Entry {
    len: u64,
    device: SharedDevice,
}

/// Devices by address range.
#[derive(Default)]
pub struct Bus {
    devices: BTreeMap<u64, Entry>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Bus::default()
    }

    /// Puts `device` at `base..base + len`.
    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), Error> {
        let end = base.checked_add(len).filter(|_| len > 0).ok_or(Error::InvalidRange { base, len })?;
        // The closest device starting before `end` is the only one that can overlap.
        if let Some((&other, entry)) = self.devices.range(..end).next_back() {
            if other + entry.len > base {
                return Err(Error::Overlap { base, len, other });
            }
        }
        self.devices.insert(base, Entry { len, device });
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` in it.
    fn find(&self, addr: u64, size: usize) -> Option<(&SharedDevice, u64)> {
        let (&base, entry) = self.devices.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(size as u64)? <= entry.len).then_some((&entry.device, offset))
    }

    /// Dispatches a read; `false` (and `data` untouched) if no device covers the access.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                lock(device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; `false` if no device covers the access.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((device, offset)) => {
                lock(device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device, recovering it from a poisoned lock: a device whose handler panicked on
/// another vCPU still has consistent registers as far as the guest can tell, and refusing
/// every later access would hang the guest rather than fail it.
fn lock(device: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.writes.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn accesses_reach_the_device_with_relative_offsets() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new();
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fd, &mut data));
        assert_eq!(data, [5]);
        assert!(bus.write(0x3f8, b"x"));
        assert_eq!(dev.lock().unwrap().writes, vec![(0, vec![b'x'])]);
    }

    #[test]
    fn accesses_outside_or_across_devices_are_unclaimed() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x10, Arc::new(Mutex::new(Recorder::default()))).unwrap();
        let mut data = [0xaa; 4];
        assert!(!bus.read(0xfff, &mut data[..1]));
        assert!(!bus.read(0x1010, &mut data[..1]));
        assert!(!bus.read(0x100e, &mut data), "an access crossing the end is not the device's");
        assert_eq!(data, [0xaa; 4]);
        assert!(bus.read(0x100c, &mut data));
    }

    #[test]
    fn overlapping_ranges_are_refused() {
        let dev = || -> SharedDevice { Arc::new(Mutex::new(Recorder::default())) };
        let mut bus = Bus::new();
        bus.insert(0x100, 0x10, dev()).unwrap();
        assert!(matches!(bus.insert(0x10f, 1, dev()), Err(Error::Overlap { other: 0x100, .. })));
        assert!(matches!(bus.insert(0xf0, 0x11, dev()), Err(Error::Overlap { other: 0x100, .. })));
        assert!(matches!(bus.insert(0x0, 0, dev()), Err(Error::InvalidRange { .. })));
        assert!(matches!(bus.insert(u64::MAX, 2, dev()), Err(Error::InvalidRange { .. })));
        bus.insert(0xf0, 0x10, dev()).unwrap();
        bus.insert(0x110, 0x10, dev()).unwrap();
    }
}

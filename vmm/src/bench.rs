//! Timing helpers for `bench/`: not used by the VMM itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bus::BusDevice;
use crate::vm::{Error, VmBuilder, VmConfig};
use crate::VmExit;

/// The port [`FIRST_EXIT_GUEST`] writes first; the write's exit is timestamped.
pub const TIMESTAMP_PORT: u16 = 0x502;

/// A flat guest whose first instruction writes to [`TIMESTAMP_PORT`], then exits through the
/// debug exit port: `mov dx, 0x502; out dx, al; mov dx, 0x501; xor eax, eax; out dx, al; hlt`.
pub const FIRST_EXIT_GUEST: &[u8] = &[0x66, 0xba, 0x02, 0x05, 0xee, 0x66, 0xba, 0x01, 0x05, 0x31, 0xc0, 0xee, 0xf4];

/// Records when the guest first wrote its port.
struct Timestamp(Arc<Mutex<Option<Instant>>>);

impl BusDevice for Timestamp {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
    }
}

/// Time from opening `/dev/kvm` to the first exit of a guest that exits at its first
/// instruction: VM, `memory_bytes` of memfd RAM and its memory slot, irqchip, PIT, devices,
/// vCPU setup (CPUID, MSRs, registers), the vCPU thread's start and seccomp filter, and the
/// first `KVM_RUN` up to the exit's dispatch. Teardown is not included. `image` defaults to
/// [`FIRST_EXIT_GUEST`] and must write [`TIMESTAMP_PORT`] first. One sample; the benchmark
/// takes P50 over many.
pub fn time_to_first_exit(image: Option<&[u8]>, memory_bytes: u64) -> Result<Duration, Error> {
    let start = Instant::now();
    let stamp = Arc::new(Mutex::new(None));
    let mut builder = VmBuilder::new(VmConfig { memory_bytes, debug_exit: true, ..VmConfig::default() })?;
    builder.add_pio_device(TIMESTAMP_PORT, 1, Arc::new(Mutex::new(Timestamp(stamp.clone()))))?;
    builder.load_flat(image.unwrap_or(FIRST_EXIT_GUEST))?;
    let exit = builder.build()?.run();
    let first_exit = *stamp.lock().unwrap_or_else(|p| p.into_inner());
    match (exit, first_exit) {
        (VmExit::DebugExit(_), Some(at)) => Ok(at - start),
        _ => Err(Error::Config("the first-exit guest did not write the timestamp port and exit")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_first_exit_is_measured() {
        assert!(std::path::Path::new("/dev/kvm").exists(), "/dev/kvm is expected on these hosts");
        let elapsed = super::time_to_first_exit(None, 4 << 20).unwrap();
        assert!(elapsed > std::time::Duration::ZERO);
    }
}

//! Timing helpers for `bench/`: not used by the VMM itself.

use std::time::{Duration, Instant};

use crate::vm::{Error, VmBuilder, VmConfig};
use crate::VmExit;

/// A flat guest whose first instruction writes 0 to the debug exit port:
/// `mov dx, 0x501; xor eax, eax; out dx, al; hlt`.
pub const FIRST_EXIT_GUEST: &[u8] = &[0x66, 0xba, 0x01, 0x05, 0x31, 0xc0, 0xee, 0xf4];

/// Time from opening `/dev/kvm` to the end of a VM whose guest exits at its first
/// instruction (through the debug exit port): VM, memory, devices, vCPU setup, thread start,
/// the first `KVM_RUN` and its exit, and the teardown wait. `image` defaults to
/// [`FIRST_EXIT_GUEST`]. One sample; the benchmark takes P50 over many.
pub fn time_to_first_exit(image: Option<&[u8]>, memory_bytes: u64) -> Result<Duration, Error> {
    let start = Instant::now();
    let mut builder = VmBuilder::new(VmConfig { memory_bytes, debug_exit: true, ..VmConfig::default() })?;
    builder.load_flat(image.unwrap_or(FIRST_EXIT_GUEST))?;
    let exit = builder.build()?.run();
    let elapsed = start.elapsed();
    match exit {
        VmExit::DebugExit(_) => Ok(elapsed),
        _ => Err(Error::Config("the first-exit guest did not exit through the debug port")),
    }
}

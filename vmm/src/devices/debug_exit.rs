//! A port test guests write an exit code to, ending the VM as [`VmExit::DebugExit`].
//!
//! The same idea as QEMU's `isa-debug-exit` (and at its default port, 0x501). Only VMs built
//! with `VmConfig::debug_exit` have it; a sandbox's VM does not.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::exit::{ExitLatch, VmExit};

/// The port.
pub const DEBUG_EXIT_PORT: u64 = 0x501;

/// The debug exit device.
pub struct DebugExit {
    exit: Arc<ExitLatch>,
}

impl DebugExit {
    /// A device that ends the VM through `exit`.
    pub fn new(exit: Arc<ExitLatch>) -> Self {
        DebugExit { exit }
    }
}

impl BusDevice for DebugExit {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if let Some(&code) = data.first() {
            self.exit.request(VmExit::DebugExit(code));
        }
    }
}

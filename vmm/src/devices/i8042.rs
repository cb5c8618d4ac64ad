//! Just enough of the i8042 keyboard controller for a guest to reset the machine.
//!
//! Linux's `reboot=k` (and the fallback of other reboot methods) writes command `0xfe` (pulse
//! the reset line) to port 0x64; that request ends the VM as [`VmExit::Reset`]. Reads of the
//! status and data ports return 0 (no data, input buffer empty), so probing drivers give up.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::exit::{ExitLatch, VmExit};

/// The data port.
pub const DATA_PORT: u64 = 0x60;
/// The command/status port.
pub const COMMAND_PORT: u64 = 0x64;
/// Command: pulse the CPU reset line.
const CMD_RESET_CPU: u8 = 0xfe;

/// The controller; insert it at [`DATA_PORT`] with length 5 (covers 0x60..=0x64).
pub struct I8042 {
    exit: Arc<ExitLatch>,
}

impl I8042 {
    /// A controller that requests a reset through `exit`.
    pub fn new(exit: Arc<ExitLatch>) -> Self {
        I8042 { exit }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == COMMAND_PORT - DATA_PORT && data.first() == Some(&CMD_RESET_CPU) {
            self.exit.request(VmExit::Reset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_0xfe_requests_a_reset() {
        let latch = Arc::new(ExitLatch::new());
        let mut dev = I8042::new(latch.clone());
        dev.write(0, &[CMD_RESET_CPU]);
        dev.write(4, &[0x20]);
        assert!(!latch.is_set(), "only 0xfe on the command port resets");
        dev.write(4, &[CMD_RESET_CPU]);
        assert_eq!(latch.wait(), VmExit::Reset);
    }
}

//! The 16550 UART on COM1 (port 0x3f8, IRQ 4), from `vm-superio`.
//!
//! Output goes to the bounded [`ConsoleLog`](super::console::ConsoleLog); interrupts (THR
//! empty, received data) reach the guest through an irqfd on GSI 4, so raising one is a
//! `write` to an eventfd and needs no ioctl on the vCPU thread.

use std::io;

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::console::{ConsoleWriter, SharedConsole};
use crate::bus::BusDevice;

/// COM1's base port.
pub const COM1_PORT: u64 = 0x3f8;
/// COM1's port range.
pub const COM1_LEN: u64 = 8;
/// COM1's interrupt line.
pub const COM1_GSI: u32 = 4;

/// An eventfd that raises an interrupt when written (registered as an irqfd).
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// The serial device on the PIO bus.
pub struct Serial {
    uart: Uart<IrqTrigger, vm_superio::serial::NoEvents, ConsoleWriter>,
}

/// vm-superio's `SerialState` (which has no serde of its own), declared once for serde's
/// `remote` derive: the field names are the snapshot format's.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SerialState")]
struct SerialStateDef {
    baud_divisor_low: u8,
    baud_divisor_high: u8,
    interrupt_enable: u8,
    interrupt_identification: u8,
    line_control: u8,
    line_status: u8,
    modem_control: u8,
    modem_status: u8,
    scratch: u8,
    in_buffer: Vec<u8>,
}

/// The UART's registers and unread input, for snapshots (serialized as the bare fields of
/// [`SerialStateDef`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UartState(#[serde(with = "SerialStateDef")] SerialState);

impl From<SerialState> for UartState {
    fn from(s: SerialState) -> Self {
        UartState(s)
    }
}

impl Serial {
    /// A UART writing to `console`, interrupting through `irq`.
    pub fn new(console: SharedConsole, irq: EventFd) -> Self {
        Serial { uart: Uart::new(IrqTrigger(irq), ConsoleWriter(console)) }
    }

    /// A UART resumed from a snapshot's `state`.
    pub fn from_state(console: SharedConsole, irq: EventFd, state: &UartState) -> io::Result<Self> {
        let uart = Uart::from_state(&state.0, IrqTrigger(irq), vm_superio::serial::NoEvents, ConsoleWriter(console))
            .map_err(|e| io::Error::other(format!("restoring the UART: {e:?}")))?;
        Ok(Serial { uart })
    }

    /// The UART's state, for a snapshot.
    pub fn state(&self) -> UartState {
        self.uart.state().into()
    }

    /// Queues bytes for the guest to read (console input).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.uart.enqueue_raw_bytes(bytes).map_err(|e| io::Error::other(format!("{e:?}")))
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // The UART's registers are bytes; a wider access reads the register and zero-extends.
        data.fill(0);
        if let (Some(first), Ok(offset)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(offset)) = (data.first(), u8::try_from(offset)) {
            // An error here is the console writer's or the irqfd's; neither is the guest's
            // to see, and the console log is best effort.
            let _ = self.uart.write(offset, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::console::ConsoleLog;

    #[test]
    fn transmitted_bytes_reach_the_console_and_raise_the_irq_when_enabled() {
        let console = ConsoleLog::new(64).shared();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut serial = Serial::new(console.clone(), irq.try_clone().unwrap());
        for b in b"hi\n" {
            serial.write(0, &[*b]);
        }
        assert_eq!(console.lock().unwrap().contents(), b"hi\n");
        assert!(irq.read().is_err(), "no interrupt while IER is 0");
        serial.write(1, &[0x02]); // IER: THR empty
        serial.write(0, b"x");
        assert!(irq.read().unwrap() >= 1);
        let mut lsr = [0u8; 1];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "THR empty");
    }
}

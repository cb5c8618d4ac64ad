//! Device models. Each is independent of how the guest reaches it.
//!
//! * [`console`]: the bounded console log the serial port writes to.
//! * [`serial`]: a 16550 UART (`vm-superio`) on port 0x3f8, IRQ 4 through an irqfd.
//! * [`i8042`]: the keyboard controller's reset line (port 0x64, command 0xfe).
//! * [`debug_exit`]: a port test guests write an exit code to.
//! * [`clone_id`]: generation, fresh seed and wall clock of a VM restored from a snapshot.
//! * [`virtio`]: virtio devices and the virtio-mmio transport.
pub mod clone_id;
pub mod console;
pub mod debug_exit;
pub mod i8042;
pub mod serial;
pub mod virtio;

//! Register offsets and constants of virtio-mmio version 2 (virtio 1.2, 4.2.2).

/// "virt" in little-endian.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// The modern (non-legacy) layout.
pub const VERSION: u32 = 2;
/// Vendor id reported to the guest ("PVSR").
pub const VENDOR_ID: u32 = 0x5253_5650;

pub const MAGIC: u64 = 0x000;
pub const VERSION_REG: u64 = 0x004;
pub const DEVICE_ID: u64 = 0x008;
pub const VENDOR_ID_REG: u64 = 0x00c;
pub const DEVICE_FEATURES: u64 = 0x010;
pub const DEVICE_FEATURES_SEL: u64 = 0x014;
pub const DRIVER_FEATURES: u64 = 0x020;
pub const DRIVER_FEATURES_SEL: u64 = 0x024;
pub const QUEUE_SEL: u64 = 0x030;
pub const QUEUE_NUM_MAX: u64 = 0x034;
pub const QUEUE_NUM: u64 = 0x038;
pub const QUEUE_READY: u64 = 0x044;
pub const QUEUE_NOTIFY: u64 = 0x050;
pub const INTERRUPT_STATUS: u64 = 0x060;
pub const INTERRUPT_ACK: u64 = 0x064;
pub const STATUS: u64 = 0x070;
pub const QUEUE_DESC_LOW: u64 = 0x080;
pub const QUEUE_DESC_HIGH: u64 = 0x084;
pub const QUEUE_DRIVER_LOW: u64 = 0x090;
pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
pub const CONFIG_GENERATION: u64 = 0x0fc;
/// Start of the device-specific config space.
pub const CONFIG: u64 = 0x100;

/// InterruptStatus bit: a queue has new used buffers.
pub const INT_USED_BUFFER: u32 = 1;
/// InterruptStatus bit: the config space changed.
pub const INT_CONFIG_CHANGE: u32 = 2;

/// Device status bits (virtio 1.2, 2.1).
pub const STATUS_ACKNOWLEDGE: u32 = 1;
pub const STATUS_DRIVER: u32 = 2;
pub const STATUS_DRIVER_OK: u32 = 4;
pub const STATUS_FEATURES_OK: u32 = 8;
pub const STATUS_DEVICE_NEEDS_RESET: u32 = 64;
pub const STATUS_FAILED: u32 = 128;

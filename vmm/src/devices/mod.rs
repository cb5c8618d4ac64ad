//! Device models. Each is independent of how the guest reaches it.
pub mod virtio;

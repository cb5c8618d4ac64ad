//! Sandboxes as the broker sees them: records, the registry, launching a
//! worker, tearing one down and expiring them.
pub mod backend;
pub mod disk;
pub mod egress;
pub mod events;
pub mod expiry;
pub mod hooks;
pub mod images;
pub mod ksm;
pub mod launch;
pub mod net;
pub mod pool;
pub mod record;
pub mod registry;
pub mod requested;
pub mod rootfs;
pub mod teardown;
pub mod templates;
pub mod trees;
pub mod vm;

pub use record::{SandboxEntry, State};
pub use registry::Registry;

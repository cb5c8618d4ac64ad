//! Placeholder until the initramfs writer lands.
use std::path::Path;

pub fn agent_initramfs(_agent: &Path) -> std::io::Result<Vec<u8>> {
    Err(std::io::Error::other("the initramfs writer is not built yet"))
}

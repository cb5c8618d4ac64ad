//! Volumes on create (`volumes`): host paths under the operator's allowed
//! prefixes and pvisor-managed named volumes (`pvc`).
//!
//! * [`spec`]: parsing and validation, every refusal a 400 `VOLUME::…`
//!   before any state exists.
//! * [`store`]: named volumes under `<data>/volumes` (metadata, in-use locks).
//! * [`prepare`]: host paths made to exist, named volumes created and held;
//!   the worker's mount list (`NsConfig.volumes`).
//! * [`error`]: the error enum and its API codes.
//!
//! ns mounts them by fd (`pvisor_worker::ns::volumes`); the vm backend
//! refuses volumes with 400 `VOLUME::UNSUPPORTED_BACKEND` (virtiofs is the
//! planned seam there).
pub mod error;
pub mod prepare;
pub mod spec;
pub mod store;

pub use error::VolumeError;
pub use prepare::{prepare, Held};
pub use spec::{check, AllowedPrefix};
pub use store::Store;

/// The server's volume settings (`Ctx.volumes`).
pub struct Settings {
    /// `--allow-host-path` (empty: every host volume is refused).
    pub allowed: Vec<AllowedPrefix>,
    pub store: Store,
}

impl Settings {
    pub fn new(allow_host_paths: &[std::path::PathBuf], data_dir: &std::path::Path) -> Result<Self, String> {
        let allowed = allow_host_paths.iter().map(|p| AllowedPrefix::new(p)).collect::<Result<_, _>>()?;
        Ok(Settings { allowed, store: Store::new(data_dir) })
    }
}

//! JavaScript contexts: the image's `node` running `node/driver.js` (a
//! persistent `vm` context; see that file and `PROTOCOL.md`).
use super::driver::DriverSpec;
use super::error::Result;
use super::language::Language;
use crate::config::AgentConfig;

/// The driver's source, shipped inside the agent.
pub const DRIVER: &str = include_str!("node/driver.js");

pub fn driver_spec(cfg: &AgentConfig, cwd: &str) -> Result<DriverSpec> {
    let node = Language::JavaScript.interpreter(cfg)?;
    Ok(DriverSpec {
        argv: vec![node.to_string_lossy().into_owned(), "-e".into(), DRIVER.into()],
        envs: Default::default(),
        cwd: cwd.to_string(),
        // node can drop a SIGINT that lands while a script's interrupt
        // watchdog is being torn down; the driver ignores the extra ones.
        repeat_interrupt: true,
    })
}

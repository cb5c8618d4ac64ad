//! Python contexts: the image's `python3` (else `python`) running the
//! driver embedded here (`python/driver.py`, see `PROTOCOL.md`).
use super::driver::DriverSpec;
use super::error::Result;
use super::language::Language;
use crate::config::AgentConfig;

/// The driver's source, shipped inside the agent.
pub const DRIVER: &str = include_str!("python/driver.py");

pub fn driver_spec(cfg: &AgentConfig, cwd: &str) -> Result<DriverSpec> {
    let python = Language::Python.interpreter(cfg)?;
    Ok(DriverSpec {
        argv: vec![python.to_string_lossy().into_owned(), "-u".into(), "-c".into(), DRIVER.into()],
        envs: [("MPLBACKEND", "Agg"), ("PYTHONUNBUFFERED", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cwd: cwd.to_string(),
        // One KeyboardInterrupt, as in a notebook: a second one could hit
        // the cell's own `except`/`finally` handling.
        repeat_interrupt: false,
    })
}

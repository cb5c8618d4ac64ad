//! netd's errors.
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("link: {0}")]
    Link(io::Error),
    #[error("event loop: {0}")]
    Poll(io::Error),
    #[error("control socket: {0}")]
    Control(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("jail: {0}")]
    Jail(String),
}

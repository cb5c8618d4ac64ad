//! Errors of the FUSE server.

use std::io;
use std::path::PathBuf;

/// What can stop `pvisor-imaged` from serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),

    /// `--pool` names no directory.
    #[error("no image pool at {}", .0.display())]
    NoPool(PathBuf),

    /// The pool or the image could not be opened.
    #[error("opening image {image:?} in the pool at {}: {source}", .pool.display())]
    Image {
        image: String,
        pool: PathBuf,
        #[source]
        source: Box<crate::Error>,
    },

    /// An fd named on the command line is not open (or not usable).
    #[error("--{flag} {fd}: {source}")]
    Fd {
        flag: &'static str,
        fd: i32,
        #[source]
        source: io::Error,
    },

    /// Mounting (or the FUSE handshake that follows) failed.
    #[error("mounting the image at {}: {source}", .mountpoint.display())]
    Mount {
        mountpoint: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A step of jailing the process failed.
    #[error("jailing the server ({step}): {source}")]
    Jail {
        step: &'static str,
        #[source]
        source: io::Error,
    },

    /// The seccomp filter could not be built or installed.
    #[error("jailing the server (seccomp): {0}")]
    Seccomp(#[from] pvisor_seccomp::Error),

    /// Writing `ready` failed.
    #[error("signalling readiness: {0}")]
    Ready(#[source] io::Error),

    /// The FUSE session ended with an error.
    #[error("serving: {0}")]
    Serve(#[source] io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

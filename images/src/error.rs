//! Error type of the image store.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Everything that can go wrong while importing, resolving or removing images.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No image matches the reference.
    #[error("image not found: {0}")]
    NotFound(String),

    /// A short id prefix matches more than one image.
    #[error("ambiguous image reference {reference:?}: matches {} images ({})", .candidates.len(), .candidates.join(", "))]
    Ambiguous { reference: String, candidates: Vec<String> },

    /// The reference is not syntactically valid.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// The archive is malformed, incomplete or of an unsupported kind.
    #[error("bad image archive{}: {reason}", EntrySuffix(.entry))]
    BadArchive { entry: Option<String>, reason: String },

    /// An archive entry tries something the store refuses to do
    /// (escape the tree, absurd sizes, ids outside the mapped range, ...).
    #[error("unsafe archive entry {entry:?}: {reason}")]
    Unsafe { entry: String, reason: String },

    /// A blob's content does not match the digest it is referenced by.
    #[error("digest mismatch for {blob}: expected {expected}, got {actual}")]
    DigestMismatch { blob: String, expected: String, actual: String },

    /// The store's own metadata is unreadable.
    #[error("corrupt image store metadata {}: {reason}", .path.display())]
    Corrupt { path: PathBuf, reason: String },

    /// Invalid store options.
    #[error("invalid image store options: {0}")]
    Options(String),

    /// Pulling from a registry failed.
    #[error("pull: {0}")]
    Registry(#[from] crate::registry::RegistryError),

    /// An I/O error on a given path.
    #[error("I/O error on {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Formats ` (entry "x")` when an entry is known.
struct EntrySuffix<'a>(&'a Option<String>);

impl fmt::Display for EntrySuffix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(e) => write!(f, " (entry {e:?})"),
            None => Ok(()),
        }
    }
}

impl Error {
    pub(crate) fn io(path: impl AsRef<Path>, source: impl Into<io::Error>) -> Self {
        Error::Io { path: path.as_ref().to_path_buf(), source: source.into() }
    }

    pub(crate) fn bad(entry: Option<&str>, reason: impl Into<String>) -> Self {
        Error::BadArchive { entry: entry.map(str::to_owned), reason: reason.into() }
    }

    pub(crate) fn unsafe_entry(entry: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unsafe { entry: entry.into(), reason: reason.into() }
    }
}

/// Shorthand result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

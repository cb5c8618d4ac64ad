//! Error type of the registry client.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while pulling an image from a registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The image reference is not syntactically valid.
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// The registry (or its token service) refused the credentials, or asked
    /// for credentials that were not given.
    #[error("unauthorized by {registry}: {message}")]
    Unauthorized { registry: String, message: String },

    /// The repository or the tag/digest does not exist.
    #[error("manifest unknown: {reference} not found on {registry} ({message})")]
    NotFound { registry: String, reference: String, message: String },

    /// A manifest list / image index has no entry for the wanted platform.
    #[error("{reference}: no {wanted} image in the manifest list (available: {})", platform_list(.available))]
    NoMatchingPlatform { reference: String, wanted: String, available: Vec<String> },

    /// Downloaded content does not hash to the digest it was asked for by.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch { what: String, expected: String, actual: String },

    /// Downloaded content is not as long as its descriptor (or the server) says.
    /// For a body longer than declared, `actual` counts what was read before
    /// giving up (at least `expected + 1`).
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch { what: String, expected: u64, actual: u64 },

    /// A manifest, config or layer of a kind this client cannot use.
    #[error("unsupported media type {media_type:?} for {what}")]
    UnsupportedMediaType { what: String, media_type: String },

    /// A digest that is not `sha256:<64 lowercase hex>`.
    #[error("unsupported or malformed digest {digest:?} for {what} (only sha256 is supported)")]
    UnsupportedDigest { what: String, digest: String },

    /// A declared or received size beyond what is sane for this kind of blob.
    #[error("{what} is too large: {size} bytes (limit {limit})")]
    TooLarge { what: String, size: u64, limit: u64 },

    /// Connecting to, or talking with, the server failed.
    #[error("network error for {url}: {message}")]
    Network { url: String, message: String },

    /// Plain HTTP to a registry for which it is not allowed.
    #[error("refusing plain http to {url} (only allowed for loopback registries or with insecure_http)")]
    InsecureRefused { url: String },

    /// The server answered with an unexpected HTTP status.
    #[error("{url} answered HTTP {status}: {message}")]
    Http { url: String, status: u16, message: String },

    /// The server answered something that cannot be understood
    /// (invalid JSON, missing fields, a malformed challenge, ...).
    #[error("invalid {what} from {url}: {reason}")]
    BadResponse { url: String, what: String, reason: String },

    /// Writing the image layout file failed.
    #[error("I/O error on {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn platform_list(available: &[String]) -> String {
    if available.is_empty() {
        "none".to_owned()
    } else {
        available.join(", ")
    }
}

impl RegistryError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        RegistryError::Io { path: path.into(), source }
    }

    pub(crate) fn network(url: &str, message: impl ToString) -> Self {
        RegistryError::Network { url: url.to_owned(), message: message.to_string() }
    }

    pub(crate) fn bad_response(url: &str, what: &str, reason: impl ToString) -> Self {
        RegistryError::BadResponse { url: url.to_owned(), what: what.to_owned(), reason: reason.to_string() }
    }
}

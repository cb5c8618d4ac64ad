//! Pulling images from an OCI distribution registry (Docker Hub, GHCR, a
//! local `registry:2`, ...) into an OCI image-layout tarball that
//! [`crate::Pool::import`] takes.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use pvisor_images::registry::{fetch, PullEvent, PullOptions};
//! let tmp = std::path::Path::new("/var/lib/pvisor/tmp");
//! let fetched = fetch("localhost:5000/busybox:latest", tmp, &PullOptions::default(), &mut |ev| {
//!     if let PullEvent::BlobDone { digest } = ev {
//!         eprintln!("got {digest}");
//!     }
//! })?;
//! // ... import fetched.path, then delete it.
//! # let _ = fetched; Ok(()) }
//! ```
//!
//! Every document and blob is checked against the sha256 digest it was
//! asked for by and against its declared size, while streaming, before the
//! layout is handed out; a manifest list is resolved to the wanted platform.

mod auth;
mod client;
mod error;
mod http;
mod layout;
mod manifest;
mod reference;
mod verify;

use std::fmt;
use std::path::{Path, PathBuf};

pub use error::RegistryError;
pub use reference::{ImageRef, DOCKER_HUB};

use auth::Credentials;
use client::Client;
use layout::{IndexEntry, LayoutWriter};
use manifest::{Descriptor, Manifest, MAX_MANIFEST};
use verify::Expected;

/// Manifest lists nested in manifest lists followed at most.
const MAX_LIST_DEPTH: usize = 4;

/// How to pull.
#[derive(Clone)]
pub struct PullOptions {
    /// Username for Basic auth or the token service.
    pub username: Option<String>,
    /// Password (or access token) going with `username`.
    pub password: Option<String>,
    /// Allow plain `http://` when https does not work (always allowed for
    /// `localhost`, `127.0.0.0/8` and `[::1]`).
    pub insecure_http: bool,
    /// `(os, architecture)` picked from manifest lists.
    pub platform: (String, String),
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            username: None,
            password: None,
            insecure_http: false,
            platform: ("linux".to_owned(), "amd64".to_owned()),
        }
    }
}

impl fmt::Debug for PullOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullOptions")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("insecure_http", &self.insecure_http)
            .field("platform", &self.platform)
            .finish()
    }
}

/// Progress of a pull.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent {
    /// The image manifest is resolved: `layers` layers, `total_bytes` to
    /// download (config and layers, as declared).
    Manifest { digest: String, layers: usize, total_bytes: u64 },
    /// Bytes of a blob (config or layer) received so far.
    Blob { digest: String, done: u64, total: u64 },
    /// A blob is complete and verified.
    BlobDone { digest: String },
}

/// A pulled image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The OCI image-layout tar (in `tmp_dir`; the caller deletes it).
    pub path: PathBuf,
    /// Normalized name as the image store spells it: `repo:tag`
    /// (`busybox:latest`, `localhost:5000/busybox:latest`), or
    /// `repo@sha256:<hex>` when pulled by digest alone.
    pub name: String,
    /// Digest of the image manifest written to the layout (for a manifest
    /// list, the chosen platform's entry).
    pub manifest_digest: String,
}

/// The image manifest chosen for the pull, verified.
struct Resolved {
    digest: String,
    bytes: Vec<u8>,
    media_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// Pulls `reference` (`[registry[:port]/]repo[:tag][@sha256:<hex>]`) into an
/// OCI image-layout tar in `tmp_dir`, reporting progress to `progress`.
///
/// On error nothing is left in `tmp_dir`.
pub fn fetch(
    reference: &str,
    tmp_dir: &Path,
    opts: &PullOptions,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<Fetched, RegistryError> {
    let image = ImageRef::parse(reference)?;
    let credentials = opts
        .username
        .as_ref()
        .map(|u| Credentials { username: u.clone(), password: opts.password.clone().unwrap_or_default() });
    let mut client = Client::connect(&image, credentials, opts.insecure_http)?;
    let resolved = resolve(&mut client, &image, (&opts.platform.0, &opts.platform.1))?;
    let total_bytes = resolved.layers.iter().fold(resolved.config.size, |sum, layer| sum.saturating_add(layer.size));
    progress(PullEvent::Manifest { digest: resolved.digest.clone(), layers: resolved.layers.len(), total_bytes });

    let mut layout = LayoutWriter::create(tmp_dir)?;
    layout.add_blob(&resolved.digest, &resolved.bytes)?;
    let config_label = format!("image config {}", resolved.config.digest);
    download(&mut client, &mut layout, &resolved.config, &config_label, progress)?;
    for (i, layer) in resolved.layers.iter().enumerate() {
        let label = format!("layer {}/{} {}", i + 1, resolved.layers.len(), layer.digest);
        download(&mut client, &mut layout, layer, &label, progress)?;
    }
    let qualified = image.qualified_name();
    let path = layout.finish(&IndexEntry {
        media_type: &resolved.media_type,
        digest: &resolved.digest,
        size: resolved.bytes.len() as u64,
        tag: image.tag.as_deref(),
        qualified_name: qualified.as_deref().filter(|n| crate::normalize_name(n).is_ok()),
    })?;
    Ok(Fetched { path, name: image.name(), manifest_digest: resolved.digest })
}

/// Fetches the manifest for the reference, following manifest lists to the
/// platform's image manifest, and verifies each document.
fn resolve(client: &mut Client, image: &ImageRef, platform: (&str, &str)) -> Result<Resolved, RegistryError> {
    let mut reference = image.manifest_reference().to_owned();
    // Digest (and size, for list entries) the next document must have.
    let mut expected: Option<(String, Option<u64>)> = image.digest.clone().map(|d| (d, None));
    for _ in 0..MAX_LIST_DEPTH {
        let sep = if reference.starts_with("sha256:") { '@' } else { ':' };
        let what = format!("manifest {}/{}{sep}{reference}", image.registry, image.repository);
        let resp = client.manifest(&reference)?;
        let digest = verify::sha256_digest(&resp.bytes);
        match &expected {
            Some((want, size)) => verify::check_bytes(&resp.bytes, want, *size, &what)?,
            None => {
                // A tag has nothing to check against but the registry's own word.
                if let Some(claimed) = resp.digest_header.as_deref().filter(|d| d.starts_with("sha256:")) {
                    if claimed != digest {
                        return Err(RegistryError::DigestMismatch {
                            what: format!("{what} (Docker-Content-Digest)"),
                            expected: claimed.to_owned(),
                            actual: digest,
                        });
                    }
                }
            }
        }
        match manifest::parse(&resp.bytes, &resp.content_type, &what)? {
            Manifest::Image { media_type, config, layers } => {
                return Ok(Resolved { digest, bytes: resp.bytes, media_type, config, layers });
            }
            Manifest::Index(entries) => {
                let chosen = manifest::select_platform(&entries, platform, &image.name())?;
                if chosen.size > MAX_MANIFEST {
                    return Err(RegistryError::TooLarge {
                        what: format!("manifest {}", chosen.digest),
                        size: chosen.size,
                        limit: MAX_MANIFEST,
                    });
                }
                tracing::debug!(list = %digest, chosen = %chosen.digest, "resolved manifest list");
                reference = chosen.digest.clone();
                expected = Some((chosen.digest.clone(), Some(chosen.size)));
            }
        }
    }
    Err(RegistryError::BadResponse {
        url: image.registry.clone(),
        what: "manifest list".to_owned(),
        reason: format!("manifest lists nested more than {MAX_LIST_DEPTH} deep"),
    })
}

/// Streams one blob into the layout, verifying size and digest.
fn download(
    client: &mut Client,
    layout: &mut LayoutWriter,
    desc: &Descriptor,
    what: &str,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<(), RegistryError> {
    if layout.has_blob(&desc.digest) {
        return Ok(());
    }
    let mut blob = client.blob(&desc.digest)?;
    if let Some(len) = blob.content_length.filter(|&len| len != desc.size) {
        return Err(RegistryError::SizeMismatch { what: what.to_owned(), expected: desc.size, actual: len });
    }
    let expected = Expected { what, digest: &desc.digest, size: desc.size };
    layout.add_blob_stream(&desc.digest, desc.size, |out, path| {
        verify::copy_verified(&mut blob.reader, &blob.url, out, path, &expected, &mut |done| {
            progress(PullEvent::Blob { digest: desc.digest.clone(), done, total: desc.size })
        })
    })?;
    progress(PullEvent::BlobDone { digest: desc.digest.clone() });
    Ok(())
}

/// Parses a manifest as a pull does and, for an index, picks the
/// `platform` entry (for [`crate::fuzzing`]).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_manifest(
    bytes: &[u8],
    content_type: &str,
    platform: (&str, &str),
) -> Result<crate::fuzzing::ManifestSummary, RegistryError> {
    use crate::fuzzing::ManifestSummary;
    Ok(match manifest::parse(bytes, content_type, "fuzz")? {
        Manifest::Index(entries) => ManifestSummary::Index {
            entries: entries.len(),
            picked: manifest::select_platform(&entries, platform, "fuzz").ok().map(|d| d.digest.clone()),
        },
        Manifest::Image { config, layers, .. } => {
            ManifestSummary::Image { config: config.digest, layers: layers.into_iter().map(|l| l.digest).collect() }
        }
    })
}

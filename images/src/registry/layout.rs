//! Writing an OCI image layout as a tar file: `oci-layout`, `index.json` and
//! `blobs/sha256/<hex>`, blobs streamed straight into the archive.
//!
//! The file is created under a unique name and removed again unless
//! [`LayoutWriter::finish`] succeeds.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use super::error::RegistryError;

/// `oci-layout` contents.
const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
const BLOCK: u64 = 512;
const ANN_REF_NAME: &str = "org.opencontainers.image.ref.name";
const ANN_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Distinguishes layout files created by one process.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// An OCI image layout tar being written.
pub(crate) struct LayoutWriter {
    path: PathBuf,
    out: BufWriter<File>,
    blobs: HashSet<String>,
    finished: bool,
}

/// What `index.json` points at.
pub(crate) struct IndexEntry<'a> {
    /// Media type of the image manifest.
    pub media_type: &'a str,
    pub digest: &'a str,
    pub size: u64,
    /// The tag, recorded as `org.opencontainers.image.ref.name`.
    pub tag: Option<&'a str>,
    /// `registry/repo:tag`, recorded as `io.containerd.image.name` (the
    /// importer takes the image's name from it, a bare tag naming no repository).
    pub qualified_name: Option<&'a str>,
}

impl LayoutWriter {
    /// Creates `dir/pull-<pid>-<n>.tar` with the `oci-layout` marker.
    pub fn create(dir: &Path) -> Result<LayoutWriter, RegistryError> {
        let (path, file) = loop {
            let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("pull-{}-{n}.tar", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(RegistryError::io(path, e)),
            }
        };
        let mut w =
            LayoutWriter { path, out: BufWriter::with_capacity(1 << 20, file), blobs: HashSet::new(), finished: false };
        w.add_file("oci-layout", OCI_LAYOUT)?;
        Ok(w)
    }

    /// Whether a blob with this digest is already in the archive.
    pub fn has_blob(&self, digest: &str) -> bool {
        self.blobs.contains(digest)
    }

    /// Adds an already verified in-memory blob (no-op if present).
    pub fn add_blob(&mut self, digest: &str, data: &[u8]) -> Result<(), RegistryError> {
        if self.blobs.insert(digest.to_owned()) {
            self.add_file(&blob_path(digest), data)?;
        }
        Ok(())
    }

    /// Adds a blob of `size` bytes whose content `fill` writes (and verifies).
    /// `fill` gets the archive writer and its path (for errors) and must
    /// write exactly `size` bytes or fail.
    pub fn add_blob_stream(
        &mut self,
        digest: &str,
        size: u64,
        fill: impl FnOnce(&mut dyn Write, &Path) -> Result<(), RegistryError>,
    ) -> Result<(), RegistryError> {
        if self.has_blob(digest) {
            return Ok(());
        }
        self.write_header(&blob_path(digest), size)?;
        let mut counted = CountingWriter { inner: &mut self.out, count: 0 };
        fill(&mut counted, &self.path)?;
        let written = counted.count;
        if written != size {
            return Err(RegistryError::SizeMismatch {
                what: format!("blob {digest}"),
                expected: size,
                actual: written,
            });
        }
        self.pad(size)?;
        self.blobs.insert(digest.to_owned());
        Ok(())
    }

    /// Writes `index.json` and the end-of-archive marker; the file is kept.
    pub fn finish(mut self, entry: &IndexEntry<'_>) -> Result<PathBuf, RegistryError> {
        let mut annotations = serde_json::Map::new();
        if let Some(tag) = entry.tag {
            annotations.insert(ANN_REF_NAME.to_owned(), tag.into());
        }
        if let Some(name) = entry.qualified_name {
            annotations.insert(ANN_CONTAINERD_NAME.to_owned(), name.into());
        }
        let mut descriptor = json!({ "mediaType": entry.media_type, "digest": entry.digest, "size": entry.size });
        if !annotations.is_empty() {
            descriptor["annotations"] = annotations.into();
        }
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [descriptor],
        });
        let bytes = serde_json::to_vec_pretty(&index).map_err(|e| RegistryError::io(&self.path, e.into()))?;
        self.add_file("index.json", &bytes)?;
        self.out.write_all(&[0u8; 2 * BLOCK as usize]).map_err(|e| RegistryError::io(&self.path, e))?;
        self.out.flush().map_err(|e| RegistryError::io(&self.path, e))?;
        self.finished = true;
        Ok(self.path.clone())
    }

    fn add_file(&mut self, name: &str, data: &[u8]) -> Result<(), RegistryError> {
        self.write_header(name, data.len() as u64)?;
        self.out.write_all(data).map_err(|e| RegistryError::io(&self.path, e))?;
        self.pad(data.len() as u64)
    }

    fn write_header(&mut self, name: &str, size: u64) -> Result<(), RegistryError> {
        let mut header = tar::Header::new_ustar();
        header.set_path(name).map_err(|e| RegistryError::io(&self.path, e))?;
        header.set_size(size);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        self.out.write_all(header.as_bytes()).map_err(|e| RegistryError::io(&self.path, e))
    }

    /// Zero padding after `size` bytes of member data.
    fn pad(&mut self, size: u64) -> Result<(), RegistryError> {
        let pad = ((BLOCK - size % BLOCK) % BLOCK) as usize;
        self.out.write_all(&[0u8; BLOCK as usize][..pad]).map_err(|e| RegistryError::io(&self.path, e))
    }
}

impl Drop for LayoutWriter {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), "removing a partial image layout: {e}");
            }
        }
    }
}

/// `blobs/sha256/<hex>` (the digest was validated as `sha256:<64 hex>`).
fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// Counts the bytes written through it.
struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::registry::verify::sha256_digest;

    fn members(path: &Path) -> Vec<(String, Vec<u8>)> {
        let mut ar = tar::Archive::new(File::open(path).unwrap());
        ar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            })
            .collect()
    }

    #[test]
    fn writes_a_layout_tar() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = b"{\"m\":1}".to_vec();
        let layer = vec![3u8; 1000];
        let (md, ld) = (sha256_digest(&manifest), sha256_digest(&layer));
        let mut w = LayoutWriter::create(dir.path()).unwrap();
        w.add_blob(&md, &manifest).unwrap();
        w.add_blob(&md, &manifest).unwrap();
        w.add_blob_stream(&ld, 1000, |out, _| out.write_all(&layer).map_err(|e| RegistryError::io("x", e))).unwrap();
        assert!(w.has_blob(&ld));
        let entry = IndexEntry {
            media_type: "application/vnd.oci.image.manifest.v1+json",
            digest: &md,
            size: manifest.len() as u64,
            tag: Some("v1"),
            qualified_name: Some("localhost:5000/x:v1"),
        };
        let path = w.finish(&entry).unwrap();
        let m = members(&path);
        let names: Vec<&str> = m.iter().map(|(n, _)| n.as_str()).collect();
        let hex = |d: &str| d.trim_start_matches("sha256:").to_owned();
        assert_eq!(
            names,
            vec![
                "oci-layout".to_owned(),
                format!("blobs/sha256/{}", hex(&md)),
                format!("blobs/sha256/{}", hex(&ld)),
                "index.json".to_owned()
            ]
        );
        assert_eq!(m[2].1, layer);
        let index: serde_json::Value = serde_json::from_slice(&m[3].1).unwrap();
        assert_eq!(index["manifests"][0]["digest"], md);
        assert_eq!(index["manifests"][0]["annotations"][ANN_REF_NAME], "v1");
        assert_eq!(index["manifests"][0]["annotations"][ANN_CONTAINERD_NAME], "localhost:5000/x:v1");
    }

    #[test]
    fn removed_unless_finished() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LayoutWriter::create(dir.path()).unwrap();
        let failed = w.add_blob_stream(&sha256_digest(b"x"), 10, |out, _| {
            out.write_all(b"short").map_err(|e| RegistryError::io("x", e))
        });
        assert!(matches!(failed, Err(RegistryError::SizeMismatch { expected: 10, actual: 5, .. })));
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

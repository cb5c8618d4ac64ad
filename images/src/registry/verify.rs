//! Content verification: sha256 digests and sizes of downloaded blobs,
//! checked while streaming so nothing from the registry is trusted.

use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::error::RegistryError;

/// Copy buffer size.
const CHUNK: usize = 256 << 10;
/// Extra bytes drained past the declared end to report how long a body was.
const MAX_OVERRUN_PROBE: u64 = 1 << 20;
/// Progress is reported at most once per this many bytes (and at the end).
const PROGRESS_STEP: u64 = 1 << 20;

/// `sha256:<hex>` of some bytes.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks in-memory content against a digest and, when known, a size.
pub(crate) fn check_bytes(bytes: &[u8], digest: &str, size: Option<u64>, what: &str) -> Result<(), RegistryError> {
    if let Some(size) = size.filter(|&s| s != bytes.len() as u64) {
        return Err(RegistryError::SizeMismatch { what: what.to_owned(), expected: size, actual: bytes.len() as u64 });
    }
    let actual = sha256_digest(bytes);
    if actual != digest {
        return Err(RegistryError::DigestMismatch { what: what.to_owned(), expected: digest.to_owned(), actual });
    }
    Ok(())
}

/// What a streamed blob must be.
pub(crate) struct Expected<'a> {
    /// Names the blob in errors (`layer 2/3 sha256:...`).
    pub what: &'a str,
    /// `sha256:<hex>`.
    pub digest: &'a str,
    pub size: u64,
}

/// Copies exactly `expected.size` bytes from `src` (read from `src_url`) to
/// `dst` (writing `dst_path`), hashing on the way, then checks that `src`
/// has nothing more and that the digest matches. `progress` gets the byte
/// count done now and then and at the end.
///
/// On error `dst` holds a partial copy; the caller discards it.
pub(crate) fn copy_verified(
    src: &mut dyn Read,
    src_url: &str,
    dst: &mut dyn Write,
    dst_path: &Path,
    expected: &Expected<'_>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), RegistryError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    let mut reported = 0u64;
    while done < expected.size {
        let want = usize::try_from(expected.size - done).map_or(CHUNK, |left| left.min(CHUNK));
        let n = match src.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(RegistryError::network(src_url, format!("reading {}: {e}", expected.what))),
        };
        if n == 0 {
            return Err(RegistryError::SizeMismatch {
                what: expected.what.to_owned(),
                expected: expected.size,
                actual: done,
            });
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(|e| RegistryError::io(dst_path, e))?;
        done += n as u64;
        if done - reported >= PROGRESS_STEP {
            progress(done);
            reported = done;
        }
    }
    let extra = std::io::copy(&mut src.take(MAX_OVERRUN_PROBE), &mut std::io::sink())
        .map_err(|e| RegistryError::network(src_url, format!("reading {}: {e}", expected.what)))?;
    if extra > 0 {
        return Err(RegistryError::SizeMismatch {
            what: expected.what.to_owned(),
            expected: expected.size,
            actual: done + extra,
        });
    }
    if reported != done || done == 0 {
        progress(done);
    }
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != expected.digest {
        return Err(RegistryError::DigestMismatch {
            what: expected.what.to_owned(),
            expected: expected.digest.to_owned(),
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(data: &[u8], digest: &str, size: u64) -> (Result<(), RegistryError>, Vec<u8>, Vec<u64>) {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let r = copy_verified(
            &mut &data[..],
            "http://x/blob",
            &mut out,
            Path::new("/tmp/x"),
            &Expected { what: "layer 1/1", digest, size },
            &mut |n| seen.push(n),
        );
        (r, out, seen)
    }

    #[test]
    fn streams_and_verifies() {
        let data = vec![7u8; (3 << 20) + 5];
        let d = sha256_digest(&data);
        let (r, out, seen) = run(&data, &d, data.len() as u64);
        r.unwrap();
        assert_eq!(out, data);
        assert_eq!(seen.last().copied(), Some(data.len() as u64));
        assert!(seen.len() >= 3 && seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        let (r, _, seen) = run(b"", &sha256_digest(b""), 0);
        r.unwrap();
        assert_eq!(seen, vec![0]);
    }

    #[test]
    fn detects_tampering_and_size_errors() {
        let d = sha256_digest(b"hello");
        match run(b"hellO", &d, 5).0 {
            Err(RegistryError::DigestMismatch { what, expected, .. }) => {
                assert_eq!(what, "layer 1/1");
                assert_eq!(expected, d);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(run(b"hell", &d, 5).0, Err(RegistryError::SizeMismatch { expected: 5, actual: 4, .. })));
        assert!(matches!(run(b"hello!!", &d, 5).0, Err(RegistryError::SizeMismatch { expected: 5, actual: 7, .. })));
        check_bytes(b"hello", &d, Some(5), "m").unwrap();
        check_bytes(b"hello", &d, None, "m").unwrap();
        assert!(matches!(check_bytes(b"hello", &d, Some(6), "m"), Err(RegistryError::SizeMismatch { .. })));
        assert!(matches!(check_bytes(b"hellO", &d, None, "m"), Err(RegistryError::DigestMismatch { .. })));
    }
}

//! The state file's format: a fixed header, then the state as JSON.
//!
//! ```text
//! 0   8   magic "PVSNAPST"
//! 8   4   format version (u32 LE), FORMAT_VERSION
//! 12  4   reserved (0)
//! 16  8   payload length (u64 LE)
//! 24  32  SHA-256 of the payload
//! 56  ..  payload: the serde_json encoding of `state::Snapshot`
//! ```
//!
//! A reader refuses another version, a short file and a checksum mismatch with typed errors
//! before it decodes anything. The version changes whenever `state::Snapshot` changes in a way
//! an older reader would misread; there is no migration between versions (a template snapshot
//! of another version is rebuilt, not converted).

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::state::Snapshot;
use super::Error;

/// The state file's magic.
pub const MAGIC: [u8; 8] = *b"PVSNAPST";
/// The format version this VMM writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 56;

/// Encodes `snapshot` as a state file's bytes.
pub fn encode(snapshot: &Snapshot) -> Result<Vec<u8>, Error> {
    let payload = serde_json::to_vec(snapshot).map_err(Error::Decode)?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Decodes a state file's bytes (`path` names it in errors).
pub fn decode(bytes: &[u8], path: &Path) -> Result<Snapshot, Error> {
    if bytes.len() < HEADER_LEN || bytes[..8] != MAGIC {
        return Err(Error::BadMagic(path.to_owned()));
    }
    let u32_at = |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let found = u32_at(8);
    if found != FORMAT_VERSION {
        return Err(Error::Version { found, supported: FORMAT_VERSION });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let want = u64::from_le_bytes(len);
    let payload = &bytes[HEADER_LEN..];
    if (payload.len() as u64) < want {
        return Err(Error::Truncated { have: payload.len() as u64, want });
    }
    let payload = &payload[..want as usize];
    if Sha256::digest(payload)[..] != bytes[24..56] {
        return Err(Error::Checksum);
    }
    serde_json::from_slice(payload).map_err(Error::Decode)
}

/// Writes `snapshot` to `path` atomically (a temporary file renamed over it, synced).
pub fn write(snapshot: &Snapshot, path: &Path) -> Result<u64, Error> {
    let bytes = encode(snapshot)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(Error::io("creating", &tmp))?;
    file.write_all(&bytes).map_err(Error::io("writing", &tmp))?;
    file.sync_all().map_err(Error::io("syncing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io("renaming into place", path))?;
    Ok(bytes.len() as u64)
}

/// Reads and checks the state file at `path`.
pub fn read(path: &Path) -> Result<Snapshot, Error> {
    let bytes = std::fs::read(path).map_err(Error::io("reading", path))?;
    decode(&bytes, path)
}

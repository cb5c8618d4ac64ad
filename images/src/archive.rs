//! Reading the outer image tarball: an index of its members (read by seeking,
//! never loading the archive), format detection, bounded readers, digests
//! and layer decompression.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ImageConfig;

/// Largest JSON document (manifest, index, config) read into memory.
pub(crate) const MAX_JSON: u64 = 32 << 20;
/// Largest single member or layer entry accepted.
pub(crate) const MAX_ENTRY_SIZE: u64 = 64 << 30;
/// Bytes the tar reader may consume between two entries (headers plus
/// GNU long-name and PAX extension data, which it buffers in memory).
pub(crate) const EXTENSION_BUDGET: u64 = 4 << 20;

/// Which kind of image archive this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `docker save`: `manifest.json` at the top.
    Docker,
    /// OCI image layout: `oci-layout` and `index.json`.
    Oci,
}

/// Where a member's data lives in the archive file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Member {
    pub offset: u64,
    pub size: u64,
}

/// An image archive opened for random access.
pub(crate) struct Archive {
    path: PathBuf,
    file: File,
    members: HashMap<String, Member>,
    /// Symlink and hardlink members (older `docker save` links duplicate
    /// layers), as member name -> archive path of the target.
    links: HashMap<String, String>,
}

/// Most link hops followed when looking a member up.
const MAX_LINK_HOPS: usize = 16;

/// Lexically normalizes an archive-internal path (`a/./b/../c` -> `a/c`).
/// Only used to look names up in the index, never on the file system.
fn normalize_lexically(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out.join("/")
}

/// Normalizes a member name: no leading `./` or `/`, no trailing `/`.
pub(crate) fn member_name(raw: &str) -> String {
    let mut s = raw;
    loop {
        if let Some(rest) = s.strip_prefix("./") {
            s = rest;
        } else if let Some(rest) = s.strip_prefix('/') {
            s = rest;
        } else {
            break;
        }
    }
    s.trim_end_matches('/').to_owned()
}

impl Archive {
    /// Indexes the tarball's regular-file members.
    pub(crate) fn open(path: &Path) -> Result<Archive> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut magic = [0u8; 4];
        let n = file.read_at(&mut magic, 0).map_err(|e| Error::io(path, e))?;
        if n >= 2 && (magic[..2] == [0x1f, 0x8b] || (n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd])) {
            return Err(Error::bad(
                None,
                "the archive is compressed; decompress it first (an image archive must be a plain tar file)",
            ));
        }
        let budget = Budget::new();
        let reader = BudgetReader::new(&file, budget.clone());
        let mut tar = tar::Archive::new(reader);
        let mut entries = tar.entries_with_seek().map_err(|e| Error::bad(None, format!("not a tar archive: {e}")))?;
        let mut members = HashMap::new();
        let mut links = HashMap::new();
        loop {
            budget.limit(EXTENSION_BUDGET);
            let next = entries.next();
            budget.unlimited();
            let entry = match next {
                None => break,
                Some(Ok(e)) => e,
                Some(Err(e)) if budget.exceeded() => {
                    return Err(Error::bad(None, format!("oversized tar extension header: {e}")))
                }
                Some(Err(e)) => return Err(Error::bad(None, format!("reading the tar index: {e}"))),
            };
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let size = entry.size();
            let offset = entry.raw_file_position();
            let past_end = !matches!(offset.checked_add(size), Some(end) if end <= len);
            if size > MAX_ENTRY_SIZE || past_end {
                return Err(Error::bad(
                    Some(&raw),
                    format!(
                        "declared size {size} exceeds the remaining archive data ({} bytes)",
                        len.saturating_sub(offset)
                    ),
                ));
            }
            let kind = entry.header().entry_type();
            let name = member_name(&raw);
            if kind.is_file() || kind.is_contiguous() {
                members.insert(name, Member { offset, size });
            } else if kind.is_symlink() || kind.is_hard_link() {
                let target =
                    entry.link_name_bytes().map(|t| String::from_utf8_lossy(&t).into_owned()).unwrap_or_default();
                let target = if kind.is_symlink() && !target.starts_with('/') {
                    // Relative to the link's own directory.
                    match name.rsplit_once('/') {
                        Some((dir, _)) => format!("{dir}/{target}"),
                        None => target,
                    }
                } else {
                    target
                };
                links.insert(name, normalize_lexically(&target));
            }
        }
        if members.is_empty() {
            return Err(Error::bad(None, "the archive holds no files"));
        }
        Ok(Archive { path: path.to_path_buf(), file, members, links })
    }

    pub(crate) fn format(&self) -> Result<Format> {
        if self.members.contains_key("manifest.json") {
            Ok(Format::Docker)
        } else if self.members.contains_key("oci-layout") && self.members.contains_key("index.json") {
            Ok(Format::Oci)
        } else {
            Err(Error::bad(
                None,
                "neither a docker-archive (manifest.json) nor an OCI image layout (oci-layout, index.json)",
            ))
        }
    }

    pub(crate) fn member(&self, name: &str) -> Result<Member> {
        let mut current = normalize_lexically(&member_name(name));
        for _ in 0..MAX_LINK_HOPS {
            if let Some(m) = self.members.get(&current) {
                return Ok(*m);
            }
            match self.links.get(&current) {
                Some(target) => current = target.clone(),
                None => break,
            }
        }
        Err(Error::bad(Some(name), "missing from the archive"))
    }

    pub(crate) fn reader(&self, m: Member) -> MemberReader<'_> {
        MemberReader { file: &self.file, pos: m.offset, end: m.offset + m.size }
    }

    /// Reads a small member (JSON) fully.
    pub(crate) fn read_small(&self, name: &str) -> Result<Vec<u8>> {
        let m = self.member(name)?;
        if m.size > MAX_JSON {
            return Err(Error::bad(Some(name), format!("{} bytes is too large for a metadata file", m.size)));
        }
        let mut buf = Vec::with_capacity(m.size as usize);
        self.reader(m).read_to_end(&mut buf).map_err(|e| Error::io(&self.path, e))?;
        Ok(buf)
    }
}

/// Reads one member's bytes by offset (positioned reads on a shared file).
pub(crate) struct MemberReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for MemberReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end - self.pos;
        if left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf.len().min(left.min(usize::MAX as u64) as usize);
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "archive file shrank while reading"));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Shared byte budget for a [`BudgetReader`]: `None` is unlimited.
#[derive(Clone)]
pub(crate) struct Budget(Rc<(Cell<Option<u64>>, Cell<bool>)>);

impl Budget {
    pub(crate) fn new() -> Self {
        Budget(Rc::new((Cell::new(None), Cell::new(false))))
    }
    pub(crate) fn limit(&self, n: u64) {
        self.0 .0.set(Some(n));
    }
    pub(crate) fn unlimited(&self) {
        self.0 .0.set(None);
    }
    pub(crate) fn exceeded(&self) -> bool {
        self.0 .1.get()
    }
}

/// A reader that fails once more than the current budget is read; used to
/// stop the tar reader from buffering huge extension headers.
pub(crate) struct BudgetReader<R> {
    inner: R,
    budget: Budget,
}

impl<R> BudgetReader<R> {
    pub(crate) fn new(inner: R, budget: Budget) -> Self {
        BudgetReader { inner, budget }
    }
}

impl<R: Read> Read for BudgetReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let cell = &self.budget.0 .0;
        match cell.get() {
            None => self.inner.read(buf),
            Some(0) => {
                self.budget.0 .1.set(true);
                Err(io::Error::other("tar header data exceeds the size limit"))
            }
            Some(left) => {
                let want = buf.len().min(left.min(usize::MAX as u64) as usize);
                let n = self.inner.read(&mut buf[..want])?;
                cell.set(Some(left - n as u64));
                Ok(n)
            }
        }
    }
}

impl<R: Seek> Seek for BudgetReader<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}

/// `sha256:<hex>` of a byte string.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Hashes (optionally) and counts everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Option<Sha256>,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R, hash: bool) -> Self {
        HashingReader { inner, hasher: hash.then(Sha256::new), count: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// `sha256:<hex>` of everything read so far (None when not hashing).
    pub(crate) fn digest(&mut self) -> Option<String> {
        self.hasher.take().map(|h| format!("sha256:{}", hex::encode(h.finalize())))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = self.hasher.as_mut() {
            h.update(&buf[..n]);
        }
        self.count += n as u64;
        Ok(n)
    }
}

/// Compression of a layer blob, detected from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    Plain,
    Gzip,
    Zstd,
}

impl Compression {
    pub(crate) fn detect<R: BufRead>(r: &mut R) -> io::Result<Compression> {
        let head = r.fill_buf()?;
        Ok(if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::Plain
        })
    }

    /// Wraps `r` in the matching decoder.
    pub(crate) fn decoder<'a, R: BufRead + 'a>(self, r: R) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match self {
            Compression::Plain => Box::new(r),
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(r)?),
        })
    }
}

/// One image found in an archive, ready to be unpacked.
#[derive(Clone, Debug)]
pub(crate) struct ImagePlan {
    /// `sha256:<hex>` of the config blob.
    pub id: String,
    /// Normalized names.
    pub names: Vec<String>,
    pub config: ImageConfig,
    /// Manifest digests known for this image (OCI only).
    pub manifest_digests: Vec<String>,
    pub layers: Vec<LayerPlan>,
}

/// A layer blob and how its content is verified.
#[derive(Clone, Debug)]
pub(crate) struct LayerPlan {
    /// Archive member holding the blob.
    pub member: String,
    pub check: LayerCheck,
}

#[derive(Clone, Debug)]
pub(crate) enum LayerCheck {
    /// OCI: sha256 and size of the blob as stored (possibly compressed).
    Blob { digest: String, size: u64 },
    /// docker-archive: sha256 of the uncompressed tar (the config's diff_id).
    DiffId(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names() {
        assert_eq!(member_name("./manifest.json"), "manifest.json");
        assert_eq!(member_name("/blobs/sha256/ab"), "blobs/sha256/ab");
        assert_eq!(member_name("././a/"), "a");
    }

    #[test]
    fn lexical_normalization() {
        assert_eq!(normalize_lexically("a/./b/../c"), "a/c");
        assert_eq!(normalize_lexically("../../x"), "x");
        assert_eq!(normalize_lexically("/a//b/"), "a/b");
    }

    #[test]
    fn linked_members_resolve() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, "aaa/layer.tar", &b"hello"[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "bbb/layer.tar", "../aaa/layer.tar").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        b.append_link(&mut h, "ccc/layer.tar", "bbb/layer.tar").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "loop", "loop").unwrap();
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b.into_inner().unwrap()).unwrap();
        let ar = Archive::open(tmp.path()).unwrap();
        for name in ["aaa/layer.tar", "bbb/layer.tar", "./ccc/layer.tar"] {
            let mut s = String::new();
            ar.reader(ar.member(name).unwrap()).read_to_string(&mut s).unwrap();
            assert_eq!(s, "hello", "{name}");
        }
        assert!(ar.member("loop").is_err());
        assert!(ar.member("nope").is_err());
    }

    #[test]
    fn budget_reader_stops() {
        let budget = Budget::new();
        let mut r = BudgetReader::new(&[7u8; 100][..], budget.clone());
        budget.limit(10);
        let mut buf = [0u8; 64];
        assert_eq!(r.read(&mut buf).unwrap(), 10);
        assert!(r.read(&mut buf).is_err());
        assert!(budget.exceeded());
        budget.unlimited();
        assert_eq!(r.read(&mut buf).unwrap(), 64);
    }
}

//! Entry points for the fuzz targets (`fuzz/`), compiled only with the
//! `fuzzing` feature: thin wrappers that reach the crate-private parsers an
//! untrusted image goes through, without the digests a fuzzer cannot forge.
//!
//! * [`flatten_layers`]: layer blobs (plain, gzip or zstd tar) applied in
//!   order to an image tree exactly as an import does (whiteouts, opaque
//!   directories, hardlinks, PAX and GNU extensions, size and id bounds), the
//!   file content kept in memory instead of the pool's packs.
//! * [`erofs_metadata`]: the erofs layout and metadata the vm backend builds
//!   from an image's index.
//! * [`registry_manifest`]: a registry's manifest or image index, and the
//!   platform choice among an index's entries.
//! * [`image_config`]: an image config blob.
//!
//! Nothing here is part of the crate's API.

use std::io::{self, BufReader, Read};

use sha2::{Digest, Sha256};

use crate::archive::Compression;
use crate::error::{Error, Result};
use crate::pool::index::{ChunkRef, Extent, Index};
use crate::pool::FileContent;
use crate::tree::{ContentSink, TreeBuilder};
use crate::ImageConfig;

/// Reads each file's content (hashing it, keeping nothing) and places it as one chunk of its
/// own, so that the index the tree turns into passes [`Index::check`] like
/// one of the pool's.
#[derive(Default)]
struct MemorySink {
    chunks: Vec<ChunkRef>,
}

impl ContentSink for MemorySink {
    fn add_file(&mut self, data: &mut dyn Read, size: u64) -> std::result::Result<FileContent, io::Error> {
        // Streamed, as the chunker does: a sparse entry may expand far beyond its input.
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        let (mut limited, mut read) = (data.take(size), 0u64);
        loop {
            let n = limited.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            read += n as u64;
        }
        Ok(FileContent { size: read, digest: hasher.finalize().into(), extents: Vec::new(), spooled: None })
    }

    fn place(&mut self, content: &FileContent) -> std::result::Result<Vec<Extent>, io::Error> {
        if content.size == 0 {
            return Ok(Vec::new());
        }
        let len = u32::try_from(content.size).map_err(|_| io::Error::other("file too large for one chunk"))?;
        self.chunks.push(ChunkRef { digest: content.digest, len });
        Ok(vec![Extent { chunk: (self.chunks.len() - 1) as u32, offset: 0, len }])
    }
}

/// The index of the image made of `layers` (each a layer blob as a registry
/// or archive holds it), as an import builds it before writing it out.
pub fn flatten_layers(layers: &[&[u8]]) -> Result<Index> {
    let mut tree = TreeBuilder::new();
    let mut sink = MemorySink::default();
    for (i, blob) in layers.iter().enumerate() {
        let label = format!("{}", i + 1);
        let io_err = |e: io::Error| Error::bad(Some(&label), format!("reading layer: {e}"));
        let mut buffered = BufReader::new(*blob);
        let compression = Compression::detect(&mut buffered).map_err(io_err)?;
        let plain_size = (compression == Compression::Plain).then_some(blob.len() as u64);
        let decoder = compression.decoder(buffered).map_err(io_err)?;
        tree.apply_layer(decoder, &label, plain_size, &mut sink)?;
    }
    let inodes = tree.finish(&mut sink).map_err(|e| Error::bad(None, format!("placing content: {e}")))?;
    Ok(Index { inodes, chunks: sink.chunks })
}

/// The metadata blocks (superblock, inodes, xattrs, directories) of the
/// erofs image of `index`, and the image's size in blocks.
pub fn erofs_metadata(index: &Index) -> crate::erofs::Result<(Vec<u8>, u64)> {
    crate::erofs::fuzz_metadata(index)
}

/// What a registry's manifest document says, in short.
#[derive(Debug)]
pub enum ManifestSummary {
    /// An image index: how many entries, and the one picked for `platform`.
    Index { entries: usize, picked: Option<String> },
    /// An image manifest: the config digest and the layer digests.
    Image { config: String, layers: Vec<String> },
}

/// Parses a manifest as the registry client does (`content_type` as the
/// registry sent it) and, for an index, picks the `platform` entry.
pub fn registry_manifest(bytes: &[u8], content_type: &str, platform: (&str, &str)) -> Result<ManifestSummary> {
    crate::registry::fuzz_manifest(bytes, content_type, platform).map_err(|e| Error::bad(None, e.to_string()))
}

/// The runtime config and layer diff ids of an image config blob.
pub fn image_config(bytes: &[u8]) -> Result<(ImageConfig, Vec<String>)> {
    let parsed = crate::config::parse(bytes, "config")?;
    Ok((parsed.config, parsed.diff_ids))
}

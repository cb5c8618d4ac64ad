//! Image layers as an import applies them (`pvisor_images::fuzzing`): tar
//! streams, plain or gzip or zstd, with whiteouts, opaque directories,
//! hardlinks, symlinks, device nodes, PAX and GNU long-name extensions,
//! flattened into one tree and then laid out as the vm backend's erofs image.
//!
//! The input is one or more layer blobs separated by [`SEPARATOR`] (a plain
//! tar file is a one-layer input).
//!
//! Invariants: a tree that flattens is a valid index (the checks the pool's
//! readers rely on), names are real file names (no `/`, NUL, `.`, `..`,
//! nothing over 255 bytes), owners are in the mappable id range, the index
//! survives its encode/decode round trip, and every image that imports can
//! be served as erofs: the layout succeeds and its superblock reads back
//! with the inode count and size the layout planned.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use pvisor_images::erofs::format::{SuperBlock, BLOCK_SIZE, SUPER_OFFSET, SUPER_SIZE};
use pvisor_images::pool::index::{Data, Index};

/// Between two layers of an input (also in the dictionary).
const SEPARATOR: &[u8] = b"%%pvisor-fuzz-layer%%";
/// Layers per input at most (an image may have many; a few find the bugs).
const MAX_LAYERS: usize = 8;

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut layers = Vec::new();
    let mut rest = data;
    while layers.len() + 1 < MAX_LAYERS {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(at) => {
                layers.push(&rest[..at]);
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => break,
        }
    }
    layers.push(rest);
    layers
}

fn check_index(index: &Index) {
    index.check().expect("a flattened tree is a valid index");
    for (i, inode) in index.inodes.iter().enumerate() {
        assert!(inode.uid < 65536 && inode.gid < 65536, "inode {i}: owner {}:{}", inode.uid, inode.gid);
        match &inode.data {
            Data::Dir { entries, .. } => {
                for e in entries {
                    let n = &e.name;
                    assert!(!n.is_empty() && n.len() <= 255, "inode {i}: entry name of {} bytes", n.len());
                    assert!(!n.contains(&b'/') && !n.contains(&0), "inode {i}: entry name {n:?}");
                    assert!(n.as_slice() != b"." && n.as_slice() != b"..", "inode {i}: entry name {n:?}");
                }
            }
            Data::Symlink { target } => {
                assert!(!target.is_empty() && !target.contains(&0), "inode {i}: symlink target {target:?}")
            }
            _ => {}
        }
    }
    let encoded = index.encode().expect("an index encodes");
    let decoded = Index::decode(&encoded, Path::new("fuzz")).expect("an encoded index decodes");
    assert_eq!(&decoded, index, "index encode/decode round trip");
}

fn check_erofs(index: &Index) {
    let (meta, blocks) = pvisor_images::fuzzing::erofs_metadata(index).expect("an imported image lays out as erofs");
    assert!(!meta.is_empty() && meta.len() % BLOCK_SIZE == 0, "metadata of {} bytes", meta.len());
    assert!(meta.len() as u64 <= blocks * BLOCK_SIZE as u64);
    let sb = SuperBlock::decode(&meta[SUPER_OFFSET..SUPER_OFFSET + SUPER_SIZE]).expect("the superblock reads back");
    assert_eq!(sb.inos, index.inodes.len() as u64);
    assert_eq!(u64::from(sb.blocks), blocks);
}

fuzz_target!(|data: &[u8]| {
    let layers = split(data);
    if let Ok(index) = pvisor_images::fuzzing::flatten_layers(&layers) {
        check_index(&index);
        check_erofs(&index);
    }
});

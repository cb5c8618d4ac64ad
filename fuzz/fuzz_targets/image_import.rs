//! A whole image import through the pool's public API (`Pool::import`):
//! the outer tarball, `oci-layout`, `index.json`, the manifest, the config,
//! the layer blobs, the chunker and packs, the index, then the image served
//! back (`ImageView`) and as the vm backend's erofs disk (`ErofsView`).
//!
//! Two kinds of input:
//! * a tar file (`ustar` magic at offset 257): imported as it is, a
//!   docker-archive or OCI layout (digests a fuzzer cannot forge stop it at
//!   the first checked blob, after the archive index, `manifest.json` and
//!   the config);
//! * anything else: parts separated by [`SEPARATOR`], the image config JSON
//!   then the layer blobs, assembled into an OCI layout whose descriptors
//!   carry the right digests and sizes, so every layer reaches the tree.
//!
//! Invariants: an image that imports reads back: every file's content has
//! the size and sha256 its index records, the same tree as flattening the
//! layers in memory (`image_layers`), and an erofs view builds and reads to
//! its end, starting with a valid superblock.
#![no_main]

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pvisor_images::erofs::format::{SuperBlock, SUPER_OFFSET, SUPER_SIZE};
use pvisor_images::erofs::ErofsView;
use pvisor_images::pool::index::{Data, Index};
use pvisor_images::{ImageView, Options, Pool};
use sha2::{Digest, Sha256};

/// Between the parts of an assembled input (also in the dictionary).
const SEPARATOR: &[u8] = b"%%pvisor-fuzz-layer%%";
const MAX_PARTS: usize = 8;
/// Largest erofs image read through to its end.
const MAX_READ: u64 = 64 << 20;

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": digest(blob), "size": blob.len()})
}

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while parts.len() + 1 < MAX_PARTS {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(at) => {
                parts.push(&rest[..at]);
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

/// An OCI layout tarball of one image: `config` and `layers`, digests right.
fn oci_layout(config: &[u8], layers: &[&[u8]]) -> Vec<u8> {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": layers.iter().map(|l| descriptor("application/vnd.oci.image.layer.v1.tar", l)).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).expect("JSON");
    let mut top = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    top["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": "fuzz.local/image:latest"});
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [top]})).expect("JSON");
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, data).expect("writing to memory");
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &index);
    for blob in [config, &manifest[..]].into_iter().chain(layers.iter().copied()) {
        add(&format!("blobs/sha256/{}", hex::encode(Sha256::digest(blob))), blob);
    }
    tar.into_inner().expect("writing to memory")
}

/// The tree of an index without where the content is stored.
fn shape(index: &Index) -> Vec<String> {
    index
        .inodes
        .iter()
        .map(|i| {
            let data = match &i.data {
                Data::File { size, digest, .. } => format!("file {size} {}", hex::encode(digest)),
                other => format!("{other:?}"),
            };
            format!("{:o} {}:{} {} {} {:?} {data}", i.mode, i.uid, i.gid, i.mtime, i.nlink, i.xattrs)
        })
        .collect()
}

fn check_content(view: &ImageView) {
    let mut buf = vec![0u8; 64 << 10];
    for (ino, inode) in view.index().inodes.iter().enumerate() {
        let Data::File { size, digest, .. } = &inode.data else { continue };
        let mut hash = Sha256::new();
        let mut at = 0u64;
        loop {
            let n = view.read(ino as u32, at, &mut buf).expect("reading an imported file");
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            at += n as u64;
        }
        assert_eq!(at, *size, "inode {ino}: read {at} of {size} bytes");
        assert_eq!(&<[u8; 32]>::from(hash.finalize()), digest, "inode {ino}: content differs from its digest");
    }
}

fn check_erofs(view: ImageView) {
    let fs = ErofsView::new(Arc::new(view)).expect("an imported image is servable as erofs");
    let mut block = vec![0u8; ErofsView::BLOCK_SIZE as usize];
    fs.read_at(0, &mut block).expect("reading the superblock");
    let sb = SuperBlock::decode(&block[SUPER_OFFSET..SUPER_OFFSET + SUPER_SIZE]).expect("a valid superblock");
    assert_eq!(u64::from(sb.blocks) * ErofsView::BLOCK_SIZE, fs.len());
    if fs.len() <= MAX_READ {
        let mut at = 0;
        while at < fs.len() {
            let n = fs.read_at(at, &mut block).expect("reading the erofs image");
            assert_eq!(n as u64, ErofsView::BLOCK_SIZE.min(fs.len() - at));
            at += n as u64;
        }
        assert_eq!(fs.read_at(at, &mut block).expect("reading past the end"), 0);
    }
}

fn import(archive: &[u8], layers: Option<&[&[u8]]>) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let base = if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm") } else { Path::new("/tmp") };
    let dir = base.join(format!("pvisor-fuzz-import-{}-{}", std::process::id(), RUN.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).expect("creating the pool's directory");
    let path = dir.join("image.tar");
    std::fs::write(&path, archive).expect("writing the archive");
    let pool = Pool::open_with(&dir.join("pool"), Options { id_shift: None, level: 1 }).expect("opening a pool");
    if let Ok(records) = pool.import(&path) {
        assert!(!records.is_empty());
        for record in &records {
            let view = pool.view(record).expect("an imported image has a view");
            view.index().check().expect("an imported index is valid");
            assert_eq!(view.index().logical_size(), record.size_bytes);
            if let Some(layers) = layers {
                let flat = pvisor_images::fuzzing::flatten_layers(layers).expect("what imports also flattens");
                assert_eq!(shape(view.index()), shape(&flat), "the pool's tree differs from the flattened one");
            }
            check_content(&view);
            check_erofs(view);
        }
    }
    drop(pool);
    std::fs::remove_dir_all(&dir).expect("removing the pool");
}

fuzz_target!(|data: &[u8]| {
    if data.get(257..262) == Some(b"ustar") {
        import(data, None);
        return;
    }
    let parts = split(data);
    let (config, layers) = parts.split_first().expect("split gives at least one part");
    import(&oci_layout(config, layers), Some(layers));
});

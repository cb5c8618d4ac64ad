//! A small image imported into a pool and served as a read-only virtio-blk disk through its
//! erofs view, as the vm backend serves a sandbox's root file system.

use std::path::Path;
use std::sync::Arc;

use pvisor_images::erofs::ErofsView;
use pvisor_images::{Options, Pool};
use sha2::{Digest, Sha256};

/// The content of the image's `/data/blob`: big enough to span several blocks, and no block
/// of it equal to another.
pub fn blob() -> Vec<u8> {
    (0..96 * 1024u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes()).collect()
}

fn tar_entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_mtime(1_600_000_000);
    b.append_data(&mut h, name, data).expect("tar entry");
}

/// A docker-archive (`docker save` layout) of one image with one uncompressed layer.
fn docker_archive() -> Vec<u8> {
    let mut layer = tar::Builder::new(Vec::new());
    tar_entry(&mut layer, "etc/", tar::EntryType::Directory, 0o755, b"");
    tar_entry(&mut layer, "etc/hostname", tar::EntryType::Regular, 0o644, b"vguest\n");
    tar_entry(&mut layer, "data/", tar::EntryType::Directory, 0o755, b"");
    tar_entry(&mut layer, "data/blob", tar::EntryType::Regular, 0o644, &blob());
    let layer = layer.into_inner().expect("layer tar");
    let layer_hex = hex::encode(Sha256::digest(&layer));
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/bin/sh"]}},"rootfs":{{"type":"layers","diff_ids":["sha256:{layer_hex}"]}}}}"#
    );
    let config_name = format!("{}.json", hex::encode(Sha256::digest(config.as_bytes())));
    let layer_name = format!("{layer_hex}/layer.tar");
    let manifest = format!(r#"[{{"Config":"{config_name}","RepoTags":["vguest:latest"],"Layers":["{layer_name}"]}}]"#);
    let mut archive = tar::Builder::new(Vec::new());
    tar_entry(&mut archive, &layer_name, tar::EntryType::Regular, 0o644, &layer);
    tar_entry(&mut archive, &config_name, tar::EntryType::Regular, 0o644, config.as_bytes());
    tar_entry(&mut archive, "manifest.json", tar::EntryType::Regular, 0o644, manifest.as_bytes());
    archive.into_inner().expect("archive tar")
}

/// Two erofs views of the same image: `disk` to serve, `check` for the test's own reads.
/// Separate views have separate chunk caches, so what the test reads does not warm the disk's:
/// the device thread reads the pool itself.
pub struct Views {
    pub disk: Arc<ErofsView>,
    pub check: ErofsView,
}

/// Imports the test image into a pool under `dir` and returns two views of it.
pub fn image_views(dir: &Path) -> Views {
    let archive = dir.join("image.tar");
    std::fs::write(&archive, docker_archive()).expect("writing the archive");
    let pool = Pool::open_with(&dir.join("pool"), Options::default()).expect("opening the pool");
    let records = pool.import(&archive).expect("importing the archive");
    let view = || {
        let image = pool.view(&records[0]).expect("the image's view");
        ErofsView::new(Arc::new(image)).expect("building the erofs view")
    };
    Views { disk: Arc::new(view()), check: view() }
}

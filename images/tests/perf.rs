//! Throughput of unpacking a plain layer. Ignored by default; run with
//! `cargo test --release -p pvisor-images --test perf -- --ignored --nocapture`.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::Instant;

use pvisor_images::{ImageStore, Options};
use sha2::{Digest, Sha256};

/// Writes a layer tar of `big` files of `big_size` bytes plus `small` 4 KiB files.
fn write_layer(path: &Path, big: usize, big_size: usize, small: usize) -> u64 {
    let mut b = tar::Builder::new(BufWriter::new(File::create(path).unwrap()));
    let chunk: Vec<u8> = (0..big_size).map(|i| (i * 7 % 251) as u8).collect();
    let mut total = 0u64;
    for i in 0..big {
        let mut h = tar::Header::new_gnu();
        h.set_size(chunk.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("big/{i}.bin"), &chunk[..]).unwrap();
        total += chunk.len() as u64;
    }
    for i in 0..small {
        let mut h = tar::Header::new_gnu();
        h.set_size(4096);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("small/{}/{i}", i % 100), &chunk[..4096]).unwrap();
        total += 4096;
    }
    b.into_inner().unwrap().flush().unwrap();
    total
}

fn sha256_file(path: &Path) -> String {
    let mut f = File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

fn run(label: &str, big: usize, big_size: usize, small: usize) {
    let dir = tempfile::tempdir().unwrap();
    let layer = dir.path().join("layer.tar");
    let bytes = write_layer(&layer, big, big_size, small);
    let diff_id = sha256_file(&layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "config": {"Cmd": ["/x"]}, "rootfs": {"type": "layers", "diff_ids": [diff_id]}
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": "config.json", "RepoTags": ["perf:latest"], "Layers": ["layer/layer.tar"]}
    ]))
    .unwrap();
    let archive = dir.path().join("image.tar");
    {
        let mut b = tar::Builder::new(BufWriter::new(File::create(&archive).unwrap()));
        for (name, data) in [("config.json", &config), ("manifest.json", &manifest)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, &data[..]).unwrap();
        }
        b.append_path_with_name(&layer, "layer/layer.tar").unwrap();
        b.into_inner().unwrap().flush().unwrap();
    }
    std::fs::remove_file(&layer).unwrap();

    let store = ImageStore::open_with(&dir.path().join("store"), Options { id_shift: None }).unwrap();
    let start = Instant::now();
    let rec = store.import(&archive).unwrap().remove(0);
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(rec.size_bytes, bytes);
    let mbps = bytes as f64 / secs / 1e6;
    println!("{label}: {:.0} MB in {secs:.2}s = {mbps:.0} MB/s", bytes as f64 / 1e6);
}

#[test]
#[ignore]
fn plain_layer_throughput() {
    run("large files", 64, 8 << 20, 0);
    run("4 KiB files", 0, 4096, 40_000);
}

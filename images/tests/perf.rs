//! Import throughput of the pool: MB/s of uncompressed layer data, for big
//! incompressible files, big compressible files, many small files, the same
//! content again in another image (deduplicated), and a re-import. Prints
//! numbers, asserts only correctness. Ignored by default; run with
//! `cargo test --release -p pvisor-images --test perf -- --ignored --nocapture --test-threads=1`.

mod common;

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::time::Instant;

use common::{options, Rng};
use pvisor_images::{ImportEvent, ImportStats, Pool};
use sha2::{Digest, Sha256};

/// What goes into a layer.
#[derive(Clone, Copy)]
enum Content {
    /// Random bytes (does not compress).
    Random,
    /// Text-like bytes (compresses about 3:1).
    Text,
}

/// Writes a layer tar of `big` files of `big_size` bytes plus `small`
/// files of 4 KiB (all different). `salt` varies paths (not content).
/// Returns the bytes of file content.
fn write_layer(path: &Path, content: Content, big: usize, big_size: usize, small: usize, salt: &str) -> u64 {
    let mut b = tar::Builder::new(BufWriter::new(File::create(path).unwrap()));
    let mut rng = Rng(42);
    let mut gen = |n: usize| match content {
        Content::Random => rng.bytes(n),
        Content::Text => rng.text(n),
    };
    let mut total = 0u64;
    for i in 0..big {
        let data = gen(big_size);
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("{salt}big/{i}.bin"), &data[..]).unwrap();
        total += data.len() as u64;
    }
    for i in 0..small {
        let data = gen(4096);
        let mut h = tar::Header::new_gnu();
        h.set_size(4096);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("{salt}small/{}/{i}", i % 100), &data[..]).unwrap();
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

/// A docker archive of one single-layer image.
fn write_archive(dir: &Path, name: &str, content: Content, big: usize, big_size: usize, small: usize) -> (u64, u64) {
    let layer = dir.join("layer.tar");
    let bytes = write_layer(&layer, content, big, big_size, small, name);
    let layer_bytes = std::fs::metadata(&layer).unwrap().len();
    let config = serde_json::to_vec(&serde_json::json!({
        "config": {"Cmd": [format!("/{name}")]}, "rootfs": {"type": "layers", "diff_ids": [sha256_file(&layer)]}
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": "config.json", "RepoTags": [format!("perf/{name}:latest")], "Layers": ["layer/layer.tar"]}
    ]))
    .unwrap();
    let mut b = tar::Builder::new(BufWriter::new(File::create(dir.join(format!("{name}.tar"))).unwrap()));
    for (member, data) in [("config.json", &config), ("manifest.json", &manifest)] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, member, &data[..]).unwrap();
    }
    b.append_path_with_name(&layer, "layer/layer.tar").unwrap();
    b.into_inner().unwrap().flush().unwrap();
    std::fs::remove_file(&layer).unwrap();
    (bytes, layer_bytes)
}

/// Imports `dir/name.tar` into `pool` and prints the throughput.
fn import(pool: &Pool, dir: &Path, label: &str, name: &str, file_bytes: u64) -> ImportStats {
    let mut done = None;
    let start = Instant::now();
    let rec = pool
        .import_with(&dir.join(format!("{name}.tar")), &mut |e| {
            if let ImportEvent::Done { stats, reused, .. } = e {
                done = Some((stats, reused));
            }
        })
        .unwrap()
        .remove(0);
    let wall = start.elapsed().as_secs_f64();
    let (stats, reused) = done.unwrap();
    assert_eq!(rec.size_bytes, file_bytes);
    let layer_mb = stats.layer_bytes as f64 / 1e6;
    let rate = if reused { String::from("reused") } else { format!("{:.0} MB/s", layer_mb / stats.seconds) };
    println!(
        "{label:<34} {layer_mb:>7.0} MB in {wall:>6.2}s = {rate:>9}; new chunks {:>5}, stored {:>6.1} MB of {:>6.1} MB",
        stats.new_chunks,
        stats.new_compressed as f64 / 1e6,
        stats.new_bytes as f64 / 1e6,
    );
    stats
}

#[test]
#[ignore = "measurement; run in release"]
fn import_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pool = Pool::open_with(&d.join("pool"), options()).unwrap();
    println!("zstd level {}, {} cpus", options().level, std::thread::available_parallelism().map_or(1, |n| n.get()));

    let (bytes, _) = write_archive(d, "random", Content::Random, 64, 8 << 20, 0);
    import(&pool, d, "512 MiB random, 8 MiB files", "random", bytes);
    // The same files again, other paths, other image: hashed, not stored.
    let (bytes2, _) = write_archive(d, "random-again", Content::Random, 64, 8 << 20, 0);
    let again = import(&pool, d, "  the same content, another image", "random-again", bytes2);
    assert_eq!(again.new_chunks, 0);
    import(&pool, d, "  re-import of the first archive", "random", bytes);

    let (bytes, _) = write_archive(d, "text", Content::Text, 32, 8 << 20, 0);
    import(&pool, d, "256 MiB text, 8 MiB files", "text", bytes);

    let (bytes, _) = write_archive(d, "small", Content::Text, 0, 0, 40_000);
    import(&pool, d, "40000 4 KiB text files", "small", bytes);

    let du = pool.du().unwrap();
    println!(
        "pool: logical {:.0} MB, deduplicated {:.0} MB, stored {:.0} MB, allocated {:.0} MB, {} chunks in {} packs",
        du.logical_bytes as f64 / 1e6,
        du.deduplicated_bytes as f64 / 1e6,
        du.compressed_bytes as f64 / 1e6,
        du.allocated_bytes as f64 / 1e6,
        du.chunks,
        du.packs
    );
    let start = Instant::now();
    pool.remove("perf/random").unwrap();
    pool.remove("perf/random-again").unwrap();
    let gc = pool.gc().unwrap();
    println!(
        "gc after removing both random images: {:.2}s, {} packs removed, {} rewritten, {:.0} MB -> {:.0} MB",
        start.elapsed().as_secs_f64(),
        gc.packs_removed,
        gc.packs_rewritten,
        gc.allocated_before as f64 / 1e6,
        gc.allocated_after as f64 / 1e6
    );
}

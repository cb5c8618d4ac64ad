//! What the pool adds over unpacking: deduplication, compression, gc,
//! views that survive gc, crash safety, progress events, xattrs.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use pvisor_images::pool::index::{Data, Index};
use pvisor_images::pool::pack::Catalog;
use pvisor_images::pool::{CHUNK_SIZE, SMALL};
use pvisor_images::{ImageRecord, ImportEvent, ImportStats, Pool};
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

/// A single-image docker archive; `cmd` makes the image id unique.
fn docker_image(tag: &str, cmd: &str, layers: Vec<Layer>) -> Members {
    docker_members(
        &[DockerImage { tags: vec![tag.into()], config: run_config(&[], &[cmd], &[], "", ""), layers }],
        false,
    )
}

fn plain(b: LayerBuilder) -> Layer {
    Layer::new(b.build(), Comp::Plain)
}

/// Imports and returns the record and the stats of the (single) image.
fn import_stats(pool: &Pool, path: &Path) -> (ImageRecord, ImportStats, bool) {
    let mut done = None;
    let rec = pool
        .import_with(path, &mut |e| {
            if let ImportEvent::Done { stats, reused, .. } = e {
                done = Some((stats, reused));
            }
        })
        .unwrap()
        .remove(0);
    let (stats, reused) = done.expect("no Done event");
    (rec, stats, reused)
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Digests of the chunks a big file (>= SMALL) is cut into.
fn file_chunks(data: &[u8]) -> Vec<[u8; 32]> {
    assert!(data.len() as u64 >= SMALL);
    data.chunks(CHUNK_SIZE).map(digest).collect()
}

/// Chunk digests an index references, each once.
fn referenced(index: &Index) -> HashSet<[u8; 32]> {
    index.chunks.iter().map(|c| c.digest).collect()
}

/// The chunk digests (with their extents) holding the file at `path`.
fn extents_of(index: &Index, path: &str) -> Vec<([u8; 32], u32, u32)> {
    let ino = index.lookup_path(path).unwrap_or_else(|| panic!("{path}: not in the image"));
    match &index.inodes[ino as usize].data {
        Data::File { extents, .. } => {
            extents.iter().map(|x| (index.chunks[x.chunk as usize].digest, x.offset, x.len)).collect()
        }
        other => panic!("{path} is not a file: {other:?}"),
    }
}

fn catalog(env_root: &Path) -> Catalog {
    Catalog::load(&env_root.join("packs")).unwrap()
}

/// Every file of `rec` reads back as `expected` (path -> content), and the image has no other file.
fn assert_files(pool: &Pool, rec: &ImageRecord, expected: &BTreeMap<String, Vec<u8>>) {
    let got = files(&view(pool, rec));
    assert_eq!(got.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "file list of {}", rec.id);
    for (path, data) in expected {
        assert!(got[path] == *data, "{path}: content differs ({} vs {} bytes)", got[path].len(), data.len());
    }
}

#[test]
fn shared_layer_is_stored_once() {
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(1);
    let big = rng.bytes(MIB + 777);
    let mut base = LayerBuilder::new().file("usr/lib/big.so", &big, 0o755);
    for i in 0..20 {
        base = base.file(&format!("etc/f{i:02}"), &rng.text(2000 + i * 10), 0o644);
    }
    let base = plain(base);
    let a_only = rng.bytes(512 << 10);
    let a = docker_image(
        "a",
        "a",
        vec![base.clone(), plain(LayerBuilder::new().file("a/big", &a_only, 0o644).file("a/only", b"a only", 0o644))],
    );
    let b = docker_image("b", "b", vec![base.clone(), plain(LayerBuilder::new().file("b/only", b"b only!", 0o644))]);
    let (ra, sa, _) = import_stats(&pool, &env.archive("a.tar", &a));
    let (rb, sb, _) = import_stats(&pool, &env.archive("b.tar", &b));
    println!("a: {sa:?}\nb: {sb:?}");
    // A's chunks: big.so (9), a/big (4), one bundle of small files.
    assert_eq!(sa.new_chunks, 9 + 4 + 1);
    // B only adds a bundle holding its one new small file.
    assert_eq!(sb.new_chunks, 1, "{sb:?}");
    assert_eq!(sb.new_bytes, 7);
    assert_eq!(sb.file_bytes, rb.size_bytes);

    let (ia, ib) = (pool.index(&ra.id).unwrap(), pool.index(&rb.id).unwrap());
    assert_eq!(extents_of(&ia, "usr/lib/big.so"), extents_of(&ib, "usr/lib/big.so"));
    for i in 0..20 {
        let p = format!("etc/f{i:02}");
        assert_eq!(extents_of(&ia, &p), extents_of(&ib, &p), "{p} is not shared");
    }
    let du = pool.du().unwrap();
    println!("{du:#?}");
    let distinct: HashSet<_> = referenced(&ia).union(&referenced(&ib)).copied().collect();
    assert_eq!(du.chunks, distinct.len() as u64);
    assert_eq!(du.chunks, sa.new_chunks + sb.new_chunks);
    assert_eq!(du.logical_bytes, ra.size_bytes + rb.size_bytes);
    assert_eq!(du.deduplicated_bytes, sa.new_bytes + sb.new_bytes);
    // The shared layer counts once.
    let shared = (big.len() + (0..20).map(|i| 2000 + i * 10).sum::<usize>()) as u64;
    assert_eq!(du.deduplicated_bytes, du.logical_bytes - shared);
    assert_eq!(du.unreferenced_bytes, 0);
    for rec in [&ra, &rb] {
        assert_eq!(read(&pool, rec, "usr/lib/big.so"), big);
    }
    env.assert_store_clean();
}

#[test]
fn same_big_file_in_different_layers_is_stored_once() {
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(2);
    // Not a multiple of the chunk size: the short tail chunk is shared too.
    let x = rng.bytes(2 * MIB + 12_345);
    let a = docker_image("a", "a", vec![plain(LayerBuilder::new().file_at("opt/a/data.bin", &x, 0o644, 1))]);
    // Other paths, modes and mtimes, other layers, and twice in one image.
    let b = docker_image(
        "b",
        "b",
        vec![
            Layer::new(
                LayerBuilder::new().file_at("srv/copy.bin", &x, 0o600, 2).file("srv/other", b"other", 0o644).build(),
                Comp::Zstd,
            ),
            Layer::new(LayerBuilder::new().file_at("srv/again.bin", &x, 0o755, 3).build(), Comp::Gzip),
        ],
    );
    let (ra, sa, _) = import_stats(&pool, &env.archive("a.tar", &a));
    let (rb, sb, _) = import_stats(&pool, &env.archive("b.tar", &b));
    assert_eq!(sa.new_chunks, 17);
    assert_eq!(sa.new_bytes, x.len() as u64);
    assert_eq!(sb.file_bytes, 2 * x.len() as u64 + 5);
    assert_eq!((sb.new_chunks, sb.new_bytes), (1, 5), "only the small file is new: {sb:?}");
    let (ia, ib) = (pool.index(&ra.id).unwrap(), pool.index(&rb.id).unwrap());
    let want: Vec<_> =
        file_chunks(&x).into_iter().zip(x.chunks(CHUNK_SIZE)).map(|(d, c)| (d, 0, c.len() as u32)).collect();
    assert_eq!(extents_of(&ia, "opt/a/data.bin"), want);
    assert_eq!(extents_of(&ib, "srv/copy.bin"), want);
    assert_eq!(extents_of(&ib, "srv/again.bin"), want);
    assert_eq!(ib.chunks.len(), 18, "one chunk table entry per distinct chunk");
    assert_ne!(lookup(&pool, &rb, "srv/copy.bin"), lookup(&pool, &rb, "srv/again.bin"), "copies are not hardlinks");
    assert_eq!(perm(&stat(&pool, &rb, "srv/again.bin")), 0o755);
    assert_eq!(stat(&pool, &rb, "srv/again.bin").mtime, 3);

    let du = pool.du().unwrap();
    assert_eq!(du.logical_bytes, 3 * x.len() as u64 + 5);
    assert_eq!(du.deduplicated_bytes, x.len() as u64 + 5);
    assert_eq!(du.chunks, 18);
    assert!(du.compressed_bytes >= x.len() as u64, "random data does not compress");
    assert!(du.allocated_bytes < du.logical_bytes / 2, "{du:?}");
    for (rec, path) in [(&ra, "opt/a/data.bin"), (&rb, "srv/copy.bin"), (&rb, "srv/again.bin")] {
        assert!(read(&pool, rec, path) == x, "{path}");
    }
    env.assert_store_clean();
}

#[test]
fn identical_small_file_is_shared_between_images() {
    let env = Env::new();
    let pool = env.pool();
    let os_release = b"NAME=pvisor\nVERSION=1\n".to_vec();
    let a = docker_image(
        "a",
        "a",
        vec![plain(
            LayerBuilder::new().file("etc/aaa", b"only in a", 0o644).file("etc/os-release", &os_release, 0o644).file(
                "etc/zzz",
                b"also only in a",
                0o644,
            ),
        )],
    );
    let b = docker_image(
        "b",
        "b",
        vec![plain(
            LayerBuilder::new()
                .file("etc/bbb", b"only in b", 0o644)
                .file("usr/lib/os-release", &os_release, 0o444)
                .file("usr/lib/empty", b"", 0o644),
        )],
    );
    let (ra, _, _) = import_stats(&pool, &env.archive("a.tar", &a));
    let (rb, sb, _) = import_stats(&pool, &env.archive("b.tar", &b));
    let (ia, ib) = (pool.index(&ra.id).unwrap(), pool.index(&rb.id).unwrap());
    let (xa, xb) = (extents_of(&ia, "etc/os-release"), extents_of(&ib, "usr/lib/os-release"));
    assert_eq!(xa.len(), 1);
    assert_eq!(xa, xb, "the same bytes of the same chunk");
    // B's own bundle holds only what A does not have.
    assert_eq!((sb.new_chunks, sb.new_bytes), (1, 9), "{sb:?}");
    assert_ne!(extents_of(&ib, "etc/bbb")[0].0, xb[0].0);
    assert!(extents_of(&ib, "usr/lib/empty").iter().all(|x| x.2 == 0));
    assert_eq!(read(&pool, &rb, "usr/lib/os-release"), os_release);
    assert_eq!(read(&pool, &rb, "usr/lib/empty"), b"");
    // Still readable once A, whose bundle holds it, is gone.
    pool.remove("a").unwrap();
    pool.gc().unwrap();
    assert_eq!(read(&pool, &rb, "usr/lib/os-release"), os_release);
    assert_eq!(read(&pool, &rb, "etc/bbb"), b"only in b");
    assert_eq!(pool.du().unwrap().unreferenced_bytes, 0);
    env.assert_store_clean();
}

#[test]
fn images_of_one_archive_share_content() {
    // `docker save a b` of two images with a common base layer.
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(3);
    let big = rng.bytes(300_000);
    let mut base = LayerBuilder::new().file("lib/big", &big, 0o644);
    for i in 0..10 {
        base = base.file(&format!("etc/f{i}"), &rng.text(1000), 0o644);
    }
    let base = plain(base);
    let images = [
        DockerImage {
            tags: vec!["a".into()],
            config: run_config(&[], &["a"], &[], "", ""),
            layers: vec![base.clone(), plain(LayerBuilder::new().file("a", b"a", 0o644))],
        },
        DockerImage {
            tags: vec!["b".into()],
            config: run_config(&[], &["b"], &[], "", ""),
            layers: vec![base, plain(LayerBuilder::new().file("b", b"b", 0o644))],
        },
    ];
    let records = pool.import(&env.archive("ab.tar", &docker_members(&images, false))).unwrap();
    let (ia, ib) = (pool.index(&records[0].id).unwrap(), pool.index(&records[1].id).unwrap());
    assert_eq!(extents_of(&ia, "lib/big"), extents_of(&ib, "lib/big"));
    let du = pool.du().unwrap();
    println!("{du:?}");
    for i in 0..10 {
        let p = format!("etc/f{i}");
        assert_eq!(extents_of(&ia, &p), extents_of(&ib, &p), "{p} is not shared");
    }
    assert_eq!(du.logical_bytes, 2 * (300_000 + 10_000) + 2);
    assert_eq!(du.deduplicated_bytes, 300_000 + 10_000 + 2, "the shared layer counts once: {du:?}");
    for rec in &records {
        assert!(read(&pool, rec, "lib/big") == big);
    }
    env.assert_store_clean();
}

#[test]
fn compressible_content_costs_little() {
    let env = Env::new();
    let pool = env.pool();
    let mut log = Vec::with_capacity(10 * MIB + 100);
    let mut i = 0u64;
    while log.len() < 10 * MIB {
        log.extend_from_slice(
            format!("2024-01-01T00:00:{:02}Z INFO request {i} served in {} ms\n", i % 60, i % 17).as_bytes(),
        );
        i += 1;
    }
    log.truncate(10 * MIB);
    let members = docker_image(
        "log",
        "log",
        vec![Layer::new(LayerBuilder::new().file("var/log/big.log", &log, 0o644).build(), Comp::Gzip)],
    );
    let (rec, stats, _) = import_stats(&pool, &env.archive("log.tar", &members));
    let du = pool.du().unwrap();
    println!("{stats:?}\n{du:?}");
    assert_eq!(stats.new_bytes, 10 * MIB as u64);
    assert!(stats.new_compressed < stats.new_bytes / 8, "{stats:?}");
    assert_eq!(du.logical_bytes, 10 * MIB as u64);
    assert!(du.compressed_bytes < du.logical_bytes / 8, "{du:?}");
    assert!(du.allocated_bytes < du.logical_bytes / 4, "allocated {} for 10 MiB", du.allocated_bytes);
    assert!(read(&pool, &rec, "var/log/big.log") == log);
}

#[test]
fn replaced_content_is_not_referenced_and_gc_removes_it() {
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(4);
    let big_old = rng.bytes(MIB);
    let mid_old = rng.bytes(200_000);
    let mid_new = rng.bytes(150_000);
    let l1 = LayerBuilder::new()
        .file("data/big.bin", &big_old, 0o644)
        .file("data/mid.bin", &mid_old, 0o644)
        .file("etc/conf", b"OLD SMALL CONTENT", 0o644)
        .file("etc/gone", b"DELETED SMALL CONTENT", 0o644)
        .file("opq/old", b"HIDDEN BY OPAQUE", 0o644)
        .file("etc/kept", b"kept", 0o644);
    let l2 = LayerBuilder::new()
        .whiteout("data/big.bin")
        .file("data/mid.bin", &mid_new, 0o644)
        .file("etc/conf", b"new small content", 0o644)
        .whiteout("etc/gone")
        .opaque("opq")
        .file("opq/new", b"new", 0o644);
    let members = docker_image("r", "r", vec![plain(l1), Layer::new(l2.build(), Comp::Zstd)]);
    let (rec, stats, _) = import_stats(&pool, &env.archive("r.tar", &members));
    println!("{stats:?}");
    // The big files were chunked as they streamed by, before the later layer said otherwise.
    assert_eq!(stats.replaced_bytes, (big_old.len() + mid_old.len()) as u64, "{stats:?}");
    let index = pool.index(&rec.id).unwrap();
    let stale: HashSet<_> = file_chunks(&big_old).into_iter().chain(file_chunks(&mid_old)).collect();
    assert!(referenced(&index).is_disjoint(&stale), "the index references replaced content");
    // The import ran gc: the replaced chunks are gone from the pool.
    let cat = catalog(&env.root);
    assert!(stale.iter().all(|d| !cat.contains(d)), "replaced chunks left in the pool");
    let du = pool.du().unwrap();
    assert_eq!(du.unreferenced_bytes, 0, "{du:?}");
    assert_eq!(du.chunks as usize, referenced(&index).len());
    // Small files are placed only once the final tree is known: deleted or
    // overwritten small content is never written at all.
    let mut all = Vec::new();
    for d in referenced(&index) {
        all.extend(cat.read(cat.get(&d).unwrap()).unwrap());
    }
    for gone in [&b"OLD SMALL CONTENT"[..], b"DELETED SMALL CONTENT", b"HIDDEN BY OPAQUE"] {
        assert!(!all.windows(gone.len()).any(|w| w == gone), "{} was stored", String::from_utf8_lossy(gone));
    }
    assert!(all.windows(17).any(|w| w == b"new small content"));
    assert_eq!(ls(&pool, &rec, "data"), ["mid.bin"]);
    assert_eq!(ls(&pool, &rec, "etc"), ["conf", "kept"]);
    assert_eq!(ls(&pool, &rec, "opq"), ["new"]);
    assert!(read(&pool, &rec, "data/mid.bin") == mid_new);
    assert_eq!(read(&pool, &rec, "etc/conf"), b"new small content");
    env.assert_store_clean();
}

/// Three images: A and B share a layer (big and small files), each has
/// unique content; C shares nothing.
fn three_images(env: &Env, pool: &Pool) -> [(ImageRecord, BTreeMap<String, Vec<u8>>); 3] {
    let mut rng = Rng(5);
    let shared_big = rng.bytes(700_000);
    let mut base = LayerBuilder::new().file("lib/shared.so", &shared_big, 0o755);
    let mut base_files = BTreeMap::from([("lib/shared.so".to_owned(), shared_big.clone())]);
    for i in 0..30 {
        let data = rng.text(500 + i * 37);
        base = base.file(&format!("etc/s{i:02}"), &data, 0o644);
        base_files.insert(format!("etc/s{i:02}"), data);
    }
    let base = plain(base);
    let mut out = Vec::new();
    for name in ["a", "b", "c"] {
        let unique_big = rng.bytes(400_000 + name.len());
        let unique_small = rng.text(3000);
        let top = LayerBuilder::new().file(&format!("{name}/big"), &unique_big, 0o644).file(
            &format!("{name}/small"),
            &unique_small,
            0o644,
        );
        let mut expected = BTreeMap::from([
            (format!("{name}/big"), unique_big.clone()),
            (format!("{name}/small"), unique_small.clone()),
        ]);
        let layers = if name == "c" {
            vec![plain(top)]
        } else {
            expected.extend(base_files.clone());
            vec![base.clone(), Layer::new(top.build(), Comp::Zstd)]
        };
        let rec =
            pool.import(&env.archive(&format!("{name}.tar"), &docker_image(name, name, layers))).unwrap().remove(0);
        assert_files(pool, &rec, &expected);
        out.push((rec, expected));
    }
    out.try_into().unwrap_or_else(|_| unreachable!())
}

#[test]
fn gc_after_remove_keeps_what_other_images_use() {
    let env = Env::new();
    let pool = env.pool();
    let [(a, a_files), (b, b_files), (c, c_files)] = three_images(&env, &pool);
    let (ia, ib, ic) = (pool.index(&a.id).unwrap(), pool.index(&b.id).unwrap(), pool.index(&c.id).unwrap());
    let nothing = pool.gc().unwrap();
    assert_eq!((nothing.packs_removed, nothing.packs_rewritten, nothing.chunks_removed), (0, 0, 0), "{nothing:?}");

    // Views opened before anything is removed or collected.
    let (va, vb, vc) = (view(&pool, &a), view(&pool, &b), view(&pool, &c));

    // A goes: its unique chunks are garbage, the shared ones are B's too.
    pool.remove("a").unwrap();
    let du = pool.du().unwrap();
    let a_only: HashSet<_> = referenced(&ia).difference(&referenced(&ib)).copied().collect();
    assert!(!a_only.is_empty());
    assert!(du.unreferenced_bytes > 400_000, "{du:?}");
    let report = pool.gc().unwrap();
    println!("{report:?}");
    // A's pack held the shared layer too: rewritten, not deleted.
    assert_eq!((report.packs_removed, report.packs_rewritten), (0, 1), "{report:?}");
    assert_eq!(report.chunks_removed, a_only.len() as u64);
    assert!(report.allocated_after < report.allocated_before);
    let cat = catalog(&env.root);
    assert!(a_only.iter().all(|d| !cat.contains(d)), "A's own chunks survived gc");
    assert!(referenced(&ib).iter().chain(&referenced(&ic)).all(|d| cat.contains(d)), "gc deleted a live chunk");
    assert_files(&pool, &b, &b_files);
    assert_files(&pool, &c, &c_files);
    assert_eq!(pool.du().unwrap().unreferenced_bytes, 0);

    // C goes: none of its chunks is shared, its pack is deleted outright.
    pool.remove(&c.id).unwrap();
    let report = pool.gc().unwrap();
    assert_eq!((report.packs_removed, report.packs_rewritten), (1, 0), "{report:?}");
    assert_eq!(report.chunks_removed, referenced(&ic).len() as u64);
    assert_files(&pool, &b, &b_files);
    let du = pool.du().unwrap();
    assert_eq!(du.unreferenced_bytes, 0);
    assert_eq!(du.chunks as usize, referenced(&ib).len());

    // The views opened earlier still read every file, although the packs
    // they read from were deleted or rewritten meanwhile.
    for (v, expected) in [(&va, &a_files), (&vb, &b_files), (&vc, &c_files)] {
        let got = files(v);
        assert_eq!(got.len(), expected.len());
        for (path, data) in expected {
            assert!(got[path] == *data, "{path} differs through a view opened before gc");
        }
    }
    // A new view of B reads from the rewritten pack.
    assert_files(&pool, &b, &b_files);

    // Removing the last image and collecting empties the pool.
    pool.remove("b").unwrap();
    pool.gc().unwrap();
    let du = pool.du().unwrap();
    assert_eq!((du.chunks, du.packs, du.unreferenced_bytes, du.logical_bytes), (0, 0, 0, 0), "{du:?}");
    assert_eq!(fs::read_dir(env.root.join("packs")).unwrap().count(), 0);
    env.assert_store_clean();
}

#[test]
fn gc_never_deletes_chunks_of_an_import_not_yet_published() {
    // An import writes (and publishes) its packs before the image's index
    // is published. A gc running meanwhile, from another handle or process,
    // must wait rather than take those chunks for garbage.
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(6);
    let old = DockerImage {
        tags: vec!["old".into()],
        config: run_config(&[], &["old"], &[], "", ""),
        layers: vec![plain(LayerBuilder::new().file("old", b"old", 0o644))],
    };
    pool.import(&env.archive("old.tar", &docker_members(std::slice::from_ref(&old), false))).unwrap();
    let big = rng.bytes(300_000);
    let new = DockerImage {
        tags: vec!["new".into()],
        config: run_config(&[], &["new"], &[], "", ""),
        layers: vec![plain(LayerBuilder::new().file("big", &big, 0o644).file("small", b"small", 0o644))],
    };
    // The new image is built first; the reused one is reported while the
    // new one is built but not yet published.
    let path = env.archive("both.tar", &docker_members(&[new, old], false));
    let mut gc_thread = None;
    let root = env.root.clone();
    let records = pool
        .import_with(&path, &mut |e| {
            if let ImportEvent::Done { reused: true, .. } = e {
                let root = root.clone();
                gc_thread = Some(std::thread::spawn(move || Pool::open_with(&root, options()).unwrap().gc().unwrap()));
                std::thread::sleep(Duration::from_millis(300));
            }
        })
        .unwrap();
    let report = gc_thread.expect("no reused event").join().unwrap();
    println!("{report:?}");
    assert_eq!(records[0].names, ["new:latest"]);
    assert!(read(&pool, &records[0], "big") == big, "the new image lost content to a concurrent gc");
    assert_eq!(read(&pool, &records[0], "small"), b"small");
    assert_eq!(read(&pool, &records[1], "old"), b"old");
    env.assert_store_clean();
}

#[test]
fn import_with_reports_progress() {
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(7);
    // Layers larger than the 8 MiB progress step report in between.
    let layers = vec![
        plain(LayerBuilder::new().file("a", &rng.bytes(9 * MIB), 0o644)),
        Layer::new(LayerBuilder::new().file("b", &rng.text(100_000), 0o644).build(), Comp::Gzip),
        Layer::new(LayerBuilder::new().file("c", b"c", 0o644).build(), Comp::Zstd),
    ];
    let plain_total: u64 = layers.iter().map(|l| l.plain.len() as u64).sum();
    let blob_sizes: Vec<u64> = layers.iter().map(|l| l.blob().len() as u64).collect();
    let path = env.archive("p.tar", &docker_image("progress", "p", layers));
    let mut events = Vec::new();
    let rec = pool.import_with(&path, &mut |e| events.push(e)).unwrap().remove(0);
    for e in &events {
        println!("{}", serde_json::to_string(e).unwrap());
    }
    match &events[0] {
        ImportEvent::Image { id, names, layers, bytes } => {
            assert_eq!((id, names.as_slice(), *layers), (&rec.id, &["progress:latest".to_owned()][..], 3));
            assert_eq!(*bytes, blob_sizes.iter().sum::<u64>());
        }
        other => panic!("first event {other:?}"),
    }
    let mut last_done = [0u64; 3];
    let mut seen = [0usize; 3];
    for e in &events[1..events.len() - 1] {
        match e {
            ImportEvent::Layer { id, layer, layers, done, total } => {
                assert_eq!((id, *layers), (&rec.id, 3));
                assert!((1..=3).contains(layer));
                let i = layer - 1;
                assert!(
                    seen[..i].iter().all(|&n| n > 0) && seen[i + 1..].iter().all(|&n| n == 0),
                    "layers out of order"
                );
                assert_eq!(*total, blob_sizes[i]);
                assert!(*done >= last_done[i] && *done <= *total, "{e:?}");
                last_done[i] = *done;
                seen[i] += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(last_done, *<&[u64; 3]>::try_from(blob_sizes.as_slice()).unwrap(), "done == total at the end");
    assert!(seen[0] >= 2, "a 9 MiB layer reports progress before its end");
    match events.last().unwrap() {
        ImportEvent::Done { id, names, reused, stats } => {
            assert_eq!((id, names.as_slice(), *reused), (&rec.id, rec.names.as_slice(), false));
            assert_eq!(stats.layer_bytes, plain_total);
            assert_eq!(stats.file_bytes, 9 * MIB as u64 + 100_001);
            assert_eq!(stats.new_bytes, stats.file_bytes);
            assert!(stats.new_chunks >= 73 && stats.new_compressed > 0 && stats.seconds > 0.0, "{stats:?}");
            assert_eq!(stats.replaced_bytes, 0);
        }
        other => panic!("last event {other:?}"),
    }

    // Again: nothing to do, said so.
    let mut again = Vec::new();
    pool.import_with(&path, &mut |e| again.push(e)).unwrap();
    match again.as_slice() {
        [ImportEvent::Done { id, reused: true, stats, .. }] => {
            assert_eq!(id, &rec.id);
            assert_eq!((stats.new_chunks, stats.layer_bytes), (0, 0));
        }
        other => panic!("{other:?}"),
    }
    // The events serialize as tagged JSON for progress displays.
    let json = serde_json::to_value(&again[0]).unwrap();
    assert_eq!(json["event"], "done");
    assert_eq!(json["reused"], true);
}

#[test]
fn pax_xattrs_are_recorded() {
    let env = Env::new();
    let pool = env.pool();
    let cap = b"\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    let l1 = LayerBuilder::new()
        .pax(&[("SCHILY.xattr.user.comment", b"hello"), ("SCHILY.xattr.security.capability", cap)])
        .file("bin/ping", b"ping", 0o755)
        .pax(&[("SCHILY.xattr.trusted.overlay.opaque", b"y"), ("SCHILY.xattr.user.empty", b"")])
        .dir("dir/", 0o755)
        .pax(&[("SCHILY.xattr.user.link", b"on the link"), ("mtime", b"1234567890.5"), ("uid", b"1000")])
        .symlink("link", "bin/ping")
        .file("plain", b"no xattrs", 0o644)
        .file("redone", b"v1", 0o644);
    // A later layer replaces an entry: its xattrs go with it.
    let l2 = LayerBuilder::new().pax(&[("SCHILY.xattr.user.v", b"2")]).file("redone", b"v2", 0o644);
    let members = docker_image("x", "x", vec![plain(l1), Layer::new(l2.build(), Comp::Gzip)]);
    let rec = pool.import(&env.archive("x.tar", &members)).unwrap().remove(0);
    let xattrs = |p: &str| -> Vec<(String, Vec<u8>)> {
        stat(&pool, &rec, p).xattrs.into_iter().map(|x| (String::from_utf8(x.name).unwrap(), x.value)).collect()
    };
    assert_eq!(
        xattrs("bin/ping"),
        [("security.capability".to_owned(), cap.to_vec()), ("user.comment".to_owned(), b"hello".to_vec())],
        "sorted by name, binary values kept"
    );
    assert_eq!(
        xattrs("dir"),
        [("trusted.overlay.opaque".to_owned(), b"y".to_vec()), ("user.empty".to_owned(), vec![])]
    );
    assert_eq!(xattrs("link"), [("user.link".to_owned(), b"on the link".to_vec())]);
    let link = stat(&pool, &rec, "link");
    assert_eq!((link.mtime, link.uid), (1_234_567_890, 1000), "PAX mtime and uid override the header");
    assert!(xattrs("plain").is_empty(), "a PAX header applies to the next entry only");
    assert_eq!(xattrs("redone"), [("user.v".to_owned(), b"2".to_vec())]);
    assert_eq!(read(&pool, &rec, "redone"), b"v2");
    assert_eq!(read(&pool, &rec, "bin/ping"), b"ping");
}

// ---- crash safety ---------------------------------------------------------------

const CRASH_POOL_VAR: &str = "PVISOR_TEST_CRASH_POOL";
const CRASH_ARCHIVE_VAR: &str = "PVISOR_TEST_CRASH_ARCHIVE";
const CRASH_TAG: &str = "crash:latest";

/// Run by [`import_survives_being_killed`] in a child process, which it kills.
#[test]
#[ignore = "a child process of import_survives_being_killed"]
fn crash_child_import() {
    let (Some(root), Some(archive)) = (std::env::var_os(CRASH_POOL_VAR), std::env::var_os(CRASH_ARCHIVE_VAR)) else {
        eprintln!("{CRASH_POOL_VAR} and {CRASH_ARCHIVE_VAR} are not set: nothing to do");
        return;
    };
    let pool = Pool::open_with(Path::new(&root), options()).unwrap();
    pool.import(Path::new(&archive)).unwrap();
}

/// The archive the crash test imports, and what its image holds.
struct CrashArchive {
    path: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
    /// Content of a big file a later layer overwrites (chunked, then garbage).
    replaced: Vec<u8>,
    plain_bytes: u64,
}

/// About 82 MB in three layers: 72 MiB of incompressible files (more than
/// one 64 MiB pack, published while the import still runs), then 1500
/// small and a few medium text files (zstd layer), then whiteouts and an
/// overwritten big file.
fn crash_archive(dir: &Path) -> CrashArchive {
    let mut rng = Rng(8);
    let mut files = BTreeMap::new();
    let mut l1 = LayerBuilder::new();
    for i in 0..9 {
        let data = rng.bytes(8 * MIB);
        l1 = l1.file(&format!("big/{i}.bin"), &data, 0o644);
        files.insert(format!("big/{i}.bin"), data);
    }
    let replaced = rng.bytes(MIB);
    l1 = l1.file("big/replaced.bin", &replaced, 0o644);
    let mut l2 = LayerBuilder::new();
    for i in 0..1500 {
        let len = 100 + rng.below(6000) as usize;
        let data = rng.text(len);
        let path = format!("src/d{}/f{i}.txt", i % 40);
        l2 = l2.file(&path, &data, 0o644);
        files.insert(path, data);
    }
    for i in 0..6 {
        let data = rng.text(500 << 10);
        l2 = l2.file(&format!("med/{i}.txt"), &data, 0o644);
        files.insert(format!("med/{i}.txt"), data);
    }
    l2 = l2.hardlink("src/link", "src/d0/f0.txt").symlink("latest", "big/0.bin");
    files.insert("src/link".into(), files["src/d0/f0.txt"].clone());
    let newer = rng.bytes(MIB);
    let l3 = LayerBuilder::new()
        .whiteout("src/d1")
        .whiteout("src/d0/f40.txt")
        .file("big/replaced.bin", &newer, 0o600)
        .file("final.txt", b"the end", 0o644);
    files.retain(|p, _| !p.starts_with("src/d1/") && p != "src/d0/f40.txt");
    files.insert("big/replaced.bin".into(), newer);
    files.insert("final.txt".into(), b"the end".to_vec());

    let layers = [l1.build(), l2.build(), l3.build()];
    let plain_bytes = layers.iter().map(|l| l.len() as u64).sum();
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Cmd": ["/crash"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": "config.json", "RepoTags": [CRASH_TAG], "Layers": ["l1/layer.tar", "l2/layer.tar", "l3/layer.tar"]}
    ]))
    .unwrap();
    let path = dir.join("crash.tar");
    let mut b = tar::Builder::new(std::io::BufWriter::new(fs::File::create(&path).unwrap()));
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    add("config.json", &config);
    add("l1/layer.tar", &layers[0]);
    add("l2/layer.tar", &zstd::encode_all(&layers[1][..], 3).unwrap());
    add("l3/layer.tar", &layers[2]);
    add("manifest.json", &manifest);
    b.into_inner().unwrap().into_inner().unwrap().sync_all().unwrap();
    CrashArchive { path, files, replaced, plain_bytes }
}

/// Catalog files in `packs/` (none before the pool exists).
fn catalogs(root: &Path) -> HashSet<String> {
    let Ok(dir) = fs::read_dir(root.join("packs")) else { return HashSet::new() };
    dir.map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.ends_with(".cat")).collect()
}

enum Kill {
    After(Duration),
    /// As soon as the child has published a pack.
    OnNewPack,
}

/// Runs [`crash_child_import`] on `root` and kills it. Returns whether it
/// finished before being killed.
fn run_and_kill(root: &Path, archive: &Path, kill: Kill) -> bool {
    let before = catalogs(root);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child_import", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CRASH_POOL_VAR, root)
        .env(CRASH_ARCHIVE_VAR, archive)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    match kill {
        Kill::After(delay) => std::thread::sleep(delay),
        Kill::OnNewPack => {
            let started = Instant::now();
            while child.try_wait().unwrap().is_none() && catalogs(root).is_subset(&before) {
                assert!(started.elapsed() < Duration::from_secs(300), "the child import hangs");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    let _ = child.kill(); // SIGKILL
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGKILL),
        "child import failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success()
}

/// After a kill: the pool opens, is consistent, and holds either the whole
/// image (identical to the cold import) or none of it. Returns whether it
/// holds it.
fn check_after_kill(root: &Path, cold: &ImageRecord, cold_index: &Index, files: &BTreeMap<String, Vec<u8>>) -> bool {
    let pool = Pool::open_with(root, options()).expect("the pool does not open after a kill");
    assert_pool_clean(root, true);
    let du = pool.du().expect("du after a kill");
    let list = pool.list().unwrap();
    let complete = match list.as_slice() {
        [] => false,
        [rec] => {
            assert_eq!(rec.id, cold.id);
            assert_eq!(pool.index(&rec.id).unwrap(), *cold_index, "the index differs from a cold import's");
            assert_files(&pool, rec, files);
            assert_eq!(du.logical_bytes, cold.size_bytes);
            true
        }
        more => panic!("unexpected images {more:?}"),
    };
    match pool.resolve(CRASH_TAG) {
        Ok(rec) => assert!(complete && rec.id == cold.id, "the name resolves to a missing image"),
        Err(pvisor_images::Error::NotFound(_)) => {
            assert!(!complete || list[0].names.is_empty(), "the image is named but does not resolve");
            if complete {
                println!("killed after the image was published but before its name was");
            }
        }
        Err(e) => panic!("resolve after a kill: {e}"),
    }
    complete
}

#[test]
fn import_survives_being_killed() {
    let work = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let archive = crash_archive(work.path());
    println!("archive: {} MB of layers in {:?}", archive.plain_bytes / 1_000_000, t.elapsed());

    // A cold import, undisturbed: what every outcome is compared with.
    let cold_pool = Pool::open_with(&work.path().join("cold"), options()).unwrap();
    let t = Instant::now();
    let (cold, cold_stats, _) = import_stats(&cold_pool, &archive.path);
    let cold_time = t.elapsed();
    println!("cold import: {cold_time:?}, {cold_stats:?}");
    assert_files(&cold_pool, &cold, &archive.files);
    let cold_index = cold_pool.index(&cold.id).unwrap();
    // Every chunk a cold import writes: the image's, and the replaced file's.
    let all_chunks: HashSet<[u8; 32]> =
        referenced(&cold_index).into_iter().chain(file_chunks(&archive.replaced)).collect();
    assert_eq!(cold_stats.new_chunks, all_chunks.len() as u64);
    drop(cold_pool);

    let seed = std::env::var("PVISOR_TEST_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    // About 20 s of rounds: 12 when imports are fast, at least 4.
    let default_rounds = (20_000 / (cold_time.as_millis() as u64 + 200)).clamp(4, 12) as u32;
    let rounds = std::env::var("PVISOR_TEST_CRASH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_rounds);
    println!("seed {seed} (PVISOR_TEST_CRASH_SEED), {rounds} rounds (PVISOR_TEST_CRASH_ROUNDS)");
    let mut rng = Rng(seed);
    let root = work.path().join("pool");
    let cold_ms = cold_time.as_millis() as u64;
    for round in 0..rounds {
        // Early (directories, spool, first chunks), anywhere, and late (last
        // pack, index, publication, names, the gc of replaced content).
        let ms = match round % 3 {
            0 => rng.below(300),
            1 => rng.below(cold_ms * 6 / 5),
            _ => cold_ms * 17 / 20 + rng.below(cold_ms * 2 / 5),
        };
        let finished = run_and_kill(&root, &archive.path, Kill::After(Duration::from_millis(ms)));
        let complete = check_after_kill(&root, &cold, &cold_index, &archive.files);
        println!(
            "round {round}: killed after {ms} ms: {}, {} packs",
            if complete { "image complete" } else { "no image" },
            catalogs(&root).len()
        );
        assert!(complete || !finished, "the import finished but the image is missing");
        if complete {
            // Start the next round from scratch.
            let pool = Pool::open_with(&root, options()).unwrap();
            pool.remove(CRASH_TAG).or_else(|_| pool.remove(&cold.id)).unwrap();
            pool.gc().unwrap();
        }
    }

    // Killed once the first pack is out: the next import reuses it. (The
    // child may win the race and finish first on a loaded machine: retry.)
    let mut attempts = 0;
    loop {
        let pool = Pool::open_with(&root, options()).unwrap();
        if !pool.list().unwrap().is_empty() {
            pool.remove(&cold.id).unwrap();
        }
        pool.gc().unwrap();
        assert_eq!(pool.du().unwrap().chunks, 0);
        drop(pool);
        let finished = run_and_kill(&root, &archive.path, Kill::OnNewPack);
        let complete = check_after_kill(&root, &cold, &cold_index, &archive.files);
        if !finished && !complete {
            break;
        }
        attempts += 1;
        assert!(attempts < 5, "the import always finished before it could be killed");
    }
    let published: HashSet<[u8; 32]> = {
        let cat = catalog(&root);
        all_chunks.iter().filter(|d| cat.contains(d)).copied().collect()
    };
    assert!(published.len() as u64 >= (64 * MIB / CHUNK_SIZE) as u64 * 9 / 10, "{} chunks published", published.len());

    // A normal import now: correct, and writes only what was not published.
    let pool = Pool::open_with(&root, options()).unwrap();
    assert!(pool.du().unwrap().unreferenced_bytes >= 60 * MIB as u64, "the published pack is unreferenced");
    let (rec, stats, reused) = import_stats(&pool, &archive.path);
    println!("after the kill: {stats:?}");
    assert!(!reused);
    assert_eq!(rec.id, cold.id);
    assert_eq!(rec.names, [CRASH_TAG]);
    assert_eq!(stats.new_chunks, (all_chunks.len() - published.len()) as u64);
    assert!(stats.new_chunks < cold_stats.new_chunks);
    assert_eq!(pool.index(&rec.id).unwrap(), cold_index);
    assert_files(&pool, &rec, &archive.files);
    assert_eq!(pool.resolve(CRASH_TAG).unwrap().id, cold.id);
    pool.gc().unwrap();
    let du = pool.du().unwrap();
    assert_eq!(du.unreferenced_bytes, 0, "{du:?}");
    assert_eq!(du.chunks as usize, referenced(&cold_index).len());
    assert_files(&pool, &rec, &archive.files);
    assert_pool_clean(&root, false);
}

/// Many small imports make many small packs; gc merges them into one (every
/// reader holds every pack open, so their number must stay bounded), and
/// every image still reads back.
#[test]
fn gc_merges_small_packs() {
    let env = Env::new();
    let pool = env.pool();
    let mut images = Vec::new();
    for i in 0..10 {
        let data = format!("image {i} ").repeat(100 + i).into_bytes();
        let path = env.archive(
            &format!("s{i}.tar"),
            &docker_image(&format!("s{i}:1"), "/x", vec![plain(LayerBuilder::new().file("x", &data, 0o644))]),
        );
        images.push((pool.import(&path).unwrap().remove(0), data));
    }
    let packs_before = catalog(pool.root()).packs.len();
    assert!(packs_before >= 10, "{packs_before} packs");
    let report = pool.gc().unwrap();
    assert_eq!(report.packs_merged, packs_before, "{report:?}");
    assert_eq!(catalog(pool.root()).packs.len(), 1);
    for (rec, data) in &images {
        assert_eq!(&pool.view(rec).unwrap().read_path("x").unwrap(), data);
    }
    assert_eq!(pool.du().unwrap().unreferenced_bytes, 0);
}

/// A name-table rewrite killed between writing its temp file and renaming it
/// (what round 10 of a CI run of `import_survives_being_killed` hit) leaves
/// nothing behind once the pool is opened again, and the old table stands.
#[test]
fn interrupted_name_table_write_is_cleaned_on_open() {
    let env = Env::new();
    drop(env.pool());
    fs::write(env.root.join("names.json"), br#"{"version":1,"names":{}}"#).unwrap();
    fs::write(env.root.join("names.json.tmp"), b"{\"version\":1,\"na").unwrap();
    let pool = env.pool();
    assert!(!env.root.join("names.json.tmp").exists(), "the interrupted write survived an open");
    assert_pool_clean(&env.root, false);
    assert!(pool.list().unwrap().is_empty());
}

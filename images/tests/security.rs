//! Hostile archives: every trick is refused (or confined to the image tree),
//! nothing is written outside the pool, and the pool is left unchanged (no
//! image, name or pack added).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use pvisor_images::pool::index::{Data, S_IFDIR, S_IFLNK, S_IFREG};
use pvisor_images::{Error, ImageRecord, Pool};

const GIB: u64 = 1 << 30;

fn docker_image(tag: &str, layers: Vec<Layer>) -> Members {
    docker_members(
        &[DockerImage { tags: vec![tag.into()], config: run_config(&[], &["/bin/true"], &[], "", ""), layers }],
        false,
    )
}

/// A pool with one good image in it.
fn seeded() -> (Env, Pool) {
    let env = Env::new();
    let pool = env.pool();
    let good = env.archive(
        "good.tar",
        &docker_image("good", vec![Layer::new(LayerBuilder::new().file("ok", b"ok", 0o644).build(), Comp::Plain)]),
    );
    pool.import(&good).unwrap();
    (env, pool)
}

/// Imports `members` expecting a refusal; checks nothing changed anywhere.
fn refused(members: &Members) -> Error {
    let (env, pool) = seeded();
    let before = listing(&pool);
    let packs = packs_snapshot(&env.root);
    let outside = env.outside_snapshot();
    let path = env.archive("evil.tar", members);
    let outside = {
        // The archive itself is the only new file outside the store.
        let mut o = outside;
        o.insert(path.strip_prefix(env.dir.path()).unwrap().to_path_buf(), sha256(&fs::read(&path).unwrap()));
        o
    };
    let err = pool.import(&path).expect_err("hostile archive was accepted");
    assert_eq!(listing(&pool), before, "pool contents changed");
    assert_eq!(packs_snapshot(&env.root), packs, "packs changed");
    assert_eq!(env.outside_snapshot(), outside, "something was written outside the store");
    assert_eq!(fs::read(env.outside.join("secret")).unwrap(), b"host secret");
    env.assert_store_clean();
    // A fresh handle sees the same thing.
    assert_eq!(listing(&env.pool()), before);
    assert_eq!(read(&pool, &pool.resolve("good").unwrap(), "ok"), b"ok");
    err
}

fn refused_layers(layers: Vec<Layer>) -> Error {
    refused(&docker_image("evil", layers))
}

fn assert_unsafe(err: &Error, entry_contains: &str) {
    match err {
        Error::Unsafe { entry, .. } => {
            assert!(entry.contains(entry_contains), "entry {entry:?}: {err}")
        }
        other => panic!("expected Error::Unsafe naming {entry_contains:?}, got {other:?}"),
    }
    assert!(err.to_string().contains(entry_contains), "{err}");
}

/// Imports layers that must succeed while staying inside the tree.
fn contained(layers: Vec<Layer>) -> (Env, Pool, ImageRecord) {
    let (env, pool) = seeded();
    let path = env.archive("tricky.tar", &docker_image("tricky", layers));
    let mut outside = env.outside_snapshot();
    outside.insert(path.strip_prefix(env.dir.path()).unwrap().to_path_buf(), sha256(&fs::read(&path).unwrap()));
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(env.outside_snapshot(), outside, "something was written outside the store");
    assert_eq!(fs::read(env.outside.join("secret")).unwrap(), b"host secret");
    env.assert_store_clean();
    (env, pool, rec)
}

fn plain(b: LayerBuilder) -> Layer {
    Layer::new(b.build(), Comp::Plain)
}

/// The image path an absolute host path names (where an absolute symlink lands).
fn inside(host: &Path, rest: &str) -> String {
    format!("{}/{rest}", host.strip_prefix("/").unwrap().display())
}

#[test]
fn dotdot_entries_refused() {
    let err = refused_layers(vec![plain(LayerBuilder::new().file("../evil", b"x", 0o644))]);
    assert_unsafe(&err, "../evil");
    let err = refused_layers(vec![plain(LayerBuilder::new().dir("a/", 0o755).file("a/../../evil", b"x", 0o644))]);
    assert_unsafe(&err, "a/../../evil");
    // In a later, compressed layer, after good ones.
    let err = refused_layers(vec![
        plain(LayerBuilder::new().file("fine", b"x", 0o644)),
        Layer::new(LayerBuilder::new().file("ok", b"x", 0o644).symlink("../../x", "/etc").build(), Comp::Gzip),
    ]);
    assert_unsafe(&err, "../../x");
    let err = refused_layers(vec![plain(LayerBuilder::new().file("/../abs-escape", b"x", 0o644))]);
    assert_unsafe(&err, "abs-escape");
    let err = refused_layers(vec![plain(LayerBuilder::new().file("a/.wh...", b"", 0o644))]);
    assert_unsafe(&err, ".wh..");
}

#[test]
fn refusal_after_content_was_chunked_leaves_no_trace() {
    // Big files are chunked into a pack as they stream by; a refusal later
    // in the same (or a later) layer drops that unpublished pack.
    let mut rng = Rng(9);
    let big = rng.bytes(3 << 20);
    let err = refused_layers(vec![plain(
        LayerBuilder::new().file("big", &big, 0o644).file("small", b"small", 0o644).file("../evil", b"x", 0o644),
    )]);
    assert_unsafe(&err, "../evil");
    let err = refused_layers(vec![
        plain(LayerBuilder::new().file("big", &big, 0o644)),
        Layer::new(LayerBuilder::new().file("more", &big[..1 << 20], 0o644).hardlink("h", "/nope").build(), Comp::Zstd),
    ]);
    assert_unsafe(&err, "h");
}

#[test]
fn absolute_paths_are_stripped() {
    let (_env, pool, rec) = contained(vec![plain(LayerBuilder::new().file("/etc/abs", b"abs", 0o644))]);
    assert_eq!(read(&pool, &rec, "etc/abs"), b"abs");
    assert_eq!(ls(&pool, &rec, ""), ["etc"]);
}

#[test]
fn symlinked_parent_to_absolute_host_path_stays_inside() {
    let (env, pool) = seeded();
    let layers = vec![
        plain(LayerBuilder::new().symlink("etc", env.outside.to_str().unwrap())),
        Layer::new(LayerBuilder::new().file("etc/passwd", b"root::0:0", 0o644).build(), Comp::Gzip),
    ];
    let path = env.archive("tricky.tar", &docker_image("tricky", layers));
    let mut outside = env.outside_snapshot();
    outside.insert(PathBuf::from("tricky.tar"), sha256(&fs::read(&path).unwrap()));
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(env.outside_snapshot(), outside, "wrote outside the store");
    assert!(!env.outside.join("passwd").exists());
    // The file lands at the symlink's target inside the image; the link stays.
    assert_eq!(read(&pool, &rec, &inside(&env.outside, "passwd")), b"root::0:0");
    assert_eq!(readlink(&pool, &rec, "etc"), env.outside.to_str().unwrap());
    env.assert_store_clean();
}

#[test]
fn symlinked_parent_climbing_out_stays_inside() {
    let (_env, pool, rec) = contained(vec![
        plain(LayerBuilder::new().symlink("etc", "../../..").symlink("deep", "a/../../../../../..")),
        plain(LayerBuilder::new().file("etc/passwd", b"pw", 0o644).file("deep/shadow", b"sh", 0o644)),
    ]);
    // "../../.." from the tree root is the tree root.
    assert_eq!(read(&pool, &rec, "passwd"), b"pw");
    assert_eq!(read(&pool, &rec, "shadow"), b"sh");
    assert!(stat(&pool, &rec, "a").is_dir(), "the dangling part of the chain is created inside");
    assert_eq!(stat(&pool, &rec, "etc").kind(), S_IFLNK);
    assert_eq!(ls(&pool, &rec, ""), ["a", "deep", "etc", "passwd", "shadow"]);
}

#[test]
fn symlink_then_write_in_same_layer_stays_inside() {
    let (env, pool) = seeded();
    let layer = LayerBuilder::new()
        .symlink("s", "/")
        .file("s/escaped", b"e", 0o644)
        .symlink("o", env.outside.to_str().unwrap())
        .file("o/secret", b"overwritten?", 0o644)
        .symlink("chain1", "chain2")
        .symlink("chain2", &format!("{}/new", env.outside.display()))
        .file("chain1/f", b"f", 0o644);
    let path = env.archive("same.tar", &docker_image("same", vec![plain(layer)]));
    let mut outside = env.outside_snapshot();
    outside.insert(PathBuf::from("same.tar"), sha256(&fs::read(&path).unwrap()));
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(env.outside_snapshot(), outside);
    assert_eq!(read(&pool, &rec, "escaped"), b"e");
    assert_eq!(read(&pool, &rec, &inside(&env.outside, "secret")), b"overwritten?");
    assert_eq!(read(&pool, &rec, &inside(&env.outside, "new/f")), b"f");
    assert!(!env.outside.join("new").exists());
    env.assert_store_clean();
}

#[test]
fn replacing_a_symlink_never_writes_through_it() {
    let (env, pool) = seeded();
    let target = env.outside.join("secret");
    let layers = vec![
        plain(
            LayerBuilder::new()
                .dir("etc/", 0o755)
                .symlink("etc/passwd", target.to_str().unwrap())
                .symlink("x", env.outside.to_str().unwrap())
                .symlink("hl-src", target.to_str().unwrap())
                .symlink("w", env.outside.to_str().unwrap())
                .symlink("o", env.outside.to_str().unwrap()),
        ),
        plain(
            LayerBuilder::new()
                .file("etc/passwd", b"replaced", 0o644)
                .dir("x/", 0o700)
                .file("x/secret", b"inside", 0o644)
                .hardlink("hl", "hl-src")
                .whiteout("w/secret")
                .opaque("o"),
        ),
    ];
    let path = env.archive("replace.tar", &docker_image("replace", layers));
    let mut outside = env.outside_snapshot();
    outside.insert(PathBuf::from("replace.tar"), sha256(&fs::read(&path).unwrap()));
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(env.outside_snapshot(), outside, "host files touched");
    assert_eq!(stat(&pool, &rec, "etc/passwd").kind(), S_IFREG);
    assert_eq!(read(&pool, &rec, "etc/passwd"), b"replaced");
    let x = stat(&pool, &rec, "x");
    assert_eq!(x.kind(), S_IFDIR);
    assert_eq!(perm(&x), 0o700);
    assert_eq!(read(&pool, &rec, "x/secret"), b"inside");
    // A hardlink to a symlink links the symlink itself.
    let hl = stat(&pool, &rec, "hl");
    assert_eq!(hl.data, Data::Symlink { target: target.to_str().unwrap().as_bytes().to_vec() });
    assert_eq!(hl.nlink, 2);
    assert_eq!(lookup(&pool, &rec, "hl"), lookup(&pool, &rec, "hl-src"));
    // Links through which a whiteout or opaque marker was applied stay links.
    assert_eq!(readlink(&pool, &rec, "w"), env.outside.to_str().unwrap());
    assert_eq!(readlink(&pool, &rec, "o"), env.outside.to_str().unwrap());
    env.assert_store_clean();
}

#[test]
fn hardlink_escapes_refused() {
    let err = refused_layers(vec![plain(LayerBuilder::new().hardlink("h", "../outside/secret"))]);
    assert_unsafe(&err, "h");
    assert!(err.to_string().contains(".."), "{err}");

    // Absolute host path: interpreted inside the image, where it does not exist.
    let (env, _) = seeded();
    let secret = env.outside.join("secret");
    let err = refused_layers(vec![plain(LayerBuilder::new().hardlink("h", secret.to_str().unwrap()))]);
    assert_unsafe(&err, "h");

    // Through a symlinked directory pointing at the host.
    let err = refused_layers(vec![
        plain(LayerBuilder::new().symlink("x", env.outside.to_str().unwrap())),
        plain(LayerBuilder::new().hardlink("y", "x/secret")),
    ]);
    assert_unsafe(&err, "y");

    // Missing target, directory target.
    let err = refused_layers(vec![plain(LayerBuilder::new().hardlink("h", "nope"))]);
    assert_unsafe(&err, "h");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = refused_layers(vec![plain(LayerBuilder::new().dir("d/", 0o755).hardlink("h", "d"))]);
    assert_unsafe(&err, "h");
}

#[test]
fn absurd_sizes_refused() {
    // Plain layer: more than 64 GiB, and more than the layer holds.
    let err = refused_layers(vec![plain(LayerBuilder::new().lying_size("huge", 100 * GIB, b"abc"))]);
    assert_unsafe(&err, "huge");
    let err = refused_layers(vec![plain(LayerBuilder::new().lying_size("big", 10 << 20, b"abc"))]);
    assert_unsafe(&err, "big");
    // Compressed layer: over the hard limit.
    let err =
        refused_layers(vec![Layer::new(LayerBuilder::new().lying_size("huge", 65 * GIB, b"abc").build(), Comp::Zstd)]);
    assert_unsafe(&err, "huge");
    // Compressed layer claiming more than it has: truncated.
    let err =
        refused_layers(vec![Layer::new(LayerBuilder::new().lying_size("short", 10 << 20, b"abc").build(), Comp::Gzip)]);
    assert!(matches!(&err, Error::BadArchive { entry: Some(e), .. } if e == "short"), "{err:?}");
}

#[test]
fn oversized_extension_header_refused() {
    // A GNU long-name entry of 6 MiB (the tar reader would buffer it in memory).
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(6 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    let layer = LayerBuilder::new().raw(&h, &vec![b'a'; 6 << 20]).file("x", b"x", 0o644).build();
    let err = refused_layers(vec![Layer::new(layer, Comp::Gzip)]);
    assert!(matches!(err, Error::Unsafe { .. }), "{err:?}");
}

#[test]
fn outer_archive_absurd_member_size_refused() {
    let outer = LayerBuilder::new()
        .file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644)
        .lying_size("index.json", 100 * GIB, b"{}")
        .build();
    let (env, pool) = seeded();
    let before = listing(&pool);
    let packs = packs_snapshot(&env.root);
    let err = pool.import(&env.write("outer.tar", &outer)).unwrap_err();
    assert!(matches!(&err, Error::BadArchive { entry: Some(e), .. } if e == "index.json"), "{err:?}");
    assert_eq!(listing(&pool), before);
    assert_eq!(packs_snapshot(&env.root), packs);
    env.assert_store_clean();
}

/// A one-file layer whose path may be long (GNU long-name entries).
fn long_name_layer(path: &str, data: &[u8]) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, path, data).unwrap();
    Layer::new(b.into_inner().unwrap(), Comp::Plain)
}

/// Paths past PATH_MAX are refused (their cost is bounded: an entry of
/// depth d costs O(d)); deep paths within it import.
#[test]
fn overlong_paths_refused_deep_paths_fine() {
    let deep = "a/".repeat(1900) + "f";
    let (env, pool) = seeded();
    let path = env.archive("deep.tar", &docker_image("deep:1", vec![long_name_layer(&deep, b"d")]));
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(read(&pool, &rec, &deep), b"d");

    let too_long = "a/".repeat(2100) + "f";
    let err = refused_layers(vec![long_name_layer(&too_long, b"x")]);
    assert_unsafe(&err, "a/a/a/");
    assert!(err.to_string().contains("longer than 4096"), "{err}");
}

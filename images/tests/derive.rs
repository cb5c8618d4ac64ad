//! Deriving an image from one in the pool plus a layer (how snapshots are
//! stored): the base tree is kept without re-reading it, the layer's
//! whiteouts, opaque dirs and hardlinks apply, content is deduplicated, and
//! removing the derived image (then gc) leaves the base and open views whole.

mod common;

use common::*;
use pvisor_images::pool::index::Data;
use pvisor_images::{DerivedImage, ImageConfig};

const KIB: usize = 1 << 10;

#[test]
fn layer_over_an_image_in_the_pool() {
    let env = Env::new();
    let pool = env.pool();
    let mut rng = Rng(7);
    let big = rng.bytes(300 * KIB);
    let base_layer = LayerBuilder::new()
        .dir("etc", 0o755)
        .file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644)
        .file("usr/big", &big, 0o755)
        .file("gone/x", b"x", 0o644)
        .file("opaque/old", b"old", 0o644)
        .file("linked", b"one inode", 0o644)
        .hardlink("linked2", "linked")
        .build();
    let members = docker_members(
        &[DockerImage {
            tags: vec!["base:1".into()],
            config: run_config(&["/bin/sh"], &["-c", "true"], &["PATH=/bin"], "/", ""),
            layers: vec![Layer::new(base_layer, Comp::Plain)],
        }],
        false,
    );
    let base = pool.import(&env.archive("base.tar", &members)).unwrap().remove(0);

    let layer = LayerBuilder::new()
        .whiteout("gone")
        .dir("opaque", 0o755)
        .opaque("opaque")
        .file("opaque/new", b"new", 0o644)
        .file("root/note", b"note", 0o600)
        .file("copy-of-big", &big, 0o644)
        .symlink("tmp/escape", "../../../etc/shadow")
        .build();
    let layer_path = env.write("layer.tar", &layer);
    let config = ImageConfig { env: vec!["PATH=/bin".into(), "SNAP=1".into()], ..base.config.clone() };
    let before = catalog_len(&env);
    let derived = pool
        .import_layer(&DerivedImage {
            base: &base.id,
            layer: &layer_path,
            config: config.clone(),
            name: "pvisor-snapshots:abc",
            label: "abc",
        })
        .unwrap();
    assert_ne!(derived.id, base.id);
    assert_eq!(derived.config, config);
    assert_eq!(pool.resolve("pvisor-snapshots:abc").unwrap().id, derived.id);
    // The big file's chunks were already there: only a bundle of small files is new.
    assert!(catalog_len(&env) - before <= 1, "content was not deduplicated");

    let v = view(&pool, &derived);
    assert_eq!(v.read_path("etc/passwd").unwrap(), b"root:x:0:0::/root:/bin/sh\n");
    assert_eq!(v.read_path("usr/big").unwrap(), big);
    assert_eq!(v.read_path("copy-of-big").unwrap(), big);
    assert_eq!(v.read_path("root/note").unwrap(), b"note");
    assert_eq!(v.read_path("opaque/new").unwrap(), b"new");
    assert!(!exists(&pool, &derived, "gone"));
    assert!(!exists(&pool, &derived, "opaque/old"));
    let index = pool.index(&derived.id).unwrap();
    let (a, b) = (index.lookup_path("linked").unwrap(), index.lookup_path("linked2").unwrap());
    assert_eq!(a, b, "the hardlink is one inode");
    assert_eq!(index.inodes[a as usize].nlink, 2);
    let esc = index.lookup_path("tmp/escape").unwrap();
    assert!(matches!(&index.inodes[esc as usize].data, Data::Symlink { target } if target == b"../../../etc/shadow"));

    // The base is untouched.
    assert!(exists(&pool, &base, "gone/x"));
    assert!(exists(&pool, &base, "opaque/old"));

    // Removing the derived image while a view is open, then gc: both stay readable.
    pool.remove(&derived.id).unwrap();
    pool.gc().unwrap();
    assert_eq!(v.read_path("root/note").unwrap(), b"note");
    assert_eq!(v.read_path("copy-of-big").unwrap(), big);
    assert_eq!(view(&pool, &base).read_path("usr/big").unwrap(), big);
    assert!(pool.resolve("pvisor-snapshots:abc").is_err());
}

#[test]
fn a_missing_base_is_not_found() {
    let env = Env::new();
    let pool = env.pool();
    let layer_path = env.write("layer.tar", &LayerBuilder::new().file("a", b"a", 0o644).build());
    let r = pool.import_layer(&DerivedImage {
        base: "sha256:0000000000000000000000000000000000000000000000000000000000000000",
        layer: &layer_path,
        config: ImageConfig::default(),
        name: "x:y",
        label: "x",
    });
    assert!(matches!(r, Err(pvisor_images::Error::NotFound(_))), "{r:?}");
}

fn catalog_len(env: &Env) -> usize {
    pvisor_images::pool::pack::Catalog::load(&env.root.join("packs")).unwrap().len()
}

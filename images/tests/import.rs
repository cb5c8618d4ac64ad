//! Importing docker-archive and OCI-layout tarballs and the resulting trees.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use common::*;
use pvisor_images::{Error, ImageConfig};

/// Three layers (plain, gzip, zstd) exercising every entry kind and whiteouts.
fn rich_layers() -> Vec<Layer> {
    let l1 = LayerBuilder::new()
        .dir("etc/", 0o755)
        .file("etc/hosts", b"127.0.0.1 localhost\n", 0o644)
        .file("etc/shadow", b"root:*:1::::::\n", 0o640)
        .dir("bin/", 0o755)
        .file("bin/sh", b"#!shell binary", 0o4755)
        .file("bin/wall", b"wall", 0o2755)
        .hardlink("bin/ash", "bin/sh")
        .dir("usr/", 0o755)
        .dir("usr/lib/", 0o755)
        .file("usr/lib/libc.so", b"libc", 0o644)
        .symlink("lib", "usr/lib")
        .symlink("abs-lib", "/usr/lib")
        .dir("a/", 0o755)
        .file("a/old1", b"old", 0o644)
        .dir("a/sub/", 0o755)
        .file("a/sub/old2", b"old", 0o644)
        .file("a/keep-me-not", b"old", 0o644)
        .dir("d/", 0o755)
        .file("d/x", b"x", 0o644)
        .file("f", b"plain file", 0o644)
        .dir("ro/", 0o555)
        .file("ro/orig", b"o", 0o444)
        .fifo("run/fifo")
        .file("gone/deep/file", b"bye", 0o644)
        .build();
    let l2 = LayerBuilder::new()
        .whiteout("etc/hosts")
        .whiteout("gone")
        // Opaque dir: entries of this layer survive whether listed before or after the marker.
        .file("a/new-before", b"new", 0o644)
        .file("a/sub/fresh", b"fresh", 0o644)
        .opaque("a")
        .file("a/new-after", b"new", 0o600)
        // dir -> file, file -> dir
        .file("d", b"now a file", 0o644)
        .dir("f/", 0o750)
        .file("f/inner", b"inner", 0o644)
        // Filling a read-only dir from an earlier layer.
        .file("ro/added", b"added", 0o644)
        .build();
    let l3 = LayerBuilder::new()
        .dir("tmp/", 0o1777)
        .file("lib/extra.so", b"through the symlink", 0o755)
        .file("abs-lib/abs.so", b"through the absolute symlink", 0o755)
        .file("/rooted/file", b"leading slash stripped", 0o644)
        .file("./dot/file", b"leading dot stripped", 0o644)
        .build();
    vec![Layer::new(l1, Comp::Plain), Layer::new(l2, Comp::Gzip), Layer::new(l3, Comp::Zstd)]
}

fn check_rich_tree(rootfs: &std::path::Path) {
    let rd = |p: &str| fs::read(rootfs.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let md = |p: &str| fs::symlink_metadata(rootfs.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let exists = |p: &str| fs::symlink_metadata(rootfs.join(p)).is_ok();

    // Whiteouts.
    assert!(!exists("etc/hosts"), "whited-out file survived");
    assert!(!exists("etc/.wh.hosts"), "whiteout marker materialized");
    assert!(!exists("gone"), "whited-out dir survived");
    assert_eq!(rd("etc/shadow"), b"root:*:1::::::\n");
    assert_eq!(md("etc/shadow").mode() & 0o7777, 0o640);

    // Opaque directory.
    let mut a: Vec<String> =
        fs::read_dir(rootfs.join("a")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    a.sort();
    assert_eq!(a, ["new-after", "new-before", "sub"]);
    let sub: Vec<String> =
        fs::read_dir(rootfs.join("a/sub")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(sub, ["fresh"], "old entries of a kept subdir must go too");
    assert_eq!(md("a/new-after").mode() & 0o7777, 0o600);

    // Modes incl. setuid / setgid / sticky.
    assert_eq!(md("bin/sh").mode() & 0o7777, 0o4755);
    assert_eq!(md("bin/wall").mode() & 0o7777, 0o2755);
    assert_eq!(md("tmp").mode() & 0o7777, 0o1777);
    assert!(md("tmp").is_dir());

    // Hardlink.
    assert_eq!(md("bin/ash").ino(), md("bin/sh").ino());
    assert_eq!(md("bin/sh").nlink(), 2);

    // Symlinks, and writes through them landing inside the tree.
    assert_eq!(fs::read_link(rootfs.join("lib")).unwrap().to_str(), Some("usr/lib"));
    assert_eq!(fs::read_link(rootfs.join("abs-lib")).unwrap().to_str(), Some("/usr/lib"));
    assert_eq!(rd("usr/lib/extra.so"), b"through the symlink");
    assert_eq!(rd("usr/lib/abs.so"), b"through the absolute symlink");
    assert!(md("lib").file_type().is_symlink());

    // dir <-> file replacement.
    assert!(md("d").is_file());
    assert_eq!(rd("d"), b"now a file");
    assert!(md("f").is_dir());
    assert_eq!(md("f").mode() & 0o7777, 0o750);
    assert_eq!(rd("f/inner"), b"inner");

    // Read-only dir from layer 1 filled by layer 2, mode applied at the end.
    assert_eq!(md("ro").mode() & 0o7777, 0o555);
    assert_eq!(rd("ro/added"), b"added");
    assert_eq!(rd("ro/orig"), b"o");

    // Fifo (works without root too); implicit parent dir.
    assert!(md("run/fifo").file_type().is_fifo());
    assert_eq!(md("run/fifo").mode() & 0o7777, 0o640);
    assert_eq!(md("run").mode() & 0o7777, 0o755);

    // Leading '/' and './' are stripped.
    assert_eq!(rd("rooted/file"), b"leading slash stripped");
    assert_eq!(rd("dot/file"), b"leading dot stripped");

    // mtimes of files and dirs.
    assert_eq!(md("etc/shadow").mtime(), MTIME as i64);
    assert_eq!(md("etc").mtime(), MTIME as i64, "dir mtime restored after children were added");
    assert_eq!(md("lib").mtime(), MTIME as i64);
}

#[test]
fn docker_archive_multi_layer() {
    let env = Env::new();
    let store = env.store();
    let config = run_config(&["/bin/sh", "-c"], &["echo hi"], &["PATH=/bin", "X=1=2"], "/work", "1000:1000");
    let members = docker_members(
        &[DockerImage {
            tags: vec!["docker.io/library/busybox:latest".into(), "example.com/x/y:1".into()],
            config,
            layers: rich_layers(),
        }],
        false,
    );
    let path = env.archive("img.tar", &members);
    let records = store.import(&path).unwrap();
    assert_eq!(records.len(), 1);
    let rec = &records[0];
    assert!(rec.id.starts_with("sha256:") && rec.id.len() == 71);
    assert_eq!(rec.names, ["busybox:latest", "example.com/x/y:1"]);
    assert_eq!(
        rec.config,
        ImageConfig {
            entrypoint: vec!["/bin/sh".into(), "-c".into()],
            cmd: vec!["echo hi".into()],
            env: vec!["PATH=/bin".into(), "X=1=2".into()],
            working_dir: "/work".into(),
            user: "1000:1000".into(),
        }
    );
    assert!(rec.size_bytes > 50, "size {}", rec.size_bytes);
    assert!(chrono::DateTime::parse_from_rfc3339(&rec.imported_at).is_ok());
    assert_eq!(rec.id_shift, None);
    check_rich_tree(&store.rootfs(rec));
    // The config id is the digest of the config blob.
    let config_member = members.iter().find(|(n, _)| n.ends_with(".json") && n != "manifest.json").unwrap();
    assert_eq!(rec.id, sha256(&config_member.1));

    let again = store.resolve("busybox").unwrap();
    assert_eq!(again.id, rec.id);
    env.assert_store_clean();
}

#[test]
fn docker_archive_blobs_style_and_multiple_images() {
    let env = Env::new();
    let store = env.store();
    let one = DockerImage {
        tags: vec!["one:latest".into(), "one:v1".into()],
        config: run_config(&[], &["/one"], &[], "", ""),
        layers: vec![Layer::new(LayerBuilder::new().file("one", b"1", 0o644).build(), Comp::Plain)],
    };
    let two = DockerImage {
        tags: vec![],
        config: run_config(&[], &["/two"], &[], "", ""),
        layers: vec![
            Layer::new(LayerBuilder::new().file("one", b"1", 0o644).build(), Comp::Plain),
            Layer::new(LayerBuilder::new().file("two", b"2", 0o644).build(), Comp::Gzip),
        ],
    };
    let path = env.archive("multi.tar", &docker_members(&[one, two], true));
    let records = store.import(&path).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].names, ["one:latest", "one:v1"]);
    assert!(records[1].names.is_empty(), "untagged image has no names");
    assert_eq!(records[1].config.cmd, ["/two"]);
    let two_root = store.rootfs(&records[1]);
    assert_eq!(fs::read(two_root.join("one")).unwrap(), b"1");
    assert_eq!(fs::read(two_root.join("two")).unwrap(), b"2");
    // The untagged one is addressable by id and by prefix.
    assert_eq!(store.resolve(&records[1].id).unwrap().id, records[1].id);
    assert_eq!(store.resolve(&records[1].id[7..19]).unwrap().id, records[1].id);
    assert_eq!(store.list().unwrap().len(), 2);
}

#[test]
fn oci_layout_gzip_zstd_and_index() {
    let env = Env::new();
    let store = env.store();
    let images = [
        OciImage {
            ref_name: Some("docker.io/library/alpine:3.20".into()),
            containerd_name: None,
            config: run_config(&[], &["/bin/sh"], &["PATH=/usr/bin"], "/", "root"),
            layers: rich_layers(),
            via_index: true,
        },
        OciImage {
            ref_name: Some("latest".into()),
            containerd_name: Some("docker.io/foo/bar:latest".into()),
            config: run_config(&["/bar"], &[], &[], "", ""),
            layers: vec![Layer::new(LayerBuilder::new().file("bar", b"bar", 0o755).build(), Comp::Zstd)],
            via_index: false,
        },
        OciImage {
            ref_name: Some("latest".into()),
            containerd_name: None,
            config: run_config(&["/anon"], &[], &[], "", ""),
            layers: vec![Layer::new(LayerBuilder::new().file("anon", b"anon", 0o755).build(), Comp::Gzip)],
            via_index: false,
        },
    ];
    let members = oci_members(&images);
    let path = env.archive("oci.tar", &members);
    let records = store.import(&path).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].names, ["alpine:3.20"]);
    assert_eq!(records[1].names, ["foo/bar:latest"]);
    assert!(records[2].names.is_empty(), "a bare tag names no repository");
    check_rich_tree(&store.rootfs(&records[0]));
    assert_eq!(records[0].config.cmd, ["/bin/sh"]);
    assert_eq!(records[0].config.user, "root");
    assert_eq!(fs::read(store.rootfs(&records[1]).join("bar")).unwrap(), b"bar");
    assert_eq!(store.resolve("docker.io/foo/bar").unwrap().id, records[1].id);
    assert_eq!(store.resolve(&records[2].id).unwrap().config.entrypoint, ["/anon"]);

    // The manifest digest (as in `name@sha256:...` pull references) also resolves.
    let index: serde_json::Value =
        serde_json::from_slice(&members.iter().find(|(n, _)| n == "index.json").unwrap().1).unwrap();
    let manifest_digest = index["manifests"][1]["digest"].as_str().unwrap();
    assert_eq!(store.resolve(&format!("foo/bar@{manifest_digest}")).unwrap().id, records[1].id);
    assert_eq!(store.resolve(&format!("foo/bar@{}", records[1].id)).unwrap().id, records[1].id);
    env.assert_store_clean();
}

#[test]
fn missing_and_null_config_fields() {
    let env = Env::new();
    let store = env.store();
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": null, "Cmd": null, "Env": null}});
    let path = env.archive(
        "img.tar",
        &docker_members(
            &[DockerImage {
                tags: vec!["nulls".into()],
                config,
                layers: vec![Layer::new(LayerBuilder::new().file("x", b"x", 0o644).build(), Comp::Plain)],
            }],
            false,
        ),
    );
    let rec = store.import(&path).unwrap().remove(0);
    assert_eq!(rec.config, ImageConfig::default());
}

#[test]
fn device_nodes_need_root() {
    let env = Env::new();
    let store = env.store();
    let layer = LayerBuilder::new().chardev("dev/null", 1, 3).file("dev/keep", b"", 0o644).build();
    let path = env.archive(
        "dev.tar",
        &docker_members(
            &[DockerImage {
                tags: vec!["dev".into()],
                config: run_config(&[], &[], &[], "", ""),
                layers: vec![Layer::new(layer, Comp::Plain)],
            }],
            false,
        ),
    );
    let rec = store.import(&path).unwrap().remove(0);
    let node = store.rootfs(&rec).join("dev/null");
    assert!(store.rootfs(&rec).join("dev/keep").exists());
    match fs::symlink_metadata(&node) {
        Ok(md) => {
            assert!(md.file_type().is_char_device());
            assert_eq!(md.rdev(), nix::sys::stat::makedev(1, 3));
        }
        Err(_) => println!("device node skipped (not root or no CAP_MKNOD)"),
    }
    if !is_root() {
        assert!(fs::symlink_metadata(&node).is_err(), "non-root must skip devices");
    }
}

#[test]
fn digest_mismatch_docker_diff_id() {
    let env = Env::new();
    let store = env.store();
    let mut members = docker_members(
        &[DockerImage {
            tags: vec!["bad".into()],
            config: run_config(&[], &[], &[], "", ""),
            layers: vec![Layer::new(LayerBuilder::new().file("x", b"original", 0o644).build(), Comp::Gzip)],
        }],
        false,
    );
    // Swap the layer content for another valid (gzip) tar.
    let evil = Layer::new(LayerBuilder::new().file("x", b"tampered", 0o644).build(), Comp::Gzip).blob();
    let layer_name = members.iter().find(|(n, _)| n.ends_with("layer.tar")).unwrap().0.clone();
    members.iter_mut().find(|(n, _)| *n == layer_name).unwrap().1 = evil;
    let err = store.import(&env.archive("bad.tar", &members)).unwrap_err();
    match &err {
        Error::DigestMismatch { blob, .. } => assert_eq!(*blob, layer_name),
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains(&layer_name));
    assert!(store.list().unwrap().is_empty());
    env.assert_store_clean();
}

#[test]
fn digest_mismatch_oci_blobs() {
    let env = Env::new();
    let store = env.store();
    let image = OciImage {
        ref_name: Some("x/y:1".into()),
        containerd_name: None,
        config: run_config(&[], &[], &[], "", ""),
        layers: vec![Layer::new(LayerBuilder::new().file("x", b"original", 0o644).build(), Comp::Plain)],
        via_index: false,
    };
    let layer_blob = image.layers[0].blob();
    let layer_name = format!("blobs/sha256/{}", &sha256(&layer_blob)[7..]);

    // Layer: same size, one byte flipped.
    let mut members = oci_members(std::slice::from_ref(&image));
    let blob = &mut members.iter_mut().find(|(n, _)| *n == layer_name).unwrap().1;
    let pos = blob.windows(8).position(|w| w == b"original").unwrap();
    blob[pos] = b'O';
    let err = store.import(&env.archive("bad-layer.tar", &members)).unwrap_err();
    assert!(matches!(&err, Error::DigestMismatch { blob, .. } if *blob == layer_name), "{err}");

    // Config blob tampered.
    let mut members = oci_members(std::slice::from_ref(&image));
    let index: serde_json::Value =
        serde_json::from_slice(&members.iter().find(|(n, _)| n == "index.json").unwrap().1).unwrap();
    let mdigest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let manifest: serde_json::Value = serde_json::from_slice(
        &members.iter().find(|(n, _)| *n == format!("blobs/sha256/{}", &mdigest[7..])).unwrap().1,
    )
    .unwrap();
    let config_name = format!("blobs/sha256/{}", &manifest["config"]["digest"].as_str().unwrap()[7..]);
    let cfg = &mut members.iter_mut().find(|(n, _)| *n == config_name).unwrap().1;
    let last = cfg.len() - 2;
    cfg[last] = b' ';
    let err = store.import(&env.archive("bad-config.tar", &members)).unwrap_err();
    assert!(matches!(&err, Error::DigestMismatch { blob, .. } if *blob == config_name), "{err}");

    // Missing blob.
    let mut members = oci_members(std::slice::from_ref(&image));
    members.retain(|(n, _)| *n != layer_name);
    let err = store.import(&env.archive("missing.tar", &members)).unwrap_err();
    assert!(matches!(&err, Error::BadArchive { entry: Some(e), .. } if *e == layer_name), "{err}");

    assert!(store.list().unwrap().is_empty());
    env.assert_store_clean();
}

#[test]
fn not_an_image_archive() {
    let env = Env::new();
    let store = env.store();
    let err = store.import(&env.archive("junk.tar", &vec![("hello.txt".into(), b"hi".to_vec())])).unwrap_err();
    assert!(matches!(err, Error::BadArchive { .. }), "{err}");
    let err = store.import(&env.write("notar", b"this is not a tar file at all")).unwrap_err();
    assert!(matches!(err, Error::BadArchive { .. }), "{err}");
    let gz = Layer::new(tar_members(&vec![("manifest.json".into(), b"[]".to_vec())]), Comp::Gzip).blob();
    let err = store.import(&env.write("img.tar.gz", &gz)).unwrap_err();
    assert!(err.to_string().contains("compressed"), "{err}");
    let err = store.import(&env.dir.path().join("does-not-exist.tar")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    env.assert_store_clean();
}

#[test]
fn read_only_tree_is_removable_without_root() {
    // Trees with 0555/0000 dirs must still be deletable by a non-root owner.
    let env = Env::new();
    let store = env.store();
    let layer = LayerBuilder::new().dir("locked/", 0o000).file("locked/f", b"f", 0o000).dir("ro/", 0o555).build();
    let path = env.archive(
        "ro.tar",
        &docker_members(
            &[DockerImage {
                tags: vec!["ro".into()],
                config: run_config(&[], &[], &[], "", ""),
                layers: vec![Layer::new(layer, Comp::Plain)],
            }],
            false,
        ),
    );
    let rec = store.import(&path).unwrap().remove(0);
    let md = fs::metadata(store.rootfs(&rec).join("locked")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0);
    store.remove("ro").unwrap();
    assert!(!store.rootfs(&rec).exists());
    env.assert_store_clean();
}

//! Importing docker-archive and OCI-layout tarballs and the resulting trees.

mod common;

use common::*;
use pvisor_images::pool::index::{Data, S_IFBLK, S_IFCHR, S_IFIFO, S_IFLNK, S_IFREG};
use pvisor_images::{Error, ImageConfig, ImageRecord, Pool};

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

fn check_rich_tree(pool: &Pool, rec: &ImageRecord) {
    let v = view(pool, rec);
    let index = v.index();
    let ino = |p: &str| index.lookup_path(p).unwrap_or_else(|| panic!("{p}: not in the image"));
    let md = |p: &str| &index.inodes[ino(p) as usize];
    let rd = |p: &str| v.read_path(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let exists = |p: &str| index.lookup_path(p).is_some();
    let names = |p: &str| -> Vec<String> {
        md(p).entries().iter().map(|e| String::from_utf8(e.name.clone()).unwrap()).collect()
    };

    // Whiteouts.
    assert!(!exists("etc/hosts"), "whited-out file survived");
    assert!(!exists("etc/.wh.hosts"), "whiteout marker materialized");
    assert!(!exists("gone"), "whited-out dir survived");
    assert!(!names("").iter().any(|n| n.starts_with(".wh.")), "whiteout marker in the root");
    assert_eq!(rd("etc/shadow"), b"root:*:1::::::\n");
    assert_eq!(perm(md("etc/shadow")), 0o640);

    // Opaque directory.
    assert_eq!(names("a"), ["new-after", "new-before", "sub"]);
    assert_eq!(names("a/sub"), ["fresh"], "old entries of a kept subdir must go too");
    assert_eq!(perm(md("a/new-after")), 0o600);

    // Modes incl. setuid / setgid / sticky.
    assert_eq!(perm(md("bin/sh")), 0o4755);
    assert_eq!(perm(md("bin/wall")), 0o2755);
    assert_eq!(perm(md("tmp")), 0o1777);
    assert!(md("tmp").is_dir());
    assert_eq!(md("bin/sh").kind(), S_IFREG);

    // Hardlink: one inode, two names.
    assert_eq!(ino("bin/ash"), ino("bin/sh"));
    assert_eq!(md("bin/sh").nlink, 2);
    assert_eq!(md("bin/wall").nlink, 1);
    assert_eq!(rd("bin/ash"), b"#!shell binary");

    // Symlinks stored verbatim, and writes through them landing inside the tree.
    assert_eq!(md("lib").data, Data::Symlink { target: b"usr/lib".to_vec() });
    assert_eq!(md("abs-lib").data, Data::Symlink { target: b"/usr/lib".to_vec() });
    assert_eq!(md("lib").kind(), S_IFLNK);
    assert_eq!(md("lib").size(), 7);
    assert_eq!(rd("usr/lib/extra.so"), b"through the symlink");
    assert_eq!(rd("usr/lib/abs.so"), b"through the absolute symlink");
    assert_eq!(names("usr/lib"), ["abs.so", "extra.so", "libc.so"]);

    // dir <-> file replacement.
    assert_eq!(md("d").kind(), S_IFREG);
    assert_eq!(rd("d"), b"now a file");
    assert!(md("f").is_dir());
    assert_eq!(perm(md("f")), 0o750);
    assert_eq!(rd("f/inner"), b"inner");

    // Read-only dir from layer 1 filled by layer 2.
    assert_eq!(perm(md("ro")), 0o555);
    assert_eq!(rd("ro/added"), b"added");
    assert_eq!(rd("ro/orig"), b"o");
    assert_eq!(perm(md("ro/orig")), 0o444);

    // Fifo; implicit parent dir (root-owned 0755).
    assert_eq!(md("run/fifo").kind(), S_IFIFO);
    assert_eq!(md("run/fifo").data, Data::Fifo);
    assert_eq!(perm(md("run/fifo")), 0o640);
    assert_eq!(perm(md("run")), 0o755);
    assert_eq!((md("run").uid, md("run").gid), (0, 0));

    // Leading '/' and './' are stripped.
    assert_eq!(rd("rooted/file"), b"leading slash stripped");
    assert_eq!(rd("dot/file"), b"leading dot stripped");

    // mtimes of files, dirs and symlinks.
    assert_eq!(md("etc/shadow").mtime, MTIME as i64);
    assert_eq!(md("etc").mtime, MTIME as i64, "dir mtime kept after children were added");
    assert_eq!(md("lib").mtime, MTIME as i64);

    // Link counts of directories: 2 plus one per subdirectory.
    assert_eq!(md("a").nlink, 3);
    assert_eq!(md("usr").nlink, 3);
    let subdirs = md("").entries().iter().filter(|e| index.inodes[e.ino as usize].is_dir()).count() as u32;
    assert_eq!(index.inodes[0].nlink, 2 + subdirs);

    // Every directory's `..` is its parent.
    for (i, inode) in index.inodes.iter().enumerate() {
        for e in inode.entries() {
            if let Data::Dir { parent, .. } = &index.inodes[e.ino as usize].data {
                assert_eq!(*parent as usize, i, "parent of {:?}", String::from_utf8_lossy(&e.name));
            }
        }
    }
    // The image size counts the hardlinked file once.
    let expected: u64 = files(&v).iter().map(|(p, d)| if p == "bin/ash" { 0 } else { d.len() as u64 }).sum();
    assert_eq!(rec.size_bytes, expected);
}

#[test]
fn docker_archive_multi_layer() {
    let env = Env::new();
    let pool = env.pool();
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
    let records = pool.import(&path).unwrap();
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
    assert_eq!(pool.id_shift(), None);
    check_rich_tree(&pool, rec);
    // The config id is the digest of the config blob.
    let config_member = members.iter().find(|(n, _)| n.ends_with(".json") && n != "manifest.json").unwrap();
    assert_eq!(rec.id, sha256(&config_member.1));

    let again = pool.resolve("busybox").unwrap();
    assert_eq!(again.id, rec.id);
    env.assert_store_clean();
}

#[test]
fn docker_archive_blobs_style_and_multiple_images() {
    let env = Env::new();
    let pool = env.pool();
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
    let records = pool.import(&path).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].names, ["one:latest", "one:v1"]);
    assert!(records[1].names.is_empty(), "untagged image has no names");
    assert_eq!(records[1].config.cmd, ["/two"]);
    assert_eq!(read(&pool, &records[1], "one"), b"1");
    assert_eq!(read(&pool, &records[1], "two"), b"2");
    assert_eq!(ls(&pool, &records[0], ""), ["one"]);
    assert_eq!(ls(&pool, &records[1], ""), ["one", "two"]);
    // The untagged one is addressable by id and by prefix.
    assert_eq!(pool.resolve(&records[1].id).unwrap().id, records[1].id);
    assert_eq!(pool.resolve(&records[1].id[7..19]).unwrap().id, records[1].id);
    assert_eq!(pool.list().unwrap().len(), 2);
}

#[test]
fn oci_layout_gzip_zstd_and_index() {
    let env = Env::new();
    let pool = env.pool();
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
    let records = pool.import(&path).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].names, ["alpine:3.20"]);
    assert_eq!(records[1].names, ["foo/bar:latest"]);
    assert!(records[2].names.is_empty(), "a bare tag names no repository");
    check_rich_tree(&pool, &records[0]);
    assert_eq!(records[0].config.cmd, ["/bin/sh"]);
    assert_eq!(records[0].config.user, "root");
    assert_eq!(read(&pool, &records[1], "bar"), b"bar");
    assert_eq!(perm(&stat(&pool, &records[1], "bar")), 0o755);
    assert_eq!(pool.resolve("docker.io/foo/bar").unwrap().id, records[1].id);
    assert_eq!(pool.resolve(&records[2].id).unwrap().config.entrypoint, ["/anon"]);

    // The manifest digest (as in `name@sha256:...` pull references) also resolves.
    let index: serde_json::Value =
        serde_json::from_slice(&members.iter().find(|(n, _)| n == "index.json").unwrap().1).unwrap();
    let manifest_digest = index["manifests"][1]["digest"].as_str().unwrap();
    assert_eq!(pool.resolve(&format!("foo/bar@{manifest_digest}")).unwrap().id, records[1].id);
    assert_eq!(pool.resolve(&format!("foo/bar@{}", records[1].id)).unwrap().id, records[1].id);
    env.assert_store_clean();
}

#[test]
fn missing_and_null_config_fields() {
    let env = Env::new();
    let pool = env.pool();
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
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(rec.config, ImageConfig::default());
}

#[test]
fn device_nodes_recorded_regardless_of_privilege() {
    // Nothing is created on the host, so devices need no CAP_MKNOD: they
    // are always in the index, with their device number (served as is).
    let env = Env::new();
    let pool = env.pool();
    let layer = LayerBuilder::new()
        .chardev("dev/null", 1, 3)
        .chardev("dev/big", 4095, 1 << 19)
        .blockdev("dev/sda", 8, 0)
        .fifo("dev/pipe")
        .file("dev/keep", b"", 0o644)
        .build();
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
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(ls(&pool, &rec, "dev"), ["big", "keep", "null", "pipe", "sda"]);
    let null = stat(&pool, &rec, "dev/null");
    assert_eq!(null.kind(), S_IFCHR);
    assert_eq!(perm(&null), 0o666);
    assert_eq!(null.data, Data::Device { rdev: nix::sys::stat::makedev(1, 3) });
    assert_eq!(null.size(), 0);
    let big = stat(&pool, &rec, "dev/big");
    assert_eq!(big.data, Data::Device { rdev: nix::sys::stat::makedev(4095, 1 << 19) });
    let sda = stat(&pool, &rec, "dev/sda");
    assert_eq!(sda.kind(), S_IFBLK);
    assert_eq!(sda.data, Data::Device { rdev: nix::sys::stat::makedev(8, 0) });
    assert_eq!(stat(&pool, &rec, "dev/pipe").kind(), S_IFIFO);
    assert_eq!(read(&pool, &rec, "dev/keep"), b"");
    // Not readable as files.
    let v = view(&pool, &rec);
    let ino = v.index().lookup_path("dev/null").unwrap();
    assert_eq!(v.read(ino, 0, &mut [0u8; 4]).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    env.assert_store_clean();
}

#[test]
fn digest_mismatch_docker_diff_id() {
    let env = Env::new();
    let pool = env.pool();
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
    let err = pool.import(&env.archive("bad.tar", &members)).unwrap_err();
    match &err {
        Error::DigestMismatch { blob, .. } => assert_eq!(*blob, layer_name),
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains(&layer_name));
    assert!(pool.list().unwrap().is_empty());
    env.assert_store_clean();
}

#[test]
fn digest_mismatch_oci_blobs() {
    let env = Env::new();
    let pool = env.pool();
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
    let err = pool.import(&env.archive("bad-layer.tar", &members)).unwrap_err();
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
    let err = pool.import(&env.archive("bad-config.tar", &members)).unwrap_err();
    assert!(matches!(&err, Error::DigestMismatch { blob, .. } if *blob == config_name), "{err}");

    // Missing blob.
    let mut members = oci_members(std::slice::from_ref(&image));
    members.retain(|(n, _)| *n != layer_name);
    let err = pool.import(&env.archive("missing.tar", &members)).unwrap_err();
    assert!(matches!(&err, Error::BadArchive { entry: Some(e), .. } if *e == layer_name), "{err}");

    assert!(pool.list().unwrap().is_empty());
    env.assert_store_clean();
}

#[test]
fn not_an_image_archive() {
    let env = Env::new();
    let pool = env.pool();
    let err = pool.import(&env.archive("junk.tar", &vec![("hello.txt".into(), b"hi".to_vec())])).unwrap_err();
    assert!(matches!(err, Error::BadArchive { .. }), "{err}");
    let err = pool.import(&env.write("notar", b"this is not a tar file at all")).unwrap_err();
    assert!(matches!(err, Error::BadArchive { .. }), "{err}");
    let gz = Layer::new(tar_members(&vec![("manifest.json".into(), b"[]".to_vec())]), Comp::Gzip).blob();
    let err = pool.import(&env.write("img.tar.gz", &gz)).unwrap_err();
    assert!(err.to_string().contains("compressed"), "{err}");
    let err = pool.import(&env.dir.path().join("does-not-exist.tar")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    env.assert_store_clean();
}

#[test]
fn unreadable_modes_are_recorded_and_removable() {
    // 0000 / 0555 modes are only metadata now: recorded as is, content
    // still served, and removal never depends on them (or on root).
    let env = Env::new();
    let pool = env.pool();
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
    let rec = pool.import(&path).unwrap().remove(0);
    assert_eq!(perm(&stat(&pool, &rec, "locked")), 0);
    assert_eq!(perm(&stat(&pool, &rec, "locked/f")), 0);
    assert_eq!(perm(&stat(&pool, &rec, "ro")), 0o555);
    assert_eq!(read(&pool, &rec, "locked/f"), b"f");
    let image_dir = env.root.join("images").join(&rec.id[7..]);
    assert!(image_dir.is_dir());
    pool.remove("ro").unwrap();
    assert!(!image_dir.exists());
    assert!(matches!(pool.view(&rec), Err(Error::NotFound(_))));
    assert!(pool.list().unwrap().is_empty());
    env.assert_store_clean();
}

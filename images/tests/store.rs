//! Names, removal, re-import, crash leftovers, concurrency and id shifting.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use common::*;
use pvisor_images::{Error, ImageStore, Options};

fn simple(tag: &[&str], content: &[u8]) -> Members {
    docker_members(
        &[DockerImage {
            tags: tag.iter().map(|t| t.to_string()).collect(),
            config: run_config(&[], &["/x"], &[], "", ""),
            layers: vec![Layer::new(LayerBuilder::new().file("x", content, 0o755).build(), Comp::Plain)],
        }],
        false,
    )
}

#[test]
fn resolve_reference_forms() {
    let env = Env::new();
    let store = env.store();
    let rec =
        store.import(&env.archive("a.tar", &simple(&["busybox:latest", "docker.io/foo/bar"], b"1"))).unwrap().remove(0);
    let hex = &rec.id[7..];
    for r in [
        "busybox",
        "busybox:latest",
        "library/busybox",
        "docker.io/library/busybox:latest",
        "index.docker.io/library/busybox",
        "foo/bar",
        "docker.io/foo/bar:latest",
        rec.id.as_str(),
        hex,
        &hex[..12],
        &hex[..20],
        &format!("busybox@{}", rec.id),
    ] {
        assert_eq!(store.resolve(r).unwrap().id, rec.id, "reference {r}");
    }
    for r in [
        "busybox:1.0",
        "alpine",
        "foo/baz",
        "sha256:0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000",
    ] {
        match store.resolve(r) {
            Err(Error::NotFound(x)) => assert_eq!(x, r),
            other => panic!("{r}: {other:?}"),
        }
    }
    assert!(matches!(store.resolve("Bad Name"), Err(Error::InvalidReference { .. })));
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].names, ["busybox:latest", "foo/bar:latest"]);
}

#[test]
fn remove_names_then_image() {
    let env = Env::new();
    let store = env.store();
    let rec = store.import(&env.archive("a.tar", &simple(&["a:1", "a:2"], b"1"))).unwrap().remove(0);
    let other = store.import(&env.archive("b.tar", &simple(&["b"], b"2"))).unwrap().remove(0);
    let rootfs = store.rootfs(&rec);
    assert!(rootfs.join("x").exists());

    store.remove("a:1").unwrap();
    assert_eq!(store.resolve("a:2").unwrap().names, ["a:2"]);
    assert!(matches!(store.resolve("a:1"), Err(Error::NotFound(_))));
    assert!(rootfs.exists(), "image kept while a name is left");

    store.remove("docker.io/library/a:2").unwrap();
    assert!(!rootfs.exists(), "image dropped with its last name");
    assert!(matches!(store.resolve(&rec.id), Err(Error::NotFound(_))));
    assert!(matches!(store.remove("a:2"), Err(Error::NotFound(_))));

    // By id: the image and all its names go.
    store.import(&env.archive("c.tar", &simple(&["c:1", "c:2"], b"3"))).unwrap();
    let c = store.resolve("c:1").unwrap();
    store.remove(&c.id[7..19]).unwrap();
    assert!(matches!(store.resolve("c:2"), Err(Error::NotFound(_))));
    assert_eq!(store.list().unwrap().iter().map(|r| r.id.clone()).collect::<Vec<_>>(), [other.id]);
    env.assert_store_clean();
}

#[test]
fn reimport_reuses_tree_and_adds_names() {
    let env = Env::new();
    let store = env.store();
    let first = store.import(&env.archive("a.tar", &simple(&["one"], b"same"))).unwrap().remove(0);
    let rootfs = store.rootfs(&first);
    let ino = fs::metadata(&rootfs).unwrap().ino();
    let file_ino = fs::metadata(rootfs.join("x")).unwrap().ino();

    let again = store.import(&env.archive("a2.tar", &simple(&["one", "two"], b"same"))).unwrap().remove(0);
    assert_eq!(again.id, first.id);
    assert_eq!(again.imported_at, first.imported_at);
    assert_eq!(again.names, ["one:latest", "two:latest"]);
    assert_eq!(fs::metadata(&rootfs).unwrap().ino(), ino, "tree was rebuilt");
    assert_eq!(fs::metadata(rootfs.join("x")).unwrap().ino(), file_ino);
    assert_eq!(store.list().unwrap().len(), 1);

    // A tag moving to a different image.
    let moved = store.import(&env.archive("b.tar", &simple(&["two"], b"different"))).unwrap().remove(0);
    assert_ne!(moved.id, first.id);
    assert_eq!(store.resolve("two").unwrap().id, moved.id);
    assert_eq!(store.resolve("one").unwrap().names, ["one:latest"]);
    env.assert_store_clean();
}

#[test]
fn leftover_tmp_is_cleaned_at_open() {
    let env = Env::new();
    drop(env.store());
    // What a killed import leaves behind, including a read-only directory.
    let junk = env.root.join("tmp/import-123-0-abc");
    fs::create_dir_all(junk.join("rootfs/usr/bin")).unwrap();
    fs::write(junk.join("rootfs/usr/bin/tool"), b"partial").unwrap();
    fs::set_permissions(junk.join("rootfs/usr"), std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    fs::write(env.root.join("tmp/stray-file"), b"x").unwrap();
    // One that a live importer still holds is left alone.
    let live = env.root.join("tmp/import-live");
    fs::create_dir(&live).unwrap();
    let held = nix::fcntl::Flock::lock(fs::File::open(&live).unwrap(), nix::fcntl::FlockArg::LockExclusive).unwrap();

    let store = env.store();
    assert!(!junk.exists(), "leftover import not removed");
    assert!(!env.root.join("tmp/stray-file").exists());
    assert!(live.exists(), "a locked (in-progress) import was removed");
    drop(held);
    drop(store);
    let store = env.store();
    assert!(!live.exists());
    assert!(store.list().unwrap().is_empty());
    env.assert_store_clean();
}

#[test]
fn concurrent_imports() {
    let env = Env::new();
    let store = Arc::new(env.store());
    let archives: Vec<_> = (0..6)
        .map(|i| {
            env.archive(
                &format!("{i}.tar"),
                &simple(&[&format!("img{}", i % 3), &format!("all{i}")], format!("{}", i % 3).as_bytes()),
            )
        })
        .collect();
    let handles: Vec<_> = archives
        .into_iter()
        .map(|a| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || store.import(&a).unwrap())
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let list = store.list().unwrap();
    assert_eq!(list.len(), 3);
    let names: usize = list.iter().map(|r| r.names.len()).sum();
    assert_eq!(names, 9);
    // Two handles on one root (like two processes) agree.
    let other = env.store();
    assert_eq!(listing(&other), listing(&store));
    drop(store);
    env.assert_store_clean();
}

#[test]
fn id_shift_chowns_when_root() {
    if !is_root() {
        println!("SKIPPED id_shift_chowns_when_root: needs root to chown");
        return;
    }
    let env = Env::new();
    let store = ImageStore::open_with(&env.root, Options { id_shift: Some(100_000) }).unwrap();
    assert_eq!(store.id_shift(), Some(100_000));
    let layer = LayerBuilder::new()
        .dir("home/", 0o755)
        .entry("home/user/", tar::EntryType::Directory, 0o750, (1000, 1000), "", b"")
        .file_owned("home/user/file", b"mine", 0o640, 1000, 1001)
        .file_owned("bin/su", b"su", 0o4755, 0, 0)
        .entry("link", tar::EntryType::Symlink, 0o777, (65534, 65534), "bin/su", b"")
        .build();
    let members = docker_members(
        &[DockerImage {
            tags: vec!["shifted".into()],
            config: run_config(&[], &[], &[], "", ""),
            layers: vec![Layer::new(layer, Comp::Gzip)],
        }],
        false,
    );
    let rec = store.import(&env.archive("s.tar", &members)).unwrap().remove(0);
    assert_eq!(rec.id_shift, Some(100_000));
    let rootfs = store.rootfs(&rec);
    let owner = |p: &str| {
        let md = fs::symlink_metadata(rootfs.join(p)).unwrap();
        (md.uid(), md.gid())
    };
    assert_eq!(owner(""), (100_000, 100_000));
    assert_eq!(owner("home"), (100_000, 100_000));
    assert_eq!(owner("home/user"), (101_000, 101_000));
    assert_eq!(owner("home/user/file"), (101_000, 101_001));
    assert_eq!(owner("bin"), (100_000, 100_000), "implicit dirs belong to the shifted root");
    assert_eq!(owner("bin/su"), (100_000, 100_000));
    assert_eq!(owner("link"), (165_534, 165_534));
    assert_eq!(fs::metadata(rootfs.join("bin/su")).unwrap().mode() & 0o7777, 0o4755, "setuid survives chown");

    // The same image imported by a store without shift is re-unpacked unshifted.
    let unshifted = ImageStore::open_with(&env.root, Options { id_shift: None }).unwrap();
    let rec2 = unshifted.import(&env.archive("s2.tar", &members)).unwrap().remove(0);
    assert_eq!(rec2.id, rec.id);
    assert_eq!(rec2.id_shift, None);
    assert_eq!(fs::metadata(unshifted.rootfs(&rec2).join("home/user/file")).unwrap().uid(), 0);

    // Ids outside 0..65536 cannot be mapped.
    let bad = LayerBuilder::new().file_owned("etc/x", b"x", 0o644, 70_000, 0).build();
    let bad = docker_members(
        &[DockerImage {
            tags: vec!["bad".into()],
            config: run_config(&[], &[], &[], "", ""),
            layers: vec![Layer::new(bad, Comp::Plain)],
        }],
        false,
    );
    let before = listing(&store);
    let err = store.import(&env.archive("bad.tar", &bad)).unwrap_err();
    assert!(matches!(&err, Error::Unsafe { entry, .. } if entry == "etc/x"), "{err:?}");
    assert!(err.to_string().contains("70000"), "{err}");
    assert_eq!(listing(&store), before);
    env.assert_store_clean();
}

#[test]
fn default_open_shift_follows_euid() {
    let env = Env::new();
    let store = ImageStore::open(&env.root).unwrap();
    assert_eq!(store.id_shift(), if is_root() { Some(100_000) } else { None });
}

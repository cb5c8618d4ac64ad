//! Names, removal, re-import, crash leftovers, concurrency and id handling.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use common::*;
use pvisor_images::{Error, ImportEvent, Options, Pool};

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
    let pool = env.pool();
    let rec =
        pool.import(&env.archive("a.tar", &simple(&["busybox:latest", "docker.io/foo/bar"], b"1"))).unwrap().remove(0);
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
        assert_eq!(pool.resolve(r).unwrap().id, rec.id, "reference {r}");
    }
    for r in [
        "busybox:1.0",
        "alpine",
        "foo/baz",
        "sha256:0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000",
    ] {
        match pool.resolve(r) {
            Err(Error::NotFound(x)) => assert_eq!(x, r),
            other => panic!("{r}: {other:?}"),
        }
    }
    assert!(matches!(pool.resolve("Bad Name"), Err(Error::InvalidReference { .. })));
    let listed = pool.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].names, ["busybox:latest", "foo/bar:latest"]);
}

#[test]
fn remove_names_then_image() {
    let env = Env::new();
    let pool = env.pool();
    let rec = pool.import(&env.archive("a.tar", &simple(&["a:1", "a:2"], b"1"))).unwrap().remove(0);
    let other = pool.import(&env.archive("b.tar", &simple(&["b"], b"2"))).unwrap().remove(0);
    let image_dir = env.root.join("images").join(&rec.id[7..]);
    assert_eq!(read(&pool, &rec, "x"), b"1");
    // A view opened now keeps working whatever happens to the image.
    let held = view(&pool, &rec);

    pool.remove("a:1").unwrap();
    assert_eq!(pool.resolve("a:2").unwrap().names, ["a:2"]);
    assert!(matches!(pool.resolve("a:1"), Err(Error::NotFound(_))));
    assert!(image_dir.exists(), "image kept while a name is left");
    assert_eq!(read(&pool, &rec, "x"), b"1");

    pool.remove("docker.io/library/a:2").unwrap();
    assert!(!image_dir.exists(), "image dropped with its last name");
    assert!(matches!(pool.resolve(&rec.id), Err(Error::NotFound(_))));
    assert!(matches!(pool.view(&rec), Err(Error::NotFound(_))));
    assert!(matches!(pool.index(&rec.id), Err(Error::NotFound(_))));
    assert!(matches!(pool.remove("a:2"), Err(Error::NotFound(_))));
    assert_eq!(held.read_path("x").unwrap(), b"1");

    // By id: the image and all its names go.
    pool.import(&env.archive("c.tar", &simple(&["c:1", "c:2"], b"3"))).unwrap();
    let c = pool.resolve("c:1").unwrap();
    pool.remove(&c.id[7..19]).unwrap();
    assert!(matches!(pool.resolve("c:2"), Err(Error::NotFound(_))));
    assert_eq!(pool.list().unwrap().iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [other.id.as_str()]);
    assert_eq!(read(&pool, &other, "x"), b"2");
    env.assert_store_clean();
}

#[test]
fn reimport_reuses_image_and_adds_names() {
    let env = Env::new();
    let pool = env.pool();
    let first = pool.import(&env.archive("a.tar", &simple(&["one"], b"same"))).unwrap().remove(0);
    let index_file = env.root.join("images").join(&first.id[7..]).join("index");
    let ino = fs::metadata(&index_file).unwrap().ino();
    let packs = packs_snapshot(&env.root);
    let chunks = pool.du().unwrap().chunks;

    let mut events = Vec::new();
    let again = pool
        .import_with(&env.archive("a2.tar", &simple(&["one", "two"], b"same")), &mut |e| events.push(e))
        .unwrap()
        .remove(0);
    assert_eq!(again.id, first.id);
    assert_eq!(again.imported_at, first.imported_at);
    assert_eq!(again.names, ["one:latest", "two:latest"]);
    assert!(
        matches!(events.as_slice(), [ImportEvent::Done { reused: true, stats, .. }] if stats.new_chunks == 0),
        "{events:?}"
    );
    assert_eq!(fs::metadata(&index_file).unwrap().ino(), ino, "index was rebuilt");
    assert_eq!(packs_snapshot(&env.root), packs, "packs changed");
    assert_eq!(pool.du().unwrap().chunks, chunks);
    assert_eq!(pool.list().unwrap().len(), 1);

    // A tag moving to a different image.
    let moved = pool.import(&env.archive("b.tar", &simple(&["two"], b"different"))).unwrap().remove(0);
    assert_ne!(moved.id, first.id);
    assert_eq!(pool.resolve("two").unwrap().id, moved.id);
    assert_eq!(pool.resolve("one").unwrap().names, ["one:latest"]);
    assert_eq!(read(&pool, &moved, "x"), b"different");
    assert_eq!(read(&pool, &first, "x"), b"same");
    env.assert_store_clean();
}

#[test]
fn leftover_tmp_is_cleaned_at_open() {
    let env = Env::new();
    let pool = env.pool();
    pool.import(&env.archive("a.tar", &simple(&["keep"], b"kept"))).unwrap();
    drop(pool);
    // What a killed import leaves behind: a staging directory (with a
    // read-only file), a half-written pack, a spool file, an image being
    // deleted.
    let junk = env.root.join("tmp/import-123-0-abc");
    fs::create_dir_all(junk.join("sub/deeper")).unwrap();
    fs::write(junk.join("sub/deeper/index.tmp"), b"partial").unwrap();
    fs::set_permissions(junk.join("sub/deeper/index.tmp"), std::os::unix::fs::PermissionsExt::from_mode(0o444))
        .unwrap();
    fs::create_dir(env.root.join("tmp/rm-123-3-abc")).unwrap();
    fs::write(env.root.join("tmp/rm-123-3-abc/image.json"), b"{}").unwrap();
    fs::write(env.root.join("tmp/p-123-1-abc.pack"), b"PVPACK\0\x01partial").unwrap();
    fs::write(env.root.join("tmp/p-123-2-abc.spool"), b"spooled").unwrap();
    fs::write(env.root.join("tmp/stray-file"), b"x").unwrap();
    // What a live importer still holds is left alone.
    let live = env.root.join("tmp/import-live");
    fs::create_dir(&live).unwrap();
    let held = nix::fcntl::Flock::lock(fs::File::open(&live).unwrap(), nix::fcntl::FlockArg::LockExclusive).unwrap();
    let live_pack = env.root.join("tmp/p-live.pack");
    fs::write(&live_pack, b"PVPACK\0\x01").unwrap();
    let held_pack =
        nix::fcntl::Flock::lock(fs::File::open(&live_pack).unwrap(), nix::fcntl::FlockArg::LockExclusive).unwrap();

    let pool = env.pool();
    assert!(!junk.exists(), "leftover import not removed");
    for f in ["p-123-1-abc.pack", "p-123-2-abc.spool", "rm-123-3-abc", "stray-file"] {
        assert!(!env.root.join("tmp").join(f).exists(), "{f} not removed");
    }
    assert!(live.exists(), "a locked (in-progress) import was removed");
    assert!(live_pack.exists(), "a locked (in-progress) pack was removed");
    drop((held, held_pack));
    drop(pool);
    let pool = env.pool();
    assert!(!live.exists());
    assert!(!live_pack.exists());
    assert_eq!(listing(&pool), [(pool.resolve("keep").unwrap().id, vec!["keep:latest".to_owned()])]);
    assert_eq!(read(&pool, &pool.resolve("keep").unwrap(), "x"), b"kept");
    env.assert_store_clean();
}

#[test]
fn leftover_packs_are_removed_by_gc() {
    // A pack renamed into packs/ whose catalog was never written (killed
    // in between), and a catalog temp file: invisible to readers, gone after gc.
    let env = Env::new();
    let pool = env.pool();
    let rec = pool.import(&env.archive("a.tar", &simple(&["a"], b"a"))).unwrap().remove(0);
    let packs = packs_snapshot(&env.root);
    fs::write(env.root.join("packs/p-999-0-0.pack"), b"PVPACK\0\x01orphan").unwrap();
    fs::write(env.root.join("packs/p-999-1-0.cat.tmp"), b"PVCAT\0\0\x01").unwrap();
    assert_eq!(pool.du().unwrap().packs, packs.len() / 2);
    assert_eq!(read(&pool, &rec, "x"), b"a");
    let report = pool.gc().unwrap();
    assert_eq!((report.packs_removed, report.packs_rewritten, report.chunks_removed), (0, 0, 0));
    assert_eq!(packs_snapshot(&env.root), packs);
    assert_eq!(read(&pool, &rec, "x"), b"a");
    env.assert_store_clean();
}

#[test]
fn concurrent_imports() {
    let env = Env::new();
    let pool = Arc::new(env.pool());
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
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || pool.import(&a).unwrap())
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let list = pool.list().unwrap();
    assert_eq!(list.len(), 3);
    let names: usize = list.iter().map(|r| r.names.len()).sum();
    assert_eq!(names, 9);
    for i in 0..6 {
        let rec = pool.resolve(&format!("all{i}")).unwrap();
        assert_eq!(pool.resolve(&format!("img{}", i % 3)).unwrap().id, rec.id);
        assert_eq!(read(&pool, &rec, "x"), format!("{}", i % 3).as_bytes());
    }
    // Two handles on one root (like two processes) agree.
    let other = env.pool();
    assert_eq!(listing(&other), listing(&pool));
    drop(pool);
    // Racing imports may have stored a chunk twice; gc keeps one copy.
    other.gc().unwrap();
    assert_eq!(other.du().unwrap().unreferenced_bytes, 0);
    for rec in other.list().unwrap() {
        assert_eq!(files(&view(&other, &rec)).len(), 1);
    }
    env.assert_store_clean();
}

#[test]
fn ids_are_recorded_unshifted() {
    // The id shift is applied when an image is served, never stored: the
    // same image serves any shift, and root is not needed to import it.
    let env = Env::new();
    let pool = Pool::open_with(&env.root, Options { id_shift: Some(100_000), level: 3 }).unwrap();
    assert_eq!(pool.id_shift(), Some(100_000));
    let layer = LayerBuilder::new()
        .dir("home/", 0o755)
        .entry("home/user/", tar::EntryType::Directory, 0o750, (1000, 1000), "", b"")
        .file_owned("home/user/file", b"mine", 0o640, 1000, 1001)
        .file_owned("bin/su", b"su", 0o4755, 0, 0)
        .entry("link", tar::EntryType::Symlink, 0o777, (65534, 65534), "bin/su", b"")
        .file_owned("max", b"m", 0o644, 65535, 65535)
        .build();
    let members = docker_members(
        &[DockerImage {
            tags: vec!["shifted".into()],
            config: run_config(&[], &[], &[], "", ""),
            layers: vec![Layer::new(layer, Comp::Gzip)],
        }],
        false,
    );
    let rec = pool.import(&env.archive("s.tar", &members)).unwrap().remove(0);
    let owner = |p: &str| {
        let i = stat(&pool, &rec, p);
        (i.uid, i.gid)
    };
    assert_eq!(owner(""), (0, 0));
    assert_eq!(owner("home"), (0, 0));
    assert_eq!(owner("home/user"), (1000, 1000));
    assert_eq!(owner("home/user/file"), (1000, 1001));
    assert_eq!(owner("bin"), (0, 0), "implicit dirs belong to the image's root");
    assert_eq!(owner("bin/su"), (0, 0));
    assert_eq!(owner("link"), (65534, 65534));
    assert_eq!(owner("max"), (65535, 65535));
    assert_eq!(perm(&stat(&pool, &rec, "bin/su")), 0o4755, "setuid kept");
    // Nothing on disk is owned by image ids: the pool is plain files of the importer.
    let me = nix::unistd::geteuid().as_raw();
    for dir in ["images", "packs"] {
        for e in fs::read_dir(env.root.join(dir)).unwrap() {
            assert_eq!(e.unwrap().metadata().unwrap().uid(), me);
        }
    }

    // The same archive through a pool without shift: the same image, reused.
    let unshifted = Pool::open_with(&env.root, Options { id_shift: None, level: 3 }).unwrap();
    let rec2 = unshifted.import(&env.archive("s2.tar", &members)).unwrap().remove(0);
    assert_eq!(rec2.id, rec.id);
    assert_eq!(rec2.imported_at, rec.imported_at);
    assert_eq!(unshifted.index(&rec2.id).unwrap(), pool.index(&rec.id).unwrap());

    // Ids outside 0..65536 cannot be mapped (header fields or PAX overrides).
    let bad = [
        ("etc/x", LayerBuilder::new().file_owned("etc/x", b"x", 0o644, 70_000, 0), "70000"),
        ("etc/y", LayerBuilder::new().file_owned("etc/y", b"y", 0o644, 0, 65_536), "65536"),
        ("etc/z", LayerBuilder::new().pax(&[("uid", b"4294967295")]).file("etc/z", b"z", 0o644), "4294967295"),
        ("d", LayerBuilder::new().entry("d/", tar::EntryType::Directory, 0o755, (0, 100_000), "", b""), "100000"),
    ];
    for (entry, layer, shown) in bad {
        let bad = docker_members(
            &[DockerImage {
                tags: vec!["bad".into()],
                config: run_config(&[], &[], &[], "", ""),
                layers: vec![Layer::new(layer.build(), Comp::Plain)],
            }],
            false,
        );
        let before = listing(&pool);
        let packs = packs_snapshot(&env.root);
        let err = pool.import(&env.archive("bad.tar", &bad)).unwrap_err();
        assert!(matches!(&err, Error::Unsafe { entry: e, .. } if e.trim_end_matches('/') == entry), "{err:?}");
        assert!(err.to_string().contains(shown), "{err}");
        assert_eq!(listing(&pool), before);
        assert_eq!(packs_snapshot(&env.root), packs);
    }
    env.assert_store_clean();
}

#[test]
fn default_open_shift_follows_euid() {
    let env = Env::new();
    let pool = Pool::open(&env.root).unwrap();
    assert_eq!(pool.id_shift(), if is_root() { Some(100_000) } else { None });
}

#[test]
fn invalid_options_refused() {
    let env = Env::new();
    for options in [
        Options { id_shift: Some(u32::MAX - 10), level: 3 },
        Options { id_shift: None, level: 0 },
        Options { id_shift: None, level: 23 },
    ] {
        assert!(matches!(Pool::open_with(&env.root, options), Err(Error::Options(_))), "{options:?}");
    }
    // Any valid level reads what any other wrote.
    let fast = Pool::open_with(&env.root, Options { id_shift: None, level: 1 }).unwrap();
    let rec = fast.import(&env.archive("a.tar", &simple(&["a"], b"level one"))).unwrap().remove(0);
    let strong = Pool::open_with(&env.root, Options { id_shift: Some(0), level: 19 }).unwrap();
    assert_eq!(read(&strong, &rec, "x"), b"level one");
}

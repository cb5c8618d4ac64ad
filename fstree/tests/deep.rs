//! Trees no path-based or recursive walk survives: 100,000 levels deep
//! (paths of 200 KB, far past PATH_MAX), symlinks pointing out, directories
//! without permissions, a mount point inside.
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use pvisor_fstree::{remove_tree, walk, Control, Error, WalkOptions};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const DEEP: usize = 100_000;

/// A scratch directory, on tmpfs where there is one: making a 100,000-level
/// chain on this host's ext4 takes minutes (the kernel's cost per mkdir
/// grows with depth there), on tmpfs a few seconds.
fn scratch() -> tempfile::TempDir {
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(_) => tempfile::tempdir().expect("tempdir"),
    }
}

fn open_dir(path: &Path) -> OwnedFd {
    let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .expect("open dir");
    // SAFETY: open just returned this fd and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `root/d/d/.../d` (`depth` levels) with a file `leaf` at the bottom, made
/// fd-relative (the path is far too long for any path-based call).
fn chain(root: &Path, depth: usize) {
    let mut fd = open_dir(root);
    for _ in 0..depth {
        mkdirat(Some(fd.as_raw_fd()), c"d", Mode::from_bits_truncate(0o755)).expect("mkdirat");
        let next =
            openat(Some(fd.as_raw_fd()), c"d", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).expect("openat");
        // SAFETY: openat just returned this fd and nothing else owns it.
        fd = unsafe { OwnedFd::from_raw_fd(next) };
    }
    let leaf = openat(Some(fd.as_raw_fd()), c"leaf", OFlag::O_CREAT | OFlag::O_WRONLY, Mode::from_bits_truncate(0o644))
        .expect("leaf");
    // SAFETY: openat just returned this fd and nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(leaf) });
}

#[test]
fn removes_a_tree_100000_levels_deep() {
    let d = scratch();
    let top = d.path().join("sandbox");
    std::fs::create_dir(&top).expect("mkdir");
    chain(&top, DEEP);
    let removed = remove_tree(&top).expect("remove");
    assert_eq!(removed.entries, DEEP as u64 + 2, "every level, the leaf and the top");
    assert_eq!(removed.max_depth, DEEP as u64);
    assert!(!top.exists());
    assert!(remove_tree(&top).is_err_and(|e| e.is_not_found()));
}

#[test]
fn walks_a_tree_100000_levels_deep() {
    let d = scratch();
    chain(d.path(), DEEP);
    let root = open_dir(d.path());
    let (mut dirs, mut leaf) = (0usize, None);
    walk::<Error, _>(root.as_fd(), "t", WalkOptions::default(), |v| {
        if v.is_dir() {
            dirs += 1;
        } else {
            leaf = Some((v.depth, v.path.len(), v.name.to_owned()));
        }
        Ok(Control::Descend)
    })
    .expect("walk");
    assert_eq!(dirs, DEEP);
    let (depth, len, name) = leaf.expect("the leaf was found");
    assert_eq!(depth as usize, DEEP + 1);
    assert_eq!(len, DEEP * 2 + "leaf".len(), "d/ per level, then leaf");
    assert_eq!(name.as_c_str(), c"leaf");
    // A bounded walk stops at its depth.
    let mut deepest = 0;
    walk::<Error, _>(root.as_fd(), "t", WalkOptions { max_depth: 3 }, |v| {
        deepest = deepest.max(v.depth);
        Ok(Control::Descend)
    })
    .expect("walk");
    assert_eq!(deepest, 3);
    remove_tree(&d.path().join("d")).expect("cleanup");
}

#[test]
fn symlinks_are_removed_and_reported_never_followed() {
    let d = tempfile::tempdir().expect("tempdir");
    let outside = d.path().join("outside");
    std::fs::create_dir_all(outside.join("sub")).expect("mkdir");
    std::fs::write(outside.join("sub/keep"), "x").expect("write");
    let tree = d.path().join("tree");
    std::fs::create_dir_all(tree.join("a")).expect("mkdir");
    std::os::unix::fs::symlink(&outside, tree.join("a/link")).expect("symlink");
    std::os::unix::fs::symlink("/", tree.join("root")).expect("symlink");
    let mut seen = Vec::new();
    walk::<Error, _>(open_dir(&tree).as_fd(), "t", WalkOptions::default(), |v| {
        seen.push((String::from_utf8_lossy(v.path).into_owned(), v.dir.is_some()));
        Ok(Control::Descend)
    })
    .expect("walk");
    assert_eq!(seen, [("a".into(), true), ("a/link".into(), false), ("root".into(), false)]);
    let removed = remove_tree(&tree).expect("remove");
    assert_eq!(removed.entries, 4);
    assert_eq!(std::fs::read_to_string(outside.join("sub/keep")).expect("kept"), "x");
}

#[test]
fn directories_without_permissions_are_removed() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().expect("tempdir");
    let tree = d.path().join("tree");
    std::fs::create_dir_all(tree.join("locked/inner")).expect("mkdir");
    std::fs::write(tree.join("locked/inner/f"), "x").expect("write");
    std::fs::set_permissions(tree.join("locked/inner"), std::fs::Permissions::from_mode(0o000)).expect("chmod");
    std::fs::set_permissions(tree.join("locked"), std::fs::Permissions::from_mode(0o500)).expect("chmod");
    remove_tree(&tree).expect("remove");
    assert!(!tree.exists());
}

#[test]
fn a_wide_directory_is_removed_in_batches() {
    let d = tempfile::tempdir().expect("tempdir");
    let tree = d.path().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    for i in 0..5000 {
        if i % 2 == 0 {
            std::fs::write(tree.join(format!("f{i}")), "").expect("write");
        } else {
            std::fs::create_dir(tree.join(format!("d{i}"))).expect("mkdir");
        }
    }
    assert_eq!(remove_tree(&tree).expect("remove").entries, 5001);
    assert!(!tree.exists());
}

#[test]
fn a_mount_point_inside_is_refused_not_emptied() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (it mounts a tmpfs)");
    let d = tempfile::tempdir().expect("tempdir");
    let mnt = d.path().join("tree/mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    nix::mount::mount(Some("tmpfs"), &mnt, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
        .expect("mount tmpfs");
    /// Unmounts even when the test fails.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let guard = Unmount(&mnt);
    std::fs::write(mnt.join("precious"), "x").expect("write");
    let r = remove_tree(&d.path().join("tree"));
    let kept = mnt.join("precious").exists();
    drop(guard);
    assert!(matches!(r, Err(Error::MountPoint { .. })), "{r:?}");
    assert!(kept, "the mounted file system was not emptied");
}

#[test]
fn a_regular_file_is_just_unlinked() {
    let d = tempfile::tempdir().expect("tempdir");
    let f = d.path().join("f");
    std::fs::write(&f, "x").expect("write");
    assert_eq!(remove_tree(&f).expect("rm").entries, 1);
}

#[test]
fn a_directory_moved_above_the_open_levels_fails_the_walk() {
    let d = scratch();
    chain(d.path(), 200);
    let root = open_dir(d.path());
    let level11 = d.path().join("d/".repeat(11).trim_end_matches('/'));
    let mut moved = false;
    let r = walk::<Error, _>(root.as_fd(), "t", WalkOptions::default(), |v| {
        if v.depth == 150 && !moved {
            // Level 11 now hangs from the root: climbing back through `..`
            // would land somewhere else than the level-10 directory it left.
            std::fs::rename(&level11, d.path().join("x")).expect("rename");
            moved = true;
        }
        Ok(Control::Descend)
    });
    assert!(moved);
    assert!(matches!(r, Err(Error::Changed { .. })), "{r:?}");
}

//! Proof that the guest kernel runs a Debian/Python userland: the
//! python-3.11-slim test image (flattened, as an erofs image) is the lower
//! layer of an overlay root over an ext4 scratch disk, set up as the guest
//! agent does (proc, sysfs, cgroup2, devtmpfs, devpts, /dev/shm, /tmp,
//! loopback up), and `tests/qemu/probe.py` runs in it: bash, ptys,
//! multiprocessing, futexes, epoll/eventfd/timerfd/signalfd, POSIX timers,
//! inotify, memfd, locks, SysV IPC and mqueues, AIO, getrandom, TCP/UDP over
//! IPv4 and IPv6 loopback, unix fd passing, vsock and packet sockets, every
//! namespace, a seccomp filter, cgroup v2 controllers, overlay writes.
//!
//! Needs the test images (`PVISOR_TEST_IMAGES`, default
//! /var/cache/pvisor/test-images; scripts/test.sh builds them) and root (the
//! image's files keep their owners when unpacked).

mod qemu;

use std::path::{Path, PathBuf};
use std::process::Command;

use qemu::{boot_overlay, busybox_initramfs, guest_kernel, marked, one, run, INIT_PRELUDE, MOUNT_OVERLAY_ROOT};

const PROBE: &[u8] = include_bytes!("qemu/probe.py");
const IMAGE: &str = "python-3.11-slim.tar";

/// The test image archive, or `None` after a SKIP line (a failure under
/// `PVISOR_TEST_STRICT=1`).
fn test_image() -> Option<PathBuf> {
    let dir = std::env::var_os("PVISOR_TEST_IMAGES")
        .map_or_else(|| PathBuf::from("/var/cache/pvisor/test-images"), PathBuf::from);
    let image = dir.join(IMAGE);
    let why = format!("test image {} is missing (images/testdata/build-test-images.sh)", image.display());
    pvisor_testkit::require(Some(image).filter(|i| i.is_file()), why)
}

/// Flattens a docker-archive (`docker save` layout) into `root`: layers in
/// order, whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) applied.
fn flatten_docker_archive(archive: &Path, work: &Path, root: &Path) {
    let unpacked = work.join("archive");
    std::fs::create_dir_all(&unpacked).expect("mkdir");
    run(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(&unpacked));
    let layers = run(Command::new("python3")
        .args(["-c", "import json,sys; print('\\n'.join(json.load(open(sys.argv[1]))[0]['Layers']))"])
        .arg(unpacked.join("manifest.json")));
    std::fs::create_dir_all(root).expect("mkdir");
    for layer in layers.lines().filter(|l| !l.is_empty()) {
        let layer = unpacked.join(layer);
        for name in run(Command::new("tar").arg("-tf").arg(&layer)).lines() {
            let name = name.trim_start_matches("./");
            let (dir, base) = name.rsplit_once('/').unwrap_or(("", name));
            assert!(!name.split('/').any(|c| c == ".."), "{name} in {}", layer.display());
            if base == ".wh..wh..opq" {
                let dir = root.join(dir);
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    remove(&entry.path());
                }
            } else if let Some(hidden) = base.strip_prefix(".wh.") {
                remove(&root.join(dir).join(hidden));
            }
        }
        run(Command::new("tar").args(["-xpf"]).arg(&layer).arg("-C").arg(root).args([
            "--numeric-owner",
            "--exclude=.wh.*",
            "--exclude=*/.wh.*",
        ]));
    }
}

fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path).expect("remove dir"),
        Ok(_) => std::fs::remove_file(path).expect("remove file"),
        Err(_) => {}
    }
}

#[test]
fn debian_python_userland_runs_in_the_guest() {
    let Some(kernel) = guest_kernel() else { return };
    let Some(image) = test_image() else { return };
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert!(unsafe { libc::geteuid() } == 0, "this test unpacks an image with its owners: run it as root");
    let tmp = tempfile::tempdir().expect("tempdir");

    let root = tmp.path().join("root");
    flatten_docker_archive(&image, tmp.path(), &root);
    assert!(root.join("usr/bin/python3").exists(), "no python3 in {IMAGE}");
    let lower = tmp.path().join("lower.erofs");
    qemu::erofs_image(&root, &lower);
    std::fs::remove_dir_all(&root).expect("remove the unpacked image");
    let scratch = tmp.path().join("scratch.ext4");
    qemu::ext4_image(&scratch, 64 << 20);

    // Into the sandbox root as the agent must: moved over / and chrooted to
    // (busybox switch_root). A plain chroot would leave the process "chrooted"
    // and unshare(CLONE_NEWUSER) would fail with EPERM; pivot_root is not
    // possible out of an initramfs.
    let script = format!(
        "{INIT_PRELUDE}{MOUNT_OVERLAY_ROOT}{}",
        r#"
R=/newroot
mkdir -p $R/proc $R/sys $R/dev $R/tmp $R/.pvisor
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
ip link set lo up
cp /bin/busybox /probe.py /stage2 $R/.pvisor/
exec switch_root $R /.pvisor/busybox sh /.pvisor/stage2
"#
    );
    let stage2 = r#"/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    python3 /.pvisor/probe.py
echo "PVISOR-PROBE-EXIT $?"
echo PVISOR-INIT-DONE
/.pvisor/busybox reboot -f
"#;
    let initrd = tmp.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(&script, &[("probe.py", PROBE), ("stage2", stage2.as_bytes())]))
        .expect("write initrd");

    let console = boot_overlay(&kernel, &initrd, &lower, &scratch);

    one(&console, "PVISOR-OVERLAY-MOUNTED");
    assert_eq!(one(&console, "PVISOR-PROBE-EXIT "), "0", "{console}");
    let failed = marked(&console, "PVISOR-PROBE FAIL ");
    assert!(failed.is_empty(), "checks failed in the guest:\n  {}\n{console}", failed.join("\n  "));
    let checks = PROBE.split(|&b| b == b'\n').filter(|l| l.starts_with(b"@check")).count();
    assert_eq!(one(&console, "PVISOR-PROBE-DONE "), format!("{checks} checks, 0 failed"));
    assert_eq!(marked(&console, "PVISOR-PROBE ok ").len(), checks, "{console}");
}

//! The agent as `/init` of a Linux guest, under QEMU's microvm machine with
//! software emulation (TCG: this host's KVM cannot run a stock kernel): the
//! image's erofs view on one virtio-blk disk (read-only), an ext4 scratch
//! disk on another, the agent's boot into an overlay of the two, then the
//! self-test (`pvisor.selftest=1`, since QEMU here has no vsock device the
//! agent could serve on) and the guest's power-off.
//!
//! The guest `/init` is the static agent: `PVISOR_GUEST_INIT`, else
//! `$PVISOR_DIST/pvisor-agent` (scripts/test.sh builds it), else built static
//! by this test into its own target directory. The kernel is `PVISOR_GUEST_KERNEL`, else the
//! newest `/var/cache/pvisor/guest/*/vmlinux` (scripts/guest-kernel.sh).
//! Without a kernel the tests print SKIP, except under `PVISOR_TEST_STRICT=1` (a failure).
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A hang guard, not a performance assertion: TCG boots take seconds.
const GUEST_TIMEOUT: Duration = Duration::from_secs(180);
const BUSYBOX: &str = "/bin/busybox";
const HOSTNAME: &str = "guest-test";

fn guest_kernel() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PVISOR_GUEST_KERNEL") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "PVISOR_GUEST_KERNEL={} is not a file", p.display());
        return Some(p);
    }
    let cached = std::fs::read_dir("/var/cache/pvisor/guest").into_iter().flatten().flatten().filter_map(|e| {
        let p = e.path().join("vmlinux");
        let mtime = p.metadata().and_then(|m| m.modified()).ok()?;
        Some((mtime, p))
    });
    if let Some((_, p)) = cached.max() {
        return Some(p);
    }
    pvisor_testkit::skip(
        "no guest kernel (PVISOR_GUEST_KERNEL unset, none in /var/cache/pvisor/guest): run scripts/guest-kernel.sh",
    );
    None
}

fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status();
    assert!(found.is_ok_and(|s| s.success()), "{tool} is needed: apt-get install {package} (scripts/common.sh)");
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The static guest init: `PVISOR_GUEST_INIT`, `$PVISOR_DIST/pvisor-agent`,
/// or the agent built once per test run with `+crt-static` (its own target
/// directory, so the flags do not rebuild the test's).
fn guest_init() -> &'static Path {
    static INIT: OnceLock<PathBuf> = OnceLock::new();
    INIT.get_or_init(|| {
        if let Some(p) = std::env::var_os("PVISOR_GUEST_INIT") {
            return PathBuf::from(p);
        }
        if let Some(dist) = std::env::var_os("PVISOR_DIST") {
            let agent = PathBuf::from(dist).join("pvisor-agent");
            assert!(agent.is_file(), "{} missing (PVISOR_DIST is set)", agent.display());
            return agent;
        }
        // .../target/debug/deps/guest_boot-HASH -> .../target
        let exe = std::env::current_exe().expect("current_exe");
        let target = exe.ancestors().nth(3).expect("target dir").join("guest-init");
        let triple = "x86_64-unknown-linux-gnu";
        run(Command::new(env!("CARGO"))
            .current_dir(pvisor_testkit::manifest_dir(env!("CARGO_MANIFEST_DIR")))
            .args(["build", "--offline", "--locked", "-p", "pvisor-agent", "--bin", "pvisor-agent", "--target", triple])
            .env("CARGO_TARGET_DIR", &target)
            .env("RUSTFLAGS", "-C target-feature=+crt-static"));
        target.join(triple).join("debug/pvisor-agent")
    })
}

/// An initramfs (newc cpio, GNU cpio) with `init` as `/init`, `/dev/console`
/// and the mount points.
fn initramfs(dir: &Path, init: &Path) -> PathBuf {
    let tree = dir.join("initramfs");
    for d in ["dev", "proc", "sys", "mnt/lower", "mnt/scratch", "newroot"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::copy(init, tree.join("init")).unwrap();
    // The console node needs root (mknod); without it the agent opens the
    // console from devtmpfs.
    let _ = nix::sys::stat::mknod(
        &tree.join("dev/console"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(5, 1),
    );
    let list = run(Command::new("find").arg(".").current_dir(&tree));
    let out = dir.join("initramfs.cpio");
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "-R", "0:0", "--quiet"])
        .current_dir(&tree)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .expect("cpio");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &list).unwrap();
    assert!(child.wait().unwrap().success(), "cpio failed");
    out
}

/// A busybox image as erofs. Its /tmp and /dev are symlinks out of the
/// root, /proc is missing: the boot must replace or create them, never
/// mount through them.
fn image(dir: &Path) -> PathBuf {
    let tree = dir.join("image");
    for d in ["bin", "etc", "sys"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::copy(BUSYBOX, tree.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "echo", "ls"] {
        symlink("busybox", tree.join("bin").join(applet)).unwrap();
    }
    std::fs::write(tree.join("etc/image-file"), b"from the image\n").unwrap();
    std::fs::write(tree.join("etc/hostname"), b"image-hostname\n").unwrap();
    // A resolv.conf linked elsewhere (as systemd-resolved images have it):
    // the boot must replace the link, never write through it.
    symlink("/etc/image-file", tree.join("etc/resolv.conf")).unwrap();
    symlink("/mnt", tree.join("tmp")).unwrap();
    symlink("/", tree.join("dev")).unwrap();
    let img = dir.join("erofs.img");
    run(Command::new("mkfs.erofs").arg("--quiet").arg(&img).arg(&tree));
    img
}

/// A sparse ext4 scratch disk.
fn scratch(dir: &Path) -> PathBuf {
    let img = dir.join("scratch.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    run(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&img));
    img
}

/// Boots and returns the console once QEMU exited by itself (panics on a
/// timeout or a QEMU failure, with the console so far).
fn boot(kernel: &Path, initrd: &Path, root: &Path, scratch: &Path, cmdline: &str) -> String {
    boot_with(kernel, initrd, root, scratch, cmdline, &[])
}

/// [`boot`] with `extra` QEMU arguments (a network device).
fn boot_with(kernel: &Path, initrd: &Path, root: &Path, scratch: &Path, cmdline: &str, extra: &[&str]) -> String {
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-M", "microvm,acpi=off", "-cpu", "max", "-m", "256", "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!("console=ttyS0 reboot=t panic=-1 {cmdline}"))
        .arg("-drive")
        .arg(format!("file={},if=none,id=r,format=raw,readonly=on", root.display()))
        .args(["-device", "virtio-blk-device,drive=r"])
        .arg("-drive")
        .arg(format!("file={},if=none,id=s,format=raw", scratch.display()))
        .args(["-device", "virtio-blk-device,drive=s"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).replace("\r\n", "\n")
    });
    let deadline = Instant::now() + GUEST_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    let console = reader.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("the guest did not end within {GUEST_TIMEOUT:?}:\n{console}"));
    assert!(status.success(), "qemu: {status}\n{stderr}\n{console}");
    // Shown with --nocapture, and by the harness for a failed test.
    println!("--- console ---\n{console}--- end ---");
    console
}

/// Everything a boot needs, in one temporary directory.
struct Guest {
    dir: tempfile::TempDir,
    kernel: PathBuf,
    initrd: PathBuf,
    root: PathBuf,
    scratch: PathBuf,
}

fn guest() -> Option<Guest> {
    let kernel = guest_kernel()?;
    for (tool, package) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("mkfs.erofs", "erofs-utils"),
        ("mkfs.ext4", "e2fsprogs"),
        ("debugfs", "e2fsprogs"),
        ("cpio", "cpio"),
    ] {
        require_tool(tool, package);
    }
    assert!(Path::new(BUSYBOX).is_file(), "{BUSYBOX} is needed: apt-get install busybox-static");
    let dir = tempfile::tempdir().unwrap();
    let initrd = initramfs(dir.path(), guest_init());
    let root = image(dir.path());
    let scratch = scratch(dir.path());
    Some(Guest { dir, kernel, initrd, root, scratch })
}

/// The output of one debugfs request on the ext4 image `img`.
fn debugfs(img: &Path, request: &str) -> String {
    let out = run(Command::new("debugfs").arg("-R").arg(request).arg(img).stderr(Stdio::null()));
    String::from_utf8_lossy(&out).into_owned()
}

fn debugfs_cat(img: &Path, path: &str) -> String {
    debugfs(img, &format!("cat {path}"))
}

fn selftest_line<'a>(console: &'a str, check: &str) -> &'a str {
    let prefix = format!("pvisor-selftest: {check}: ");
    let line = console.lines().find(|l| l.starts_with(&prefix));
    line.unwrap_or_else(|| panic!("no {prefix:?} line on the console:\n{console}"))
}

#[test]
fn boots_into_the_overlay_and_writes_land_on_the_scratch_disk() {
    let Some(g) = guest() else { return };
    let image_before = std::fs::read(&g.root).unwrap();
    let console = boot(
        &g.kernel,
        &g.initrd,
        &g.root,
        &g.scratch,
        &format!("pvisor.root=/dev/vda pvisor.scratch=/dev/vdb pvisor.hostname={HOSTNAME} pvisor.selftest=1"),
    );
    assert!(console.contains("pvisor-agent: sandbox root ready"), "{console}");
    // vsock and grpc go through the guest kernel's vsock loopback transport
    // (CONFIG_VSOCKETS_LOOPBACK): the agent's listener, accepting twice.
    for check in ["shell", "root", "mounts", "hostname", "loopback", "vsock", "grpc"] {
        assert!(selftest_line(&console, check).contains(": ok "), "{check}:\n{console}");
    }
    assert!(console.contains("pvisor-selftest: done, 0 failed"), "{console}");

    // Writes went to the overlay's upper on the scratch disk...
    assert_eq!(debugfs_cat(&g.scratch, "/upper/x"), "ok\n");
    // ...including the boot's copy-up of an image file it rewrote.
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/hostname"), format!("{HOSTNAME}\n"));
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/image-file"), "", "an untouched image file is not copied up");
    // The image's /tmp and /dev symlinks were replaced by directories in the
    // upper (mounts went inside the new root, not through the links).
    for d in ["/upper/tmp", "/upper/dev", "/upper/proc"] {
        let stat = debugfs(&g.scratch, &format!("stat {d}"));
        assert!(stat.contains("Type: directory"), "{d}: {stat}");
    }
    // ...and the image's disk is unchanged.
    assert!(std::fs::read(&g.root).unwrap() == image_before, "the erofs image was modified");
    drop(g.dir);
}

#[test]
fn a_failed_boot_says_why_on_the_console_and_powers_off() {
    let Some(g) = guest() else { return };
    // An unknown key: the worker and agent disagree on the command line.
    let console = boot(&g.kernel, &g.initrd, &g.root, &g.scratch, "pvisor.rootfs=/dev/vda");
    assert!(
        console.contains("pvisor-agent: boot failed: kernel command line: pvisor.rootfs=/dev/vda: unknown key"),
        "{console}"
    );
    // The disks swapped: the scratch disk is not erofs.
    let console = boot(&g.kernel, &g.initrd, &g.scratch, &g.root, "pvisor.root=/dev/vda pvisor.scratch=/dev/vdb");
    assert!(console.contains("pvisor-agent: boot failed: mount erofs /dev/vda on /mnt/lower: E"), "{console}");
    assert!(!console.contains("Kernel panic"), "powered off, not panicked:\n{console}");
}

/// A test image archive (scripts build them into /var/cache/pvisor/test-images).
fn test_image(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("PVISOR_TEST_IMAGES")
        .map_or_else(|| PathBuf::from("/var/cache/pvisor/test-images"), PathBuf::from);
    let path = dir.join(name);
    let why = format!("test image {} is missing (images/testdata/build-test-images.sh)", path.display());
    pvisor_testkit::require(Some(path).filter(|p| p.exists()), why)
}

/// Imports `archive` into a pool under `dir` and writes the image's erofs
/// view out to a file, as the vm backend will serve it over virtio-blk.
fn pool_erofs(dir: &Path, archive: &Path) -> PathBuf {
    use pvisor_images::{erofs::ErofsView, Options, Pool};
    let pool = Pool::open_with(&dir.join("pool"), Options::default()).unwrap();
    let records = pool.import(archive).unwrap();
    let fs = ErofsView::new(std::sync::Arc::new(pool.view(&records[0]).unwrap())).unwrap();
    let path = dir.join("pool-view.erofs");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < fs.len() {
        let n = fs.read_at(offset, &mut buf).unwrap();
        assert!(n > 0, "short read at {offset} of {}", fs.len());
        std::io::Write::write_all(&mut out, &buf[..n]).unwrap();
        offset += n as u64;
    }
    std::io::Write::flush(&mut out).unwrap();
    path
}

#[test]
fn boots_a_debian_image_of_the_pool_through_its_erofs_view() {
    let Some(g) = guest() else { return };
    let Some(archive) = test_image("debian-bookworm-slim.tar") else { return };
    let root = pool_erofs(g.dir.path(), &archive);
    // `single`: a bare word the kernel hands to init as an argument.
    let cmdline = "pvisor.hostname=debian-guest pvisor.selftest=1 single";
    let console = boot(&g.kernel, &g.initrd, &root, &g.scratch, cmdline);
    for check in ["shell", "root", "mounts", "hostname", "loopback", "vsock", "grpc"] {
        assert!(selftest_line(&console, check).contains(": ok "), "{check}:\n{console}");
    }
    assert!(console.contains("pvisor-selftest: done, 0 failed"), "{console}");
    assert_eq!(debugfs_cat(&g.scratch, "/upper/x"), "ok\n");
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/hostname"), "debian-guest\n");
}

#[test]
fn with_a_network_eth0_is_configured_and_resolv_conf_written() {
    let Some(g) = guest() else { return };
    // A virtio-net device with nothing behind it (a QEMU hub of one port):
    // the boot's configuration is what is checked here; frames through the
    // project's own device are vmm/tests/virtio_net_qemu.rs.
    let extra = [
        "-netdev",
        "hubport,id=n0,hubid=0",
        "-device",
        "virtio-net-device,netdev=n0,mac=02:70:76:00:00:64,host_mtu=65520",
    ];
    let cmdline = format!("pvisor.hostname={HOSTNAME} pvisor.selftest=1 pvisor.net=1");
    let console = boot_with(&g.kernel, &g.initrd, &g.root, &g.scratch, &cmdline, &extra);
    let line = selftest_line(&console, "network");
    assert!(line.contains(": ok eth0 up, mtu 65520, default via 10.0.2.2, resolv.conf written"), "{line}\n{console}");
    assert!(console.contains("pvisor-selftest: done, 0 failed"), "{console}");
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/resolv.conf"), pvisor_net::plan::resolv_conf());
    let stat = debugfs(&g.scratch, "stat /upper/etc/resolv.conf");
    assert!(stat.contains("Type: regular"), "the image's symlink was replaced by a file: {stat}");
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/image-file"), "", "the link's target was not written");
    assert_eq!(debugfs_cat(&g.scratch, "/upper/etc/hosts"), pvisor_net::plan::hosts(HOSTNAME));
}

#[test]
fn without_the_network_key_no_resolv_conf_is_written() {
    let Some(g) = guest() else { return };
    let cmdline = format!("pvisor.hostname={HOSTNAME} pvisor.selftest=1");
    let console = boot(&g.kernel, &g.initrd, &g.root, &g.scratch, &cmdline);
    assert!(selftest_line(&console, "network").contains(": SKIP "), "{console}");
    let stat = debugfs(&g.scratch, "stat /upper/etc/resolv.conf");
    assert!(!stat.contains("Type: regular"), "no resolv.conf without a network: {stat}");
}

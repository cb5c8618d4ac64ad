//! Proof that the guest kernel (scripts/guest-kernel.sh) boots and has the
//! options the vm backend relies on: QEMU's microvm machine under TCG
//! (software emulation; this host's KVM cannot run a stock Linux kernel)
//! boots `vmlinux` directly with an initramfs written by
//! `pvisor_vmm::initramfs`, whose `/init` is a busybox script that reports
//! what it finds on the serial console and then ends the guest with
//! `reboot -f` (`reboot=t` + `-no-reboot`: QEMU exits by itself).
//!
//! The kernel comes from `PVISOR_GUEST_KERNEL` (scripts/test.sh sets it).
//! Without it the tests print SKIP, except under CI (`CI=true`), where they fail.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use pvisor_vmm::initramfs::Initramfs;

/// How long a guest may take before it is killed and the test fails (a hang
/// guard, not a performance assertion: TCG boots take a few seconds).
const GUEST_TIMEOUT: Duration = Duration::from_secs(120);
const BUSYBOX: &str = "/bin/busybox";

/// The kernel to boot, or `None` (after printing SKIP) where none was built.
fn guest_kernel() -> Option<PathBuf> {
    match std::env::var_os("PVISOR_GUEST_KERNEL") {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "PVISOR_GUEST_KERNEL={} is not a file", path.display());
            Some(path)
        }
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("PVISOR_GUEST_KERNEL is unset under CI: scripts/test.sh builds it with scripts/guest-kernel.sh")
        }
        None => {
            println!(
                "SKIP: PVISOR_GUEST_KERNEL is unset (build one with scripts/guest-kernel.sh, or run scripts/test.sh)"
            );
            None
        }
    }
}

fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool} is needed for this test: apt-get install {package} (scripts/common.sh installs it)");
}

/// An initramfs with static busybox, `/dev/console` and `script` as `/init`.
fn busybox_initramfs(script: &str) -> Vec<u8> {
    assert!(Path::new(BUSYBOX).is_file(), "{BUSYBOX} is needed: apt-get install busybox-static");
    let mut archive = Initramfs::new();
    let dirs =
        ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "mnt", "mnt/lower", "mnt/scratch"];
    for dir in dirs.into_iter().chain(["newroot"]) {
        archive.dir(dir, 0o755).expect("dir");
    }
    archive
        .char_dev("dev/console", 0o600, 5, 1)
        .and_then(|a| a.char_dev("dev/null", 0o666, 1, 3))
        .and_then(|a| a.file_from("bin/busybox", 0o755, Path::new(BUSYBOX)))
        .and_then(|a| a.file("init", 0o755, script.as_bytes().to_vec()))
        .expect("initramfs");
    archive.to_bytes().expect("initramfs bytes")
}

/// The start of every test `/init`: proc first (to read the uptime at /init),
/// then busybox's applets, sysfs and devtmpfs.
const INIT_PRELUDE: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
echo "PVISOR-UPTIME $(/bin/busybox cat /proc/uptime)"
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo PVISOR-BOOT-OK
echo "PVISOR-CMDLINE $(cat /proc/cmdline)"
echo "PVISOR-VIRTIO $(ls /sys/bus/virtio/devices | tr '\n' ' ')"
for b in /sys/block/vd*; do [ -e "$b" ] && echo "PVISOR-DISK ${b##*/} $(cat $b/serial) $(cat $b/ro)"; done
"#;

/// A virtio-blk disk for the guest; `serial` is how the guest tells disks apart.
struct Disk<'a> {
    path: &'a Path,
    serial: &'a str,
    read_only: bool,
}

/// Boots `kernel` with `initrd` and `disks` under QEMU TCG and returns the
/// serial console output once QEMU has exited by itself (panics on timeout,
/// on a QEMU failure, or if the guest never reached the end of its /init).
fn boot(kernel: &Path, initrd: &Path, disks: &[Disk], extra_cmdline: &str) -> String {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-M", "microvm,acpi=off", "-cpu", "max", "-m", "256", "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!("console=ttyS0 reboot=t panic=-1 {extra_cmdline}"));
    for (i, disk) in disks.iter().enumerate() {
        let ro = if disk.read_only { ",readonly=on" } else { "" };
        cmd.arg("-drive").arg(format!("file={},if=none,id=d{i},format=raw{ro}", disk.path.display()));
        cmd.arg("-device").arg(format!("virtio-blk-device,drive=d{i},serial={}", disk.serial));
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting qemu-system-x86_64");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).replace("\r\n", "\n")
    });
    let err_reader = thread::spawn(move || {
        let mut buf = String::new();
        let _ = stderr.read_to_string(&mut buf);
        buf
    });

    let deadline = Instant::now() + GUEST_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for qemu") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let console = out_reader.join().expect("stdout reader");
    let qemu_err = err_reader.join().expect("stderr reader");
    let Some(status) = status else {
        panic!("the guest did not end within {GUEST_TIMEOUT:?} (killed)\n--- console ---\n{console}\n--- qemu ---\n{qemu_err}")
    };
    assert!(status.success(), "qemu exited with {status}\n--- console ---\n{console}\n--- qemu ---\n{qemu_err}");
    assert!(
        console.contains("PVISOR-INIT-DONE"),
        "the guest's /init did not finish\n--- console ---\n{console}\n--- qemu ---\n{qemu_err}"
    );
    // Shown with --nocapture (cargo keeps a passing test's output to itself).
    println!("--- console ---\n{console}");
    if let Some(line) = console.lines().find(|l| l.starts_with("PVISOR-UPTIME")) {
        println!("guest uptime at /init (seconds, idle): {line}");
    }
    console
}

/// The lines of `console` that start with `marker`, marker removed.
fn marked<'a>(console: &'a str, marker: &str) -> Vec<&'a str> {
    console.lines().filter_map(|l| l.strip_prefix(marker)).map(str::trim).collect()
}

fn sparse_file(path: &Path, len: u64) {
    let file = std::fs::File::create(path).expect("create disk");
    file.set_len(len).expect("size disk");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kernel_boots_to_init_with_console_cmdline_and_virtio_blk() {
    let Some(kernel) = guest_kernel() else { return };
    require_tool("qemu-system-x86_64", "qemu-system-x86");
    let tmp = tempfile::tempdir().expect("tempdir");
    let initrd = tmp.path().join("initrd.cpio");
    let script = format!("{INIT_PRELUDE}echo PVISOR-INIT-DONE\nreboot -f\n");
    std::fs::write(&initrd, busybox_initramfs(&script)).expect("write initrd");
    let disk = tmp.path().join("disk.raw");
    sparse_file(&disk, 8 << 20);

    let console =
        boot(&kernel, &initrd, &[Disk { path: &disk, serial: "pvisor-disk0", read_only: false }], "pvisor.test=boot");

    assert_eq!(marked(&console, "PVISOR-BOOT-OK").len(), 1, "{console}");
    let cmdline = marked(&console, "PVISOR-CMDLINE ");
    let words: Vec<&str> = cmdline.first().map(|c| c.split_whitespace().collect()).unwrap_or_default();
    assert!(words.contains(&"pvisor.test=boot"), "{console}");
    // Without ACPI, the only way the guest learns of the disk is QEMU's
    // virtio_mmio.device= on the command line (VIRTIO_MMIO_CMDLINE_DEVICES).
    assert!(words.iter().any(|w| w.starts_with("virtio_mmio.device=")), "{console}");
    assert!(!marked(&console, "PVISOR-VIRTIO ").first().copied().unwrap_or_default().is_empty(), "{console}");
    // virtio-blk was probed: /sys/block/vda exists, with the serial QEMU gave it, writable.
    assert_eq!(marked(&console, "PVISOR-DISK "), ["vda pvisor-disk0 0"], "{console}");
}

#[test]
fn erofs_ext4_and_overlay_work_in_the_guest() {
    let Some(kernel) = guest_kernel() else { return };
    require_tool("qemu-system-x86_64", "qemu-system-x86");
    require_tool("mkfs.erofs", "erofs-utils");
    require_tool("mkfs.ext4", "e2fsprogs");
    require_tool("debugfs", "e2fsprogs");
    let tmp = tempfile::tempdir().expect("tempdir");

    // The lower layer: an erofs image of a small tree.
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).expect("mkdir");
    std::fs::write(tree.join("hello.txt"), "hello from erofs\n").expect("write");
    std::fs::write(tree.join("etc/os-release"), "ID=pvisor-test\n").expect("write");
    std::os::unix::fs::symlink("etc/os-release", tree.join("os-release")).expect("symlink");
    let lower = tmp.path().join("lower.erofs");
    run(Command::new("mkfs.erofs").arg("--quiet").arg(&lower).arg(&tree));
    // The scratch disk: an empty ext4 on a sparse file.
    let scratch = tmp.path().join("scratch.ext4");
    sparse_file(&scratch, 32 << 20);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&scratch));

    let script = format!(
        "{INIT_PRELUDE}{}",
        r#"
for b in /sys/block/vd*; do
    case "$(cat $b/serial)" in
        lower) LOWER=/dev/${b##*/} ;;
        scratch) SCRATCH=/dev/${b##*/} ;;
    esac
done
mount -t erofs -o ro "$LOWER" /mnt/lower && echo PVISOR-EROFS-MOUNTED
echo "PVISOR-EROFS-READ $(cat /mnt/lower/hello.txt)"
echo "PVISOR-EROFS-LINK $(cat /mnt/lower/os-release)"
mount -t ext4 "$SCRATCH" /mnt/scratch && echo PVISOR-EXT4-MOUNTED
mkdir /mnt/scratch/upper /mnt/scratch/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/scratch/upper,workdir=/mnt/scratch/work /newroot \
    && echo PVISOR-OVERLAY-MOUNTED
echo "written in the guest" > /newroot/new.txt
echo "changed" >> /newroot/hello.txt
echo "PVISOR-OVERLAY-NEW $(cat /newroot/new.txt)"
echo "PVISOR-OVERLAY-CHANGED $(cat /newroot/hello.txt | tr '\n' '|')"
echo "PVISOR-LOWER-AFTER $(cat /mnt/lower/hello.txt)"
umount /newroot && umount /mnt/scratch && umount /mnt/lower && echo PVISOR-UNMOUNTED
echo PVISOR-INIT-DONE
reboot -f
"#
    );
    let initrd = tmp.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(&script)).expect("write initrd");

    let console = boot(
        &kernel,
        &initrd,
        &[
            Disk { path: &lower, serial: "lower", read_only: true },
            Disk { path: &scratch, serial: "scratch", read_only: false },
        ],
        "",
    );

    let one = |marker: &str| -> String {
        let lines = marked(&console, marker);
        assert_eq!(lines.len(), 1, "expected one {marker} line\n{console}");
        lines[0].to_owned()
    };
    one("PVISOR-EROFS-MOUNTED");
    assert_eq!(one("PVISOR-EROFS-READ "), "hello from erofs");
    assert_eq!(one("PVISOR-EROFS-LINK "), "ID=pvisor-test");
    one("PVISOR-EXT4-MOUNTED");
    one("PVISOR-OVERLAY-MOUNTED");
    assert_eq!(one("PVISOR-OVERLAY-NEW "), "written in the guest");
    assert_eq!(one("PVISOR-OVERLAY-CHANGED "), "hello from erofs|changed|");
    assert_eq!(one("PVISOR-LOWER-AFTER "), "hello from erofs");
    one("PVISOR-UNMOUNTED");

    // What the guest wrote is on the ext4 disk: the new file and the copied-up one.
    let read = |path: &str| run(Command::new("debugfs").arg("-R").arg(format!("cat {path}")).arg(&scratch));
    assert_eq!(read("/upper/new.txt"), "written in the guest\n");
    assert_eq!(read("/upper/hello.txt"), "hello from erofs\nchanged\n");
}

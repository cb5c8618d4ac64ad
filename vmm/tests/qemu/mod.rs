//! The harness of the QEMU TCG guest tests: finds the guest kernel, writes a
//! busybox initramfs with `pvisor_vmm::initramfs`, makes disk images, boots
//! QEMU's microvm machine under TCG (software emulation; this host's KVM
//! cannot run a stock Linux kernel) and returns the serial console.
//!
//! A guest's `/init` reports on the console with lines that start with
//! `PVISOR-` markers, prints `PVISOR-INIT-DONE` when it got to its end, and
//! ends the guest with `reboot -f` (`reboot=t` + `-no-reboot`: QEMU exits).
//!
//! The kernel comes from `PVISOR_GUEST_KERNEL` (scripts/test.sh sets it).
//! Without it the tests print SKIP, except under `PVISOR_TEST_STRICT=1`, where they fail.

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use pvisor_vmm::initramfs::Initramfs;

/// How long a guest may take before it is killed and the test fails (a hang
/// guard, not a performance assertion: these TCG boots take seconds).
const GUEST_TIMEOUT: Duration = Duration::from_secs(120);
const BUSYBOX: &str = "/bin/busybox";

/// The kernel to boot, or `None` (after printing SKIP) where none was built.
pub fn guest_kernel() -> Option<PathBuf> {
    required_env("PVISOR_GUEST_KERNEL", "scripts/guest-kernel.sh builds it")
}

/// A path from the environment, or `None` after a SKIP line; under
/// `PVISOR_TEST_STRICT=1` its absence is a failure.
pub fn required_env(var: &str, hint: &str) -> Option<PathBuf> {
    let path = pvisor_testkit::require_env(var, &format!("{hint}; scripts/test.sh sets it"))?;
    assert!(path.exists(), "{var}={} does not exist", path.display());
    Some(path)
}

/// Panics with the package to install when `tool` is not on PATH.
pub fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool} is needed for this test: apt-get install {package} (scripts/common.sh installs it)");
}

/// An initramfs with static busybox, `/dev/console`, the mount points the
/// tests use, `extra` files (path, content) at its root and `script` as `/init`.
pub fn busybox_initramfs(script: &str, extra: &[(&str, &[u8])]) -> Vec<u8> {
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
    for (path, content) in extra {
        archive.file(path, 0o644, content.to_vec()).expect("extra file");
    }
    archive.to_bytes().expect("initramfs bytes")
}

/// The start of every test `/init`: proc first (to read the uptime at /init),
/// then busybox's applets, sysfs and devtmpfs, then what the guest found.
pub const INIT_PRELUDE: &str = r#"#!/bin/busybox sh
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

/// Mounts the disk with serial `lower` (erofs, read-only) on /mnt/lower, the
/// one with serial `scratch` (ext4) on /mnt/scratch, and an overlay of the
/// two on /newroot, as the guest agent does.
pub const MOUNT_OVERLAY_ROOT: &str = r#"
for b in /sys/block/vd*; do
    case "$(cat $b/serial)" in
        lower) LOWER=/dev/${b##*/} ;;
        scratch) SCRATCH=/dev/${b##*/} ;;
    esac
done
mount -t erofs -o ro "$LOWER" /mnt/lower && echo PVISOR-EROFS-MOUNTED
mount -t ext4 "$SCRATCH" /mnt/scratch && echo PVISOR-EXT4-MOUNTED
mkdir /mnt/scratch/upper /mnt/scratch/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/scratch/upper,workdir=/mnt/scratch/work /newroot \
    && echo PVISOR-OVERLAY-MOUNTED
"#;

/// The end of every test `/init`.
pub const INIT_END: &str = "echo PVISOR-INIT-DONE\nreboot -f\n";

/// A virtio-blk disk for the guest; `serial` is how the guest tells disks apart.
pub struct Disk<'a> {
    pub path: &'a Path,
    pub serial: &'a str,
    pub read_only: bool,
}

/// [`boot`] with the sandbox's two disks: a read-only `lower` (vda, serial
/// "lower") and a writable `scratch` (vdb, serial "scratch").
pub fn boot_overlay(kernel: &Path, initrd: &Path, lower: &Path, scratch: &Path) -> String {
    let disks = [
        Disk { path: lower, serial: "lower", read_only: true },
        Disk { path: scratch, serial: "scratch", read_only: false },
    ];
    boot(kernel, initrd, &disks, "", &[])
}

/// Boots `kernel` with `initrd` and `disks` under QEMU TCG and returns the
/// serial console output once QEMU has exited by itself (panics on timeout,
/// on a QEMU failure, or if the guest never reached the end of its /init).
/// `extra_args` go to QEMU as they are (e.g. a network device).
pub fn boot(kernel: &Path, initrd: &Path, disks: &[Disk], extra_cmdline: &str, extra_args: &[&str]) -> String {
    try_boot(kernel, initrd, disks, extra_cmdline, extra_args).unwrap_or_else(|failure| panic!("{failure}"))
}

/// [`boot`], with the failure (console and QEMU's errors included) returned
/// instead of panicking, so a test can add the state of its own device
/// models to it.
pub fn try_boot(
    kernel: &Path,
    initrd: &Path,
    disks: &[Disk],
    extra_cmdline: &str,
    extra_args: &[&str],
) -> Result<String, String> {
    require_tool("qemu-system-x86_64", "qemu-system-x86");
    let mut cmd = Command::new("qemu-system-x86_64");
    // acpi=off: without ACPI tables QEMU lists the virtio-mmio devices on the
    // kernel command line (virtio_mmio.device=), which our kernel parses.
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
    cmd.args(extra_args);
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
    let failure = |what: String| Err(format!("{what}\n--- console ---\n{console}\n--- qemu ---\n{qemu_err}"));
    let Some(status) = status else {
        return failure(format!("the guest did not end within {GUEST_TIMEOUT:?} (killed)"));
    };
    if !status.success() {
        return failure(format!("qemu exited with {status}"));
    }
    if !console.contains("PVISOR-INIT-DONE") {
        return failure("the guest's /init did not finish".to_string());
    }
    // Shown with --nocapture (cargo keeps a passing test's output to itself).
    println!("--- console ---\n{console}");
    if !qemu_err.is_empty() {
        println!("--- qemu ---\n{qemu_err}");
    }
    if let Some(line) = console.lines().find(|l| l.starts_with("PVISOR-UPTIME")) {
        println!("guest uptime at /init (seconds, idle): {line}");
    }
    Ok(console)
}

/// The lines of `console` that start with `marker`, marker removed.
pub fn marked<'a>(console: &'a str, marker: &str) -> Vec<&'a str> {
    console.lines().filter_map(|l| l.strip_prefix(marker)).map(str::trim).collect()
}

/// The one line that starts with `marker` (marker removed); panics unless exactly one.
pub fn one(console: &str, marker: &str) -> String {
    let lines = marked(console, marker);
    assert_eq!(lines.len(), 1, "expected one {marker:?} line\n{console}");
    lines[0].to_owned()
}

/// Runs `cmd`, panics with its stderr unless it succeeds, returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A sparse file of `len` bytes.
pub fn sparse_file(path: &Path, len: u64) {
    let file = std::fs::File::create(path).expect("create disk");
    file.set_len(len).expect("size disk");
}

/// An erofs image (uncompressed, as `mkfs.erofs` makes by default) of `tree`.
pub fn erofs_image(tree: &Path, image: &Path) {
    require_tool("mkfs.erofs", "erofs-utils");
    run(Command::new("mkfs.erofs").arg("--quiet").arg(image).arg(tree));
}

/// An empty ext4 filesystem on a sparse file of `len` bytes.
pub fn ext4_image(image: &Path, len: u64) {
    require_tool("mkfs.ext4", "e2fsprogs");
    sparse_file(image, len);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image));
}

/// The content of `path` in the ext4 filesystem `image`, read on the host.
pub fn ext4_read(image: &Path, path: &str) -> String {
    require_tool("debugfs", "e2fsprogs");
    run(Command::new("debugfs").arg("-R").arg(format!("cat {path}")).arg(image))
}

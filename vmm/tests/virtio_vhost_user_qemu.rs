//! A Linux guest under QEMU (TCG, `-M microvm`) driving this crate's
//! virtio-blk and virtio-vsock models through the vhost-user back-ends.
//!
//! The guest is the kernel helper's cached `vmlinux`
//! (`/var/cache/pvisor/guest/*/vmlinux`, or `PVISOR_GUEST_KERNEL`) with an
//! initramfs built here: Debian's static busybox as the shell and, when gcc
//! is present, a small static vsock program. The guest reads a marker from
//! the disk, writes a line back, discards a range, connects to the host over vsock, then
//! accepts a host-initiated connection and echoes it.
//!
//! Without a kernel or QEMU the test prints SKIP and passes; under
//! `PVISOR_TEST_STRICT=1`, or with `PVISOR_GUEST_KERNEL` set, a missing piece fails it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pvisor_vmm::devices::virtio::block::{Block, FileBackend};
use pvisor_vmm::devices::virtio::vhost_user;
use pvisor_vmm::devices::virtio::vsock::Vsock;

const DISK_MARKER: &[u8] = b"pvisor-disk-marker-0123456789";
const GUEST_LINE: &[u8] = b"guest-wrote-this";
const GUEST_CID: u64 = 3;

/// Whether every piece must be there (CI, or a kernel given explicitly).
fn strict() -> bool {
    pvisor_testkit::strict() || std::env::var_os("PVISOR_GUEST_KERNEL").is_some()
}

/// Prints SKIP and returns None, or panics where the piece is required.
fn require(what: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_none() {
        assert!(
            !strict(),
            "{what} is required here (PVISOR_TEST_STRICT=1 or PVISOR_GUEST_KERNEL set) but was not found"
        );
        eprintln!("SKIP virtio_vhost_user_qemu: no {what}");
    }
    found
}

fn find_kernel() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PVISOR_GUEST_KERNEL") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "PVISOR_GUEST_KERNEL={} is not a file", path.display());
        return Some(path);
    }
    let dirs = std::fs::read_dir("/var/cache/pvisor/guest").ok()?;
    dirs.filter_map(Result::ok).map(|d| d.path().join("vmlinux")).find(|p| p.is_file())
}

fn find_program(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A newc cpio archive, the initramfs format.
struct Cpio(Vec<u8>, u32);

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.1 += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.1,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.0.extend_from_slice(header.as_bytes());
        self.0.extend_from_slice(name.as_bytes());
        self.0.push(0);
        self.pad();
        self.0.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.0.len() & 3 != 0 {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.0
    }
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
echo "DISK-HEAD: $(/bin/busybox head -c 29 /dev/vda)"
echo guest-wrote-this | /bin/busybox dd of=/dev/vda bs=512 seek=16 conv=fsync 2>/dev/null
/bin/busybox sync
/bin/busybox blkdiscard -o 65536 -l 65536 /dev/vda && echo DISCARD-OK
if [ -x /bin/vsock-test ]; then /bin/vsock-test; fi
echo GUEST-DONE
/bin/busybox reboot -f
"#;

const VSOCK_C: &str = r#"
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void) {
    char buf[64];
    int s = socket(AF_VSOCK, SOCK_STREAM, 0);
    struct sockaddr_vm host = { .svm_family = AF_VSOCK, .svm_cid = 2, .svm_port = 5000 };
    if (s < 0 || connect(s, (struct sockaddr *)&host, sizeof host) != 0) { perror("VSOCK-ERR connect"); return 1; }
    if (write(s, "ping", 4) != 4) { perror("VSOCK-ERR write"); return 1; }
    int n = read(s, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    printf("VSOCK-GOT: %s\n", buf);
    close(s);

    int l = socket(AF_VSOCK, SOCK_STREAM, 0);
    struct sockaddr_vm any = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = 1024 };
    if (l < 0 || bind(l, (struct sockaddr *)&any, sizeof any) != 0 || listen(l, 1) != 0) { perror("VSOCK-ERR listen"); return 1; }
    printf("VSOCK-LISTENING\n");
    fflush(stdout);
    int c = accept(l, NULL, NULL);
    if (c < 0) { perror("VSOCK-ERR accept"); return 1; }
    n = read(c, buf, sizeof buf);
    if (n > 0 && write(c, buf, n) != n) { perror("VSOCK-ERR echo"); return 1; }
    close(c);
    printf("VSOCK-ECHOED\n");
    return 0;
}
"#;

fn build_vsock_program(dir: &Path) -> Option<Vec<u8>> {
    let gcc = find_program("gcc")?;
    std::fs::write(dir.join("vsock.c"), VSOCK_C).ok()?;
    let out = dir.join("vsock-test");
    let status = Command::new(gcc).args(["-static", "-O2", "-o"]).arg(&out).arg(dir.join("vsock.c")).status().ok()?;
    if !status.success() {
        eprintln!("NOTE: static vsock test program did not build; vsock part skipped");
        return None;
    }
    std::fs::read(out).ok()
}

fn build_initramfs(dir: &Path, busybox: &Path, vsock: Option<&[u8]>) -> PathBuf {
    let mut cpio = Cpio(Vec::new(), 0);
    for d in ["bin", "dev", "proc", "sys"] {
        cpio.entry(d, 0o040755, (0, 0), &[]);
    }
    cpio.entry("dev/console", 0o020600, (5, 1), &[]);
    cpio.entry("init", 0o100755, (0, 0), INIT.as_bytes());
    cpio.entry("bin/busybox", 0o100755, (0, 0), &std::fs::read(busybox).expect("read busybox"));
    if let Some(program) = vsock {
        cpio.entry("bin/vsock-test", 0o100755, (0, 0), program);
    }
    let path = dir.join("initramfs.cpio");
    std::fs::write(&path, cpio.finish()).expect("write initramfs");
    path
}

/// Prints the vhost-user libraries' warnings and errors (they use `log`).
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("[{} {}] {}", record.level(), record.target(), record.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLog = StderrLog;

#[test]
fn linux_guest_uses_vhost_user_blk_and_vsock() {
    let _ = log::set_logger(&LOGGER).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let Some(kernel) = require("guest kernel (/var/cache/pvisor/guest/*/vmlinux)", find_kernel()) else { return };
    let Some(qemu) = require("qemu-system-x86_64", find_program("qemu-system-x86_64")) else { return };
    let Some(busybox) =
        require("static busybox (/bin/busybox)", Some(PathBuf::from("/bin/busybox")).filter(|p| p.is_file()))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let vsock_program = build_vsock_program(dir.path());
    let initramfs = build_initramfs(dir.path(), &busybox, vsock_program.as_deref());

    // The disk: a marker at its start, 1 MiB in all.
    let disk_path = dir.path().join("disk.img");
    let disk_file = std::fs::File::create(&disk_path).expect("disk");
    disk_file.set_len(1 << 20).expect("size disk");
    disk_file.write_all_at(DISK_MARKER, 0).expect("marker");
    disk_file.write_all_at(&[0xaa; 65536], 65536).expect("range the guest discards");
    let disk =
        FileBackend::new(std::fs::OpenOptions::new().read(true).write(true).open(&disk_path).expect("open"), false)
            .expect("backend");
    let blk_sock = dir.path().join("blk.sock");
    let blk =
        vhost_user::serve("vhost-user-blk", Block::new(Arc::new(disk), "pvisor-test"), &blk_sock).expect("serve blk");

    let uds = dir.path().join("vsock");
    let vsock = Vsock::new(GUEST_CID, Some(uds.clone())).expect("vsock");
    let handle = vsock.handle();
    let vsock_sock = dir.path().join("vsock.sock");
    let vsock_server = vhost_user::serve("vhost-user-vsock", vsock, &vsock_sock).expect("serve vsock");

    // Host side of the guest's connection to port 5000, then a
    // host-initiated connection to the guest's port 1024.
    let mut port_path = uds.clone().into_os_string();
    port_path.push("_5000");
    let listener = UnixListener::bind(PathBuf::from(port_path)).expect("bind host port");
    let host_log = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = host_log.clone();
    let host = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("guest connects");
        let mut ping = [0u8; 4];
        conn.read_exact(&mut ping).expect("read ping");
        log.lock().expect("log").push(String::from_utf8_lossy(&ping).into_owned());
        conn.write_all(b"pong").expect("pong");
        // The guest listens on 1024 soon after; RST until then.
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut stream = loop {
            match handle.connect(1024, Duration::from_secs(60)) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("connect to guest port 1024: {e}"),
            }
        };
        stream.write_all(b"echo-me").expect("write");
        let mut echoed = [0u8; 7];
        stream.read_exact(&mut echoed).expect("read echo");
        log.lock().expect("log").push(String::from_utf8_lossy(&echoed).into_owned());
    });

    let mut child = Command::new(qemu)
        .args([
            "-M",
            "microvm,acpi=off,memory-backend=mem",
            "-object",
            "memory-backend-memfd,id=mem,size=256M,share=on",
        ])
        .args(["-m", "256M", "-cpu", "max", "-smp", "1", "-nodefaults", "-no-user-config", "-nographic"])
        .args(["-serial", "stdio", "-no-reboot", "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initramfs)
        .args(["-append", "console=ttyS0 reboot=t panic=-1"])
        .arg("-chardev")
        .arg(format!("socket,id=blk,path={}", blk_sock.display()))
        .args(["-device", "vhost-user-blk,chardev=blk,num-queues=1"])
        .arg("-chardev")
        .arg(format!("socket,id=vs,path={}", vsock_sock.display()))
        .args(["-device", "vhost-user-vsock-device,chardev=vs"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let console = Arc::new(Mutex::new(String::new()));
    let console_w = console.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut c = console_w.lock().expect("console");
            c.push_str(&line);
            c.push('\n');
        }
    });
    // Hang guard (TCG on a shared CPU is slow; this is not a speed check).
    let deadline = Instant::now()
        + Duration::from_secs(std::env::var("PVISOR_QEMU_TEST_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(600));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait qemu") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("wait qemu");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    reader.join().expect("console reader");
    let stderr = err_reader.join().expect("stderr reader");
    let console = console.lock().expect("console").clone();
    let blk_result = blk.join();
    let vsock_result = vsock_server.join();
    let context = format!(
        "qemu {status}\n--- console ---\n{console}\n--- stderr ---\n{stderr}\n--- back-ends ---\nblk: {blk_result:?}\nvsock: {vsock_result:?}"
    );

    assert!(console.contains("GUEST-DONE"), "guest did not finish\n{context}");
    let marker = String::from_utf8_lossy(DISK_MARKER);
    assert!(console.contains(&format!("DISK-HEAD: {marker}")), "guest did not read the disk\n{context}");
    let mut written = vec![0u8; GUEST_LINE.len()];
    std::fs::File::open(&disk_path).expect("disk").read_exact_at(&mut written, 16 * 512).expect("read disk");
    assert_eq!(written, GUEST_LINE, "guest write did not reach the disk file\n{context}");
    assert!(console.contains("DISCARD-OK"), "guest discard failed\n{context}");
    let mut discarded = vec![0xffu8; 65536];
    std::fs::File::open(&disk_path).expect("disk").read_exact_at(&mut discarded, 65536).expect("read disk");
    assert!(discarded.iter().all(|b| *b == 0), "discarded range reads as zeros\n{context}");
    assert!(blk_result.is_ok(), "blk server ends cleanly when qemu exits\n{context}");

    if vsock_program.is_some() {
        assert!(console.contains("VSOCK-GOT: pong"), "vsock guest→host failed\n{context}");
        assert!(console.contains("VSOCK-ECHOED"), "vsock host→guest failed\n{context}");
        host.join().expect("host side");
        assert_eq!(*host_log.lock().expect("log"), vec!["ping".to_string(), "echo-me".to_string()]);
    } else {
        assert!(!strict(), "the static vsock test program is required here (gcc -static failed or missing)");
        eprintln!("SKIP (vsock part): no static vsock test program (gcc)");
    }
    assert!(vsock_result.is_ok(), "vsock server ends cleanly when qemu exits\n{context}");
}

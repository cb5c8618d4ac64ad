//! Proof that the guest kernel (scripts/guest-kernel.sh) boots under QEMU TCG
//! and has the block and filesystem options the vm backend relies on: it
//! reaches an initramfs `/init` written by `pvisor_vmm::initramfs` with the
//! console and command line, finds virtio-mmio devices from the command line
//! (a virtio-blk disk, and a virtio-net NIC that carries a TCP connection to
//! the host through QEMU user networking),
//! mounts an erofs image read-only and an ext4 disk read-write, and runs an
//! overlay of the two (the sandbox root of the vm backend).

mod qemu;

use std::io::{BufRead, BufReader, ErrorKind};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use qemu::{
    boot, boot_overlay, busybox_initramfs, guest_kernel, marked, one, Disk, INIT_END, INIT_PRELUDE, MOUNT_OVERLAY_ROOT,
};

/// Brings eth0 up with QEMU user networking's fixed guest address and sends
/// one line to the port given as `pvisor.port=` on the command line.
const NET_HELLO: &str = r#"
for n in /sys/class/net/eth*; do echo "PVISOR-NET ${n##*/} $(basename $(readlink $n/device/driver))"; done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
PORT=$(sed -n 's/.*pvisor\.port=\([0-9]*\).*/\1/p' /proc/cmdline)
echo "PVISOR-HELLO from the guest" | nc -w 10 10.0.2.2 "$PORT"
"#;

#[test]
fn kernel_boots_to_init_with_console_cmdline_virtio_blk_and_net() {
    let Some(kernel) = guest_kernel() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let initrd = tmp.path().join("initrd.cpio");
    let script = format!("{INIT_PRELUDE}{NET_HELLO}{INIT_END}");
    std::fs::write(&initrd, busybox_initramfs(&script, &[])).expect("write initrd");
    let disk = tmp.path().join("disk.raw");
    qemu::sparse_file(&disk, 8 << 20);

    // virtio-net over QEMU's user-mode network: the guest connects to a
    // listener on the host's loopback (10.0.2.2 in the guest) and says hello.
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let guest_ended = Arc::new(AtomicBool::new(false));
    let hello = thread::spawn({
        let guest_ended = guest_ended.clone();
        move || accept_one_line(&listener, &guest_ended)
    });

    let console = boot(
        &kernel,
        &initrd,
        &[Disk { path: &disk, serial: "pvisor-disk0", read_only: false }],
        &format!("pvisor.test=boot pvisor.port={port}"),
        &["-netdev", "user,id=n0", "-device", "virtio-net-device,netdev=n0"],
    );
    guest_ended.store(true, Ordering::SeqCst);

    assert_eq!(marked(&console, "PVISOR-BOOT-OK").len(), 1, "{console}");
    let cmdline = one(&console, "PVISOR-CMDLINE ");
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    assert!(words.contains(&"pvisor.test=boot"), "{console}");
    // Without ACPI, the only way the guest learns of the disk is QEMU's
    // virtio_mmio.device= on the command line (VIRTIO_MMIO_CMDLINE_DEVICES).
    assert!(words.iter().any(|w| w.starts_with("virtio_mmio.device=")), "{console}");
    assert_eq!(one(&console, "PVISOR-VIRTIO ").split_whitespace().count(), 2, "{console}");
    // virtio-blk was probed: /sys/block/vda exists, with the serial QEMU gave it, writable.
    assert_eq!(marked(&console, "PVISOR-DISK "), ["vda pvisor-disk0 0"], "{console}");
    // virtio-net was probed and carried a TCP connection to the host.
    assert_eq!(one(&console, "PVISOR-NET "), "eth0 virtio_net", "{console}");
    assert_eq!(hello.join().expect("listener thread").as_deref(), Some("PVISOR-HELLO from the guest"), "{console}");
}

/// The first line sent by the first client of `listener`, or `None` if no
/// client had come when `guest_ended` was set.
fn accept_one_line(listener: &TcpListener, guest_ended: &AtomicBool) -> Option<String> {
    listener.set_nonblocking(true).expect("nonblocking");
    loop {
        // Read the flag before trying, so a connection made just before the guest ended is seen.
        let last_try = guest_ended.load(Ordering::SeqCst);
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).expect("blocking");
                stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
                let mut line = String::new();
                BufReader::new(stream).read_line(&mut line).ok()?;
                return Some(line.trim_end().to_owned());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && last_try => return None,
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn erofs_ext4_and_overlay_work_in_the_guest() {
    let Some(kernel) = guest_kernel() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");

    // The lower layer: an erofs image of a small tree.
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("etc")).expect("mkdir");
    std::fs::write(tree.join("hello.txt"), "hello from erofs\n").expect("write");
    std::fs::write(tree.join("etc/os-release"), "ID=pvisor-test\n").expect("write");
    std::os::unix::fs::symlink("etc/os-release", tree.join("os-release")).expect("symlink");
    let lower = tmp.path().join("lower.erofs");
    qemu::erofs_image(&tree, &lower);
    // The scratch disk: an empty ext4 on a sparse file.
    let scratch = tmp.path().join("scratch.ext4");
    qemu::ext4_image(&scratch, 32 << 20);

    let script = format!(
        "{INIT_PRELUDE}{MOUNT_OVERLAY_ROOT}{}{INIT_END}",
        r#"
echo "PVISOR-EROFS-READ $(cat /mnt/lower/hello.txt)"
echo "PVISOR-EROFS-LINK $(cat /mnt/lower/os-release)"
echo "written in the guest" > /newroot/new.txt
echo "changed" >> /newroot/hello.txt
echo "PVISOR-OVERLAY-NEW $(cat /newroot/new.txt)"
echo "PVISOR-OVERLAY-CHANGED $(cat /newroot/hello.txt | tr '\n' '|')"
echo "PVISOR-LOWER-AFTER $(cat /mnt/lower/hello.txt)"
touch /mnt/lower/x 2>/dev/null || echo PVISOR-EROFS-READONLY
umount /newroot && umount /mnt/scratch && umount /mnt/lower && echo PVISOR-UNMOUNTED
"#
    );
    let initrd = tmp.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(&script, &[])).expect("write initrd");

    let console = boot_overlay(&kernel, &initrd, &lower, &scratch);

    one(&console, "PVISOR-EROFS-MOUNTED");
    assert_eq!(one(&console, "PVISOR-EROFS-READ "), "hello from erofs");
    assert_eq!(one(&console, "PVISOR-EROFS-LINK "), "ID=pvisor-test");
    one(&console, "PVISOR-EXT4-MOUNTED");
    one(&console, "PVISOR-OVERLAY-MOUNTED");
    assert_eq!(one(&console, "PVISOR-OVERLAY-NEW "), "written in the guest");
    assert_eq!(one(&console, "PVISOR-OVERLAY-CHANGED "), "hello from erofs|changed|");
    assert_eq!(one(&console, "PVISOR-LOWER-AFTER "), "hello from erofs");
    one(&console, "PVISOR-EROFS-READONLY");
    one(&console, "PVISOR-UNMOUNTED");

    // What the guest wrote is on the ext4 disk: the new file and the copied-up one.
    assert_eq!(qemu::ext4_read(&scratch, "/upper/new.txt"), "written in the guest\n");
    assert_eq!(qemu::ext4_read(&scratch, "/upper/hello.txt"), "hello from erofs\nchanged\n");
}

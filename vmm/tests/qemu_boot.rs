//! Proof that the guest kernel (scripts/guest-kernel.sh) boots under QEMU TCG
//! and has the block and filesystem options the vm backend relies on: it
//! reaches an initramfs `/init` written by `pvisor_vmm::initramfs` with the
//! console and command line, finds virtio-mmio disks from the command line,
//! mounts an erofs image read-only and an ext4 disk read-write, and runs an
//! overlay of the two (the sandbox root of the vm backend).

mod qemu;

use qemu::{boot, busybox_initramfs, guest_kernel, marked, one, Disk, INIT_END, INIT_PRELUDE, MOUNT_OVERLAY_ROOT};

#[test]
fn kernel_boots_to_init_with_console_cmdline_and_virtio_blk() {
    let Some(kernel) = guest_kernel() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let initrd = tmp.path().join("initrd.cpio");
    std::fs::write(&initrd, busybox_initramfs(&format!("{INIT_PRELUDE}{INIT_END}"), &[])).expect("write initrd");
    let disk = tmp.path().join("disk.raw");
    qemu::sparse_file(&disk, 8 << 20);

    let console =
        boot(&kernel, &initrd, &[Disk { path: &disk, serial: "pvisor-disk0", read_only: false }], "pvisor.test=boot");

    assert_eq!(marked(&console, "PVISOR-BOOT-OK").len(), 1, "{console}");
    let cmdline = one(&console, "PVISOR-CMDLINE ");
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    assert!(words.contains(&"pvisor.test=boot"), "{console}");
    // Without ACPI, the only way the guest learns of the disk is QEMU's
    // virtio_mmio.device= on the command line (VIRTIO_MMIO_CMDLINE_DEVICES).
    assert!(words.iter().any(|w| w.starts_with("virtio_mmio.device=")), "{console}");
    assert_eq!(one(&console, "PVISOR-VIRTIO "), "virtio0", "{console}");
    // virtio-blk was probed: /sys/block/vda exists, with the serial QEMU gave it, writable.
    assert_eq!(marked(&console, "PVISOR-DISK "), ["vda pvisor-disk0 0"], "{console}");
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

    let console = boot(
        &kernel,
        &initrd,
        &[
            Disk { path: &lower, serial: "lower", read_only: true },
            Disk { path: &scratch, serial: "scratch", read_only: false },
        ],
        "",
    );

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

//! PVH direct boot with a minimal ELF "kernel" (tests/guests/pvh.S): linux-loader finds the
//! PVH note, the VMM writes hvm_start_info, the memory map and the command line, and enters
//! the kernel in 32-bit protected mode with ebx pointing at the start info.

mod common;

use std::path::Path;
use std::process::Command;

use pvisor_vmm::layout::{CMDLINE_START, KERNEL_START, PVH_INFO_START, PVH_MEMMAP_START};
use pvisor_vmm::{VmBuilder, VmExit};
use vm_memory::{Bytes, GuestAddress};

/// Assembles and links the PVH guest into an ELF file.
fn pvh_kernel() -> std::fs::File {
    let dir = common::guests_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pvh-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let (obj, elf) = (out.join("pvh.o"), out.join("pvh.elf"));
    for cmd in [
        Command::new("as").arg("--64").arg("-I").arg(&dir).arg("-o").arg(&obj).arg(dir.join("pvh.S")).output(),
        Command::new("ld").arg("-T").arg(dir.join("pvh.ld")).arg("-o").arg(&elf).arg(&obj).output(),
    ] {
        let cmd = cmd.expect("binutils is expected on these hosts");
        assert!(cmd.status.success(), "{}", String::from_utf8_lossy(&cmd.stderr));
    }
    std::fs::File::open(&elf).unwrap()
}

#[test]
fn pvh_boot_writes_start_info_and_enters_the_kernel() {
    common::require_kvm();
    let mut builder = VmBuilder::new(common::config()).unwrap();
    let mut kernel = pvh_kernel();
    let mut initramfs = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut initramfs, &[0x5a; 5000]).unwrap();
    let boot = builder.load_pvh(&mut kernel, "console=ttyS0 reboot=t", Some(&mut initramfs)).unwrap();

    // What the VMM wrote for the kernel.
    let mem = builder.memory();
    assert_eq!(mem.read_obj::<u32>(GuestAddress(PVH_INFO_START)).unwrap(), 0x336e_c578);
    assert_eq!(mem.read_obj::<u64>(GuestAddress(PVH_INFO_START + 0x18)).unwrap(), CMDLINE_START);
    assert_eq!(mem.read_obj::<u64>(GuestAddress(PVH_INFO_START + 0x28)).unwrap(), PVH_MEMMAP_START);
    let mut cmdline = [0u8; 23];
    mem.read_slice(&mut cmdline, GuestAddress(CMDLINE_START)).unwrap();
    assert_eq!(&cmdline, b"console=ttyS0 reboot=t\0");
    let (initrd_addr, initrd_size) = boot.initramfs.unwrap();
    assert_eq!(initrd_size, 5000);
    assert_eq!(initrd_addr % 4096, 0);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(initrd_addr + 4999)).unwrap(), 0x5a);
    assert_eq!(mem.read_obj::<u32>(GuestAddress(PVH_INFO_START + 0xc)).unwrap(), 1, "one module");
    let mut mp = [0u8; 4];
    mem.read_slice(&mut mp, GuestAddress(pvisor_vmm::boot::mptable::MPTABLE_START)).unwrap();
    assert_eq!(&mp, b"_MP_", "the MP table's floating pointer, for a kernel without ACPI");
    match boot.entry {
        pvisor_vmm::boot::EntryState::Protected32 { entry, start_info } => {
            assert!(entry >= KERNEL_START && entry < boot.kernel_end, "{entry:#x}");
            assert_eq!(start_info, PVH_INFO_START);
        }
        other => panic!("PVH enters in protected mode, not {other:?}"),
    }

    // And the kernel runs: 32-bit protected mode at the PVH entry (PVM runs this small
    // low-address guest too), ebx = &hvm_start_info.
    let vm = builder.build().unwrap();
    let console = vm.console();
    let exit = vm.run();
    let out = String::from_utf8_lossy(&console.lock().unwrap().contents()).into_owned();
    assert_eq!(exit, VmExit::DebugExit(0x20), "console: {out}");
    assert_eq!(out, "console=ttyS0 reboot=t\n1\n");
}

#[test]
fn a_kernel_without_a_pvh_note_is_refused() {
    common::require_kvm();
    // The flat test guests' objects are ELF files without the note.
    let dir = common::guests_dir();
    let obj = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nonote-{}.o", std::process::id()));
    let out = Command::new("as")
        .arg("--64")
        .arg("-I")
        .arg(&dir)
        .arg("-o")
        .arg(&obj)
        .arg(dir.join("hello.S"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let elf = obj.with_extension("elf");
    let out = Command::new("ld").args(["-Ttext=0x100000", "-e", "_start", "-o"]).arg(&elf).arg(&obj).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut builder = VmBuilder::new(common::config()).unwrap();
    let err = builder.load_pvh(&mut std::fs::File::open(&elf).unwrap(), "", None).unwrap_err();
    assert!(matches!(err, pvisor_vmm::vm::Error::Boot(pvisor_vmm::boot::Error::NoPvhEntry)), "{err}");
}

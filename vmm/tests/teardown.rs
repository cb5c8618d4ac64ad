//! A VM leaves nothing behind: once `run` returns, its KVM fds and its guest memory memfd are
//! closed. Alone in its test binary, so no other test's VM shares the process's fd table.

mod common;

/// The process's fds that belong to a VM: KVM's VM and vCPU fds, the guest RAM memfd.
fn vm_fds() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|t| t.contains("kvm-vm") || t.contains("kvm-vcpu") || t.contains("memfd:pvisor-guest-ram"))
        .collect()
}

#[test]
fn run_releases_the_kvm_fds_and_the_memfd() {
    common::require_kvm();
    assert!(vm_fds().is_empty(), "no VM yet: {:?}", vm_fds());
    let mut builder = pvisor_vmm::VmBuilder::new(common::config()).unwrap();
    builder.load_flat(&common::guest("hello")).unwrap();
    let vm = builder.build().unwrap();
    let during = vm_fds();
    assert!(during.iter().any(|t| t.contains("kvm-vm")), "{during:?}");
    assert!(during.iter().any(|t| t.contains("kvm-vcpu")), "{during:?}");
    assert!(during.iter().any(|t| t.contains("memfd:pvisor-guest-ram")), "{during:?}");
    assert_eq!(vm.run(), pvisor_vmm::VmExit::DebugExit(0x11));
    assert!(vm_fds().is_empty(), "left behind: {:?}", vm_fds());
}

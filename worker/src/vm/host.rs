//! What this host offers the vm backend.
//!
//! KVM comes in three shapes here: hardware virtualization (VT-x/AMD-V, the
//! `vmx`/`svm` CPU flags), PVM (`kvm_pvm`, software virtualization with
//! shadow paging: small low-address guests run, no stock Linux kernel
//! boots), or none. Only hardware virtualization boots the Linux guest under
//! the project's own VMM; a test-only engine runs it under QEMU's TCG.
use std::path::Path;

/// The kind of virtualization `/dev/kvm` provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Virtualization {
    /// VT-x or AMD-V: the product path.
    Hardware,
    /// PVM: test guests only.
    Pvm,
    /// No usable KVM.
    None,
}

impl Virtualization {
    pub fn describe(self) -> &'static str {
        match self {
            Virtualization::Hardware => "hardware virtualization (KVM on VT-x/AMD-V)",
            Virtualization::Pvm => "PVM (software KVM: low-address test guests only, no Linux guest)",
            Virtualization::None => "no KVM",
        }
    }
}

/// What the probe found.
#[derive(Clone, Debug)]
pub struct HostSupport {
    pub virtualization: Virtualization,
    /// `/dev/kvm` exists and this process can open it read-write.
    pub kvm_access: Result<(), String>,
}

fn cpu_has_virt_flag(cpuinfo: &str) -> bool {
    cpuinfo.lines().filter(|l| l.starts_with("flags")).any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// Probes the host (cheap: a few file reads and one open).
pub fn probe() -> HostSupport {
    let kvm_access = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| format!("/dev/kvm: {e}"));
    let pvm = Path::new("/sys/module/kvm_pvm").is_dir();
    let hw = std::fs::read_to_string("/proc/cpuinfo").map(|c| cpu_has_virt_flag(&c)).unwrap_or(false);
    let virtualization = match (&kvm_access, hw, pvm) {
        (Err(_), _, _) if !Path::new("/dev/kvm").exists() => Virtualization::None,
        (_, true, false) => Virtualization::Hardware,
        (_, _, true) => Virtualization::Pvm,
        (_, false, false) => Virtualization::None,
    };
    HostSupport { virtualization, kvm_access }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virt_flags_are_read_from_the_flags_line_only() {
        assert!(cpu_has_virt_flag("processor: 0\nflags\t\t: fpu vme vmx sse\n"));
        assert!(cpu_has_virt_flag("flags : svm\n"));
        assert!(!cpu_has_virt_flag("flags : fpu vme sse\nmodel name: vmx-like\n"));
    }
}

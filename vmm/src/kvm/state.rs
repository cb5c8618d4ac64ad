//! Saving and restoring what KVM holds of a VM: per vCPU (registers, FPU/XSAVE, MSRs, local
//! APIC, pending events, MP state, debug registers, CPUID) and per VM (PIC, IOAPIC, PIT,
//! kvmclock).
//!
//! The state is captured from a [`VcpuView`]: a second fd of a vCPU (a `dup` of it, with its
//! own `kvm_run` mapping) that the snapshotting thread owns while the vCPU's own thread is
//! parked at the pause gate. KVM serialises vCPU ioctls on the vCPU's mutex and lets any thread
//! issue them, so the vCPU threads keep their narrow seccomp filter (`KVM_RUN` and two GETs).
//!
//! Not every piece is available on every KVM: XSAVE, XCRs, the debug registers and some MSRs
//! may be refused (PVM here reports what it supports). A piece KVM refuses to give is recorded
//! in [`VcpuState::missing`] and not restored; the FPU is then restored from the legacy
//! `KVM_GET_FPU` image. MSRs are read one index-list entry at a time where a batch stops early,
//! so one unreadable MSR does not lose the others.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
    KVM_CLOCK_REALTIME, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

use super::Error;

fn ioctl(name: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Ioctl(name, e.into())
}

/// The legacy x87/SSE image of `KVM_GET_FPU` (kvm-bindings has no serde for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FpuState {
    fpr: Vec<[u8; 16]>,
    fcw: u16,
    fsw: u16,
    ftwx: u8,
    last_opcode: u16,
    last_ip: u64,
    last_dp: u64,
    xmm: Vec<[u8; 16]>,
    mxcsr: u32,
}

impl From<&kvm_fpu> for FpuState {
    fn from(f: &kvm_fpu) -> Self {
        FpuState {
            fpr: f.fpr.to_vec(),
            fcw: f.fcw,
            fsw: f.fsw,
            ftwx: f.ftwx,
            last_opcode: f.last_opcode,
            last_ip: f.last_ip,
            last_dp: f.last_dp,
            xmm: f.xmm.to_vec(),
            mxcsr: f.mxcsr,
        }
    }
}

impl FpuState {
    fn to_kvm(&self) -> kvm_fpu {
        let mut f = kvm_fpu {
            fcw: self.fcw,
            fsw: self.fsw,
            ftwx: self.ftwx,
            last_opcode: self.last_opcode,
            last_ip: self.last_ip,
            last_dp: self.last_dp,
            mxcsr: self.mxcsr,
            ..Default::default()
        };
        for (dst, src) in f.fpr.iter_mut().zip(&self.fpr) {
            *dst = *src;
        }
        for (dst, src) in f.xmm.iter_mut().zip(&self.xmm) {
            *dst = *src;
        }
        f
    }
}

/// One vCPU's state, as KVM gives it.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// The vCPU's id (APIC id).
    pub id: u8,
    /// The CPUID table it ran with (restored as is, so the guest sees the same CPU).
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// General-purpose registers, `rip`, `rflags`.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers, EFER, the APIC base.
    pub sregs: kvm_sregs,
    /// x87/SSE (always).
    pub fpu: FpuState,
    /// The XSAVE area (AVX and up), where KVM gives it.
    pub xsave: Option<kvm_xsave>,
    /// Extended control registers (XCR0), where KVM gives them.
    pub xcrs: Option<kvm_xcrs>,
    /// Debug registers, where KVM gives them.
    pub debugregs: Option<kvm_debugregs>,
    /// The local APIC's registers.
    pub lapic: kvm_lapic_state,
    /// Pending exceptions, interrupts, NMIs, the interrupt shadow.
    pub events: kvm_vcpu_events,
    /// Runnable, halted, waiting for INIT/SIPI.
    pub mp_state: kvm_mp_state,
    /// MSRs of `KVM_GET_MSR_INDEX_LIST` that KVM let the VMM read, `(index, value)`.
    pub msrs: Vec<(u32, u64)>,
    /// MSRs of the index list KVM refused to read (not restored).
    pub unreadable_msrs: Vec<u32>,
    /// Pieces KVM refused to give (not restored), by ioctl name.
    pub missing: Vec<String>,
}

/// What KVM holds per VM: the in-kernel irqchip, the PIT and kvmclock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    /// PIC master, PIC slave, IOAPIC (`KVM_GET_IRQCHIP` by chip id).
    pub irqchips: Vec<kvm_irqchip>,
    /// The PIT's channels.
    pub pit: kvm_pit_state2,
    /// kvmclock at the snapshot (with the host's realtime, when KVM gives it).
    pub clock: Option<kvm_clock_data>,
}

/// Reads a piece KVM may refuse: `Some` or a note in `missing`.
fn optional<T>(missing: &mut Vec<String>, name: &str, r: Result<T, kvm_ioctls::Error>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            missing.push(format!("{name}: {e}"));
            None
        }
    }
}

/// MSR values `(index, value)` and the indexes KVM refused.
type MsrRead = (Vec<(u32, u64)>, Vec<u32>);

/// Reads every MSR of `list` KVM lets the VMM read; returns the values and the refused indexes.
fn read_msrs(fd: &VcpuFd, list: &[u32]) -> Result<MsrRead, Error> {
    let mut values = Vec::with_capacity(list.len());
    let mut refused = Vec::new();
    let mut rest = list;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> =
            rest.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut table = Msrs::from_entries(&entries).map_err(|_| Error::Table("MSR"))?;
        // KVM_GET_MSRS stops at the first MSR it cannot read and returns how many it read.
        let read = fd.get_msrs(&mut table).map_err(ioctl("KVM_GET_MSRS"))?;
        values.extend(table.as_slice()[..read].iter().map(|e| (e.index, e.data)));
        if read < rest.len() {
            refused.push(rest[read]);
            rest = &rest[read + 1..];
        } else {
            rest = &[];
        }
    }
    Ok((values, refused))
}

/// Writes `msrs`; returns the indexes KVM refused (the others are set).
fn write_msrs(fd: &VcpuFd, msrs: &[(u32, u64)]) -> Result<Vec<u32>, Error> {
    let mut refused = Vec::new();
    let mut rest = msrs;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> =
            rest.iter().map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
        let table = Msrs::from_entries(&entries).map_err(|_| Error::Table("MSR"))?;
        let set = fd.set_msrs(&table).map_err(ioctl("KVM_SET_MSRS"))?;
        if set < rest.len() {
            refused.push(rest[set].0);
            rest = &rest[set + 1..];
        } else {
            rest = &[];
        }
    }
    Ok(refused)
}

/// Captures vCPU `id`'s state through `fd` (the vCPU must not be inside `KVM_RUN`).
pub(super) fn save_vcpu(fd: &VcpuFd, id: u8, msr_list: &[u32]) -> Result<VcpuState, Error> {
    let mut missing = Vec::new();
    let cpuid = fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES).map_err(ioctl("KVM_GET_CPUID2"))?;
    let (msrs, unreadable_msrs) = read_msrs(fd, msr_list)?;
    Ok(VcpuState {
        id,
        cpuid: cpuid.as_slice().to_vec(),
        regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        fpu: FpuState::from(&fd.get_fpu().map_err(ioctl("KVM_GET_FPU"))?),
        xsave: optional(&mut missing, "KVM_GET_XSAVE", fd.get_xsave()),
        xcrs: optional(&mut missing, "KVM_GET_XCRS", fd.get_xcrs()),
        debugregs: optional(&mut missing, "KVM_GET_DEBUGREGS", fd.get_debug_regs()),
        lapic: fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?,
        events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        mp_state: fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
        msrs,
        unreadable_msrs,
        missing,
    })
}

/// Puts `state` into a freshly created vCPU, in the order Firecracker uses (CPUID first, since
/// it decides which MSRs and XSAVE features are valid; events last). Returns the MSRs KVM
/// refused to set.
pub(super) fn restore_vcpu(fd: &VcpuFd, state: &VcpuState) -> Result<Vec<u32>, Error> {
    let cpuid = CpuId::from_entries(&state.cpuid).map_err(|_| Error::Table("CPUID"))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    fd.set_mp_state(state.mp_state).map_err(ioctl("KVM_SET_MP_STATE"))?;
    fd.set_regs(&state.regs).map_err(ioctl("KVM_SET_REGS"))?;
    fd.set_sregs(&state.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
    fd.set_fpu(&state.fpu.to_kvm()).map_err(ioctl("KVM_SET_FPU"))?;
    if let Some(xsave) = &state.xsave {
        // SAFETY: KVM reads `guest_fpu.uabi_size` bytes from the pointer, which exceeds the
        // 4 KiB `kvm_xsave` only for dynamically enabled features (AMX) after the process asked
        // for them with ARCH_REQ_XCOMP_GUEST_PERM, which this VMM never does.
        unsafe { fd.set_xsave(xsave) }.map_err(ioctl("KVM_SET_XSAVE"))?;
    }
    if let Some(xcrs) = &state.xcrs {
        fd.set_xcrs(xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    }
    if let Some(debugregs) = &state.debugregs {
        fd.set_debug_regs(debugregs).map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    }
    fd.set_lapic(&state.lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    let refused = write_msrs(fd, &state.msrs)?;
    fd.set_vcpu_events(&state.events).map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
    Ok(refused)
}

const IRQCHIPS: [u32; 3] = [KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC];

/// Captures the irqchip, PIT and clock of a VM whose vCPUs are all parked.
pub(super) fn save_vm(fd: &kvm_ioctls::VmFd) -> Result<VmState, Error> {
    let mut irqchips = Vec::with_capacity(IRQCHIPS.len());
    for chip_id in IRQCHIPS {
        let mut chip = kvm_irqchip { chip_id, ..Default::default() };
        fd.get_irqchip(&mut chip).map_err(ioctl("KVM_GET_IRQCHIP"))?;
        irqchips.push(chip);
    }
    let pit = fd.get_pit2().map_err(ioctl("KVM_GET_PIT2"))?;
    let clock = fd.get_clock().ok();
    Ok(VmState { irqchips, pit, clock })
}

/// Puts `state` into a fresh VM (irqchip and PIT created, no vCPU yet). The clock is set with
/// `KVM_CLOCK_REALTIME` where the snapshot recorded the host's realtime: KVM then advances it by
/// the wall time elapsed since the snapshot, so a restored guest's kvmclock is right.
pub(super) fn restore_vm(fd: &kvm_ioctls::VmFd, state: &VmState) -> Result<(), Error> {
    for chip in &state.irqchips {
        fd.set_irqchip(chip).map_err(ioctl("KVM_SET_IRQCHIP"))?;
    }
    fd.set_pit2(&state.pit).map_err(ioctl("KVM_SET_PIT2"))?;
    if let Some(clock) = &state.clock {
        let clock = kvm_clock_data { flags: clock.flags & KVM_CLOCK_REALTIME, ..*clock };
        fd.set_clock(&clock).map_err(ioctl("KVM_SET_CLOCK"))?;
    }
    Ok(())
}

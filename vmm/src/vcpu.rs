//! The vCPU thread: its seccomp filter, its `KVM_RUN` loop, and how other threads stop it.
//!
//! Each vCPU runs on a thread of its own. Before its first `KVM_RUN` the thread installs the
//! `vcpu` seccomp filter (an allow list: `KVM_RUN` and the few vCPU ioctls by request number,
//! futex, eventfd writes, ...), so guest-driven code (device emulation on exits) runs jailed.
//! Exits are dispatched to the PIO and MMIO [`Bus`]es; an exit that ends the VM goes to the
//! shared [`ExitLatch`], which every vCPU checks before re-entering the guest.
//!
//! Stopping a vCPU that is inside the guest (or blocked in `hlt`) takes a signal: [`kick`]
//! sends [`kick_signal`] to the thread, whose handler sets `kvm_run.immediate_exit`, so
//! `KVM_RUN` returns `EINTR` whether the signal lands inside it or just before it. The caller
//! sets the latch first; the vCPU sees it after the interrupted `KVM_RUN` and leaves.
//!
//! Pausing uses the same kick: the pauser sets the [`PauseGate`]'s request first, and the vCPU,
//! which checks the gate before every `KVM_RUN`, parks on it (a futex wait) until a resume or
//! the VM's end.
//!
//! The kick signal's handler is process-wide: a process that runs VMs must not use
//! `SIGRTMIN` for anything else.

use std::cell::Cell;
use std::ptr;
use std::sync::{Arc, Once};

use kvm_bindings::{kvm_run, KVM_SYSTEM_EVENT_RESET};
use pvisor_seccomp::BpfProgram;

use crate::bus::Bus;
use crate::exit::{ExitLatch, VmExit};
use crate::kvm::{Exit, Vcpu};
use crate::pause::PauseGate;

thread_local! {
    /// The running vCPU's `kvm_run`, for the kick handler. Const-initialised and without a
    /// destructor, so reading it from a signal handler does no allocation or registration.
    static RUN_AREA: Cell<*mut kvm_run> = const { Cell::new(ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread out of `KVM_RUN` (the first real-time signal).
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_signal: libc::c_int) {
    let area = RUN_AREA.with(|a| a.get());
    if !area.is_null() {
        // SAFETY: RUN_AREA is only non-null while the vCPU that owns this mapping runs its loop
        // on this thread (it is reset before the Vcpu is dropped), and a byte store is
        // async-signal-safe; KVM reads the flag at its next entry.
        unsafe { ptr::addr_of_mut!((*area).immediate_exit).write_volatile(1) };
    }
}

/// Installs the kick handler, once per process.
pub fn install_kick_handler() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: sigaction with a zeroed struct, an empty mask and a handler that only does
        // an async-signal-safe store; no SA_RESTART, so KVM_RUN returns EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_kick as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(kick_signal(), &action, ptr::null_mut()) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
    });
    result
}

/// Sends the kick signal to `thread` (a vCPU thread that has not been joined yet).
pub fn kick(thread: libc::pthread_t) {
    // SAFETY: `thread` is a live or finished-but-unjoined thread of this process (the caller
    // holds its JoinHandle), so the id is valid; a failure (thread gone) is harmless.
    unsafe {
        libc::pthread_kill(thread, kick_signal());
    }
}

/// What a vCPU thread needs.
pub struct VcpuThread {
    /// The vCPU, configured.
    pub vcpu: Vcpu,
    /// Port I/O devices.
    pub pio: Arc<Bus>,
    /// MMIO devices.
    pub mmio: Arc<Bus>,
    /// Where the VM's end is recorded.
    pub exit: Arc<ExitLatch>,
    /// Where the vCPU parks while the VM is paused.
    pub pause: Arc<PauseGate>,
    /// The seccomp filter to install before the first `KVM_RUN` (`None`: run unfiltered).
    pub filter: Option<Arc<BpfProgram>>,
}

impl VcpuThread {
    /// The thread body: filter, then run until the latch is set, parking before a `KVM_RUN`
    /// while a pause is requested. Returns the vCPU so that
    /// the joining thread closes its fd and unmaps its `kvm_run` (syscalls the filtered vCPU
    /// thread has no business making).
    pub fn run(mut self) -> Vcpu {
        if let Some(filter) = &self.filter {
            if let Err(e) = pvisor_seccomp::apply_to_thread(filter) {
                self.fail(format!("vCPU {}: installing its seccomp filter: {e}", self.vcpu.id()));
                return self.vcpu;
            }
        }
        RUN_AREA.with(|a| a.set(self.vcpu.run_area()));
        while !self.exit.is_set() {
            if self.pause.is_requested() {
                // Finish the last exit's instruction inside KVM before parking, so that state
                // read while parked (a snapshot) has no half-done port or MMIO read in it.
                if let Err(e) = self.vcpu.complete_pending_io() {
                    self.fail(format!("vCPU {}: completing I/O before a pause: {e}", self.vcpu.id()));
                    break;
                }
            }
            self.pause.park();
            if self.exit.is_set() {
                break;
            }
            if let Some(exit) = self.step() {
                self.exit.request(exit);
            }
        }
        RUN_AREA.with(|a| a.set(ptr::null_mut()));
        self.vcpu
    }

    fn fail(&self, reason: String) {
        self.exit.request(VmExit::Failed { reason, console_tail: String::new() });
    }

    /// One `KVM_RUN` and its exit; `Some` if the VM ends. Accesses no device claims read as
    /// all ones (port I/O, a floating ISA bus) or zero (MMIO) and writes to them are dropped.
    fn step(&mut self) -> Option<VmExit> {
        let id = self.vcpu.id();
        let failure = |what: String, regs: String| VmExit::Failed {
            reason: format!("vCPU {id}: {what}; {regs}"),
            console_tail: String::new(),
        };
        let what = match self.vcpu.run() {
            Ok(Exit::IoIn { port, data }) => {
                if !self.pio.read(u64::from(port), data) {
                    data.fill(0xff);
                }
                return None;
            }
            Ok(Exit::IoOut { port, data }) => {
                self.pio.write(u64::from(port), data);
                return None;
            }
            Ok(Exit::MmioRead { addr, data }) => {
                if !self.mmio.read(addr, data) {
                    data.fill(0);
                }
                return None;
            }
            Ok(Exit::MmioWrite { addr, data }) => {
                self.mmio.write(addr, data);
                return None;
            }
            Ok(Exit::Interrupted) => {
                self.vcpu.clear_immediate_exit();
                return None;
            }
            Ok(Exit::Hlt) | Ok(Exit::Shutdown) => return Some(VmExit::Shutdown),
            Ok(Exit::SystemEvent(kind)) if kind == KVM_SYSTEM_EVENT_RESET => return Some(VmExit::Reset),
            Ok(Exit::SystemEvent(_)) => return Some(VmExit::Shutdown),
            Ok(Exit::InternalError { suberror }) => format!("KVM internal error (suberror {suberror})"),
            Ok(Exit::FailEntry { reason }) => format!("VM entry failed (hardware reason {reason:#x})"),
            Ok(Exit::Other(name)) => format!("unexpected exit: {name}"),
            Err(e) => e.to_string(),
        };
        Some(failure(what, self.vcpu.dump_registers()))
    }
}

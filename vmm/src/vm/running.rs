//! A built VM: [`Vm::run`] starts the vCPU threads and waits for the VM's end;
//! [`VmHandle::stop`] ends it from another thread, [`VmHandle::pause`] and
//! [`VmHandle::resume`] park and unpark its vCPUs (see [`crate::pause`]).

use std::os::unix::thread::JoinHandleExt;
use std::sync::{Arc, Mutex};

use pvisor_seccomp::BpfProgram;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::bus::Bus;
use crate::devices::clone_id::CloneId;
use crate::devices::console::SharedConsole;
use crate::devices::serial::Serial;
use crate::exit::{ExitLatch, VmExit};
use crate::kvm::{self, Hypervisor};
use crate::memory::GuestRam;
use crate::pause::{self, PauseGate};
use crate::vcpu::{self, VcpuThread};

/// A built VM. Fields drop in order: vCPUs, then the VM, then guest RAM.
pub struct Vm {
    pub(crate) vcpus: Vec<kvm::Vcpu>,
    pub(super) pio: Arc<Bus>,
    pub(super) mmio: Arc<Bus>,
    pub(super) console: SharedConsole,
    pub(super) exit: Arc<ExitLatch>,
    pub(super) filter: Option<Arc<BpfProgram>>,
    pub(super) threads: Arc<Mutex<Vec<libc::pthread_t>>>,
    pub(crate) pause: Arc<PauseGate>,
    /// eventfds KVM holds references to (serial irqfd, ioeventfds); open for the VM's life.
    pub(super) _eventfds: Vec<EventFd>,
    /// The standard devices with state a snapshot saves.
    pub(crate) serial: Arc<Mutex<Serial>>,
    pub(crate) clone_id: Arc<Mutex<CloneId>>,
    /// Why the VM cannot be snapshotted, if it cannot.
    pub(crate) unsnapshottable: Option<&'static str>,
    /// Virtio transports a snapshot saves, in placement order.
    pub(crate) transports: Vec<(super::VirtioMmioSlot, crate::devices::virtio::mmio::SharedTransport)>,
    pub(crate) debug_exit: bool,
    /// MSRs of a restore that KVM refused to set.
    pub(crate) refused_msrs: Vec<u32>,
    /// Shared with a [`Snapshotter`](crate::snapshot::Snapshotter), which may outlive `run`.
    pub(crate) vm: Arc<kvm::Vm>,
    pub(crate) ram: GuestRam,
    pub(super) _kvm: Hypervisor,
}

/// Stops, pauses and resumes a VM from another thread.
#[derive(Clone)]
pub struct VmHandle {
    exit: Arc<ExitLatch>,
    threads: Arc<Mutex<Vec<libc::pthread_t>>>,
    pause: Arc<PauseGate>,
}

impl VmHandle {
    /// Ends the VM as [`VmExit::Stopped`] (unless it already ended otherwise) and kicks its
    /// vCPUs out of the guest. Returns at once; `run` returns once the vCPUs have left.
    pub fn stop(&self) {
        self.exit.request(VmExit::Stopped);
        kick_all(&self.threads);
    }

    /// Pauses the VM: kicks every vCPU out of the guest and returns once all of them are
    /// parked (none re-enters `KVM_RUN` until [`resume`](Self::resume)). Pausing a paused VM is
    /// a no-op. Paused before [`Vm::run`], the VM starts paused. Fails if the VM ends first
    /// ([`stop`](Self::stop) still ends a paused VM), or if a concurrent resume overtakes it.
    pub fn pause(&self) -> Result<(), pause::Error> {
        self.pause.request();
        kick_all(&self.threads);
        self.pause.wait_parked()
    }

    /// Resumes a paused VM: its vCPUs re-enter the guest. Resuming a running VM is a no-op;
    /// resuming an ended VM fails.
    pub fn resume(&self) -> Result<(), pause::Error> {
        self.pause.resume()
    }

    /// Whether the VM is paused (every vCPU parked).
    pub fn is_paused(&self) -> bool {
        self.pause.is_paused()
    }
}

fn kick_all(threads: &Mutex<Vec<libc::pthread_t>>) {
    for thread in threads.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        vcpu::kick(*thread);
    }
}

impl Vm {
    /// A handle to stop the VM from another thread.
    pub fn handle(&self) -> VmHandle {
        VmHandle { exit: self.exit.clone(), threads: self.threads.clone(), pause: self.pause.clone() }
    }

    /// The console log.
    pub fn console(&self) -> SharedConsole {
        self.console.clone()
    }

    /// Guest memory (clone it for a device thread: the regions are shared, not copied).
    pub fn memory(&self) -> &GuestMemoryMmap {
        self.ram.memory()
    }

    /// Guest RAM (its backing: a memfd, or a snapshot's file mapped privately).
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// The clone-identity generation and seed the guest sees.
    pub fn clone_identity(&self) -> (u64, [u8; 32]) {
        let id = self.clone_id.lock().unwrap_or_else(|p| p.into_inner());
        (id.generation(), id.seed())
    }

    /// MSRs of the snapshot that KVM refused to set on restore (empty for a booted VM).
    pub fn refused_msrs(&self) -> &[u32] {
        &self.refused_msrs
    }

    /// `KVM_GET_CLOCK` of the VM (kvmclock in ns), where KVM gives it.
    pub fn kvm_clock(&self) -> Option<u64> {
        self.vm.clock().map(|c| c.clock)
    }

    /// Runs the guest until it ends; everything the VM held is released on return.
    pub fn run(mut self) -> VmExit {
        let mut handles = Vec::new();
        // The thread list stays locked while the vCPUs start, so that a concurrent pause kicks
        // either none of them (each then sees the pause request before its first KVM_RUN) or
        // all of them, and counts every started vCPU.
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for vcpu in self.vcpus.drain(..) {
            let id = vcpu.id();
            let body = VcpuThread {
                vcpu,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                exit: self.exit.clone(),
                pause: self.pause.clone(),
                filter: self.filter.clone(),
            };
            let spawned = std::thread::Builder::new().name(format!("vcpu{id}")).spawn(move || body.run());
            match spawned {
                Ok(handle) => {
                    threads.push(handle.as_pthread_t());
                    handles.push(handle);
                }
                Err(e) => {
                    self.exit.request(VmExit::Failed {
                        reason: format!("starting vCPU {id}: {e}"),
                        console_tail: String::new(),
                    });
                    break;
                }
            }
        }
        self.pause.set_started(handles.len());
        drop(threads);
        let exit = self.exit.wait();
        // Parked vCPUs (and pausers waiting for them) are released: they see the latch and leave.
        self.pause.end();
        // Take the thread ids out before joining, so that a late `VmHandle::stop` cannot
        // signal a thread that has been joined (its id may be reused); every vCPU gets its
        // kick here, after the latch is set.
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            vcpu::kick(thread);
        }
        let mut panicked = false;
        for handle in handles {
            // The vCPU comes back to be closed here, outside its thread's filter.
            panicked |= handle.join().is_err();
        }
        let tail = || self.console.lock().unwrap_or_else(|p| p.into_inner()).tail(20);
        match exit {
            VmExit::Failed { reason, .. } => VmExit::Failed { reason, console_tail: tail() },
            _ if panicked => VmExit::Failed { reason: "a vCPU thread panicked".into(), console_tail: tail() },
            other => other,
        }
    }
}

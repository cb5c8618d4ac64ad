//! The vm backend: the sandbox as a microVM whose VMM runs in this worker.
//!
//! * [`host`]: what the host offers (hardware virtualization, PVM, none).
//! * [`disks`]: the image disk (the pool's erofs view) and the scratch disk.
//! * [`cmdline`]: the guest kernel's command line and the agent's keys.
//! * [`console`]: the guest's serial console, bounded.
//! * [`net`]: the network link (virtio-net device ↔ netd socketpair).
//! * [`kvm`]: the project's own VMM on KVM (the product path).
//! * [`qemu`]: the QEMU TCG test engine, serving the same device models
//!   over vhost-user; its snapshots and restores ([`qmp`]: QEMU's machine protocol).
//! * [`template`]: the template store (a snapshot per kernel, initramfs, image and shape;
//!   invalidation and gc); [`capture`]: taking one during a create.
pub mod capture;
pub mod cmdline;
pub mod console;
pub mod disks;
pub mod host;
pub mod kvm;
pub mod net;
pub mod qemu;
pub mod qmp;
pub mod template;

use crate::backend::{Backend, Sandbox, Started};
use crate::config::{BackendConfig, Common, VmEngine, WorkerConfig};
use crate::error::{Result, WorkerError};
use crate::threads::{Thread, ThreadFilter};
use pvisor_seccomp::FilterKind;
use pvisor_vmm::devices::virtio::vsock::VsockHandle;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The worker's threads under the project's VMM.
const KVM_THREADS: [ThreadFilter; 6] = [
    crate::threads::COMMON[0],
    crate::threads::COMMON[1],
    crate::threads::COMMON[2],
    ThreadFilter {
        thread: Thread::Vcpu,
        filter: FilterKind::Vcpu,
        why: "each vCPU thread installs it before its first KVM_RUN (ioctl pinned to the vCPU requests)",
    },
    ThreadFilter {
        thread: Thread::Devices,
        filter: FilterKind::VmmDevice,
        why: "the device thread serves virtio queues and vsock host sockets only",
    },
    ThreadFilter {
        thread: Thread::Console,
        filter: FilterKind::Worker,
        why: "waits for the VM's end; started before the main thread's filter, runs no guest-facing code",
    },
];

/// The worker's threads under the QEMU TCG test engine: the vhost-user
/// back-ends run under the worker filter, installed on every thread at once.
const QEMU_THREADS: [ThreadFilter; 5] = [
    crate::threads::COMMON[0],
    crate::threads::COMMON[1],
    crate::threads::COMMON[2],
    ThreadFilter {
        thread: Thread::Devices,
        filter: FilterKind::Worker,
        why: "vhost-user back-ends (test engine): the worker filter, synced onto them by the main thread",
    },
    ThreadFilter {
        thread: Thread::Console,
        filter: FilterKind::Worker,
        why: "copies QEMU's serial output into the bounded console log",
    },
];

/// The vm backend for a configuration's engine.
pub struct VmBackend {
    engine: VmEngine,
}

/// The vm backend, where this build and host can run it.
pub fn backend(cfg: &WorkerConfig) -> Result<Box<dyn Backend>> {
    let Some(BackendConfig::Vm(vm)) = &cfg.backend else {
        return Err(WorkerError::Config("the vm backend needs a vm part".into()));
    };
    let engine = VmEngine::try_from(vm.engine).map_err(|_| WorkerError::Config(format!("vm: engine {}", vm.engine)))?;
    Ok(Box::new(VmBackend { engine }))
}

impl Backend for VmBackend {
    fn start(&self, common: &Common, cfg: &WorkerConfig) -> Result<Started> {
        let Some(BackendConfig::Vm(vm)) = &cfg.backend else {
            return Err(WorkerError::Config("the vm backend needs a vm part".into()));
        };
        if vm.kernel.is_empty() || vm.initramfs.is_empty() || vm.scratch_disk.is_empty() || vm.console_log.is_empty() {
            return Err(WorkerError::Config("vm: kernel, initramfs, scratch_disk and console_log are required".into()));
        }
        let boot = crate::agent_ready_timeout(cfg);
        // With a network: the device's end of the link goes into the VM, the
        // other end to netd.
        let (device_end, net_link) = match &cfg.net {
            Some(_) => {
                let (device_end, link) = net::link()?;
                (Some(device_end), Some(link))
            }
            None => (None, None),
        };
        let sandbox: Box<dyn Sandbox> = match self.engine {
            VmEngine::Kvm => Box::new(kvm::start(vm, &common.hostname, boot, device_end)?),
            VmEngine::QemuTcg | VmEngine::QemuKvm => {
                let dir = Path::new(&vm.console_log).parent().unwrap_or(Path::new("."));
                Box::new(qemu::start(vm, &common.hostname, dir, boot, device_end)?)
            }
        };
        Ok(Started { sandbox, net_link })
    }

    fn threads(&self) -> &'static [ThreadFilter] {
        match self.engine {
            VmEngine::Kvm => &KVM_THREADS,
            VmEngine::QemuTcg | VmEngine::QemuKvm => &QEMU_THREADS,
        }
    }

    fn sync_filter(&self) -> bool {
        // Under QEMU, the back-ends' threads take the main thread's filter
        // (they install none of their own); under KVM each has its own.
        self.engine != VmEngine::Kvm
    }
}

/// Connects to the guest agent's vsock port, retrying while the guest
/// refuses (it is still booting) until `deadline`.
pub fn connect_with_retry(vsock: &VsockHandle, port: u32, deadline: Instant) -> Result<UnixStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match vsock.connect(port, left.max(Duration::from_millis(100))) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(WorkerError::Agent(format!("vsock port {port}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::COMMON;

    fn check(table: &[ThreadFilter]) {
        for t in table {
            assert!(!t.why.is_empty(), "{:?} has no reason", t.thread);
            assert_eq!(table.iter().filter(|o| o.thread == t.thread).count(), 1, "{:?} listed twice", t.thread);
        }
        for t in [Thread::Api, Thread::Lifeline, Thread::Waiter] {
            assert_eq!(crate::threads::filter_of(table, t), Some(FilterKind::Worker), "{t:?}");
        }
    }

    #[test]
    fn every_thread_of_every_backend_has_one_filter() {
        check(&COMMON);
        check(&KVM_THREADS);
        check(&QEMU_THREADS);
        // Under the project's VMM, guest-facing threads run allow lists of their own.
        assert_eq!(crate::threads::filter_of(&KVM_THREADS, Thread::Vcpu), Some(FilterKind::Vcpu));
        assert_eq!(crate::threads::filter_of(&KVM_THREADS, Thread::Devices), Some(FilterKind::VmmDevice));
        assert_eq!(FilterKind::Vcpu.default_action(), pvisor_seccomp::DefaultAction::KillProcess);
        assert_eq!(FilterKind::VmmDevice.default_action(), pvisor_seccomp::DefaultAction::KillProcess);
    }
}

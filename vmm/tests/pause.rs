//! Pausing and resuming a VM: a guest that counts in memory (`guests/count.S`, no exits) runs
//! on this host's KVM with the vcpu seccomp filter on; the test reads the counter from guest
//! memory. While paused, the counter must not move over some wall time; after a resume it
//! moves again; a paused VM still stops.

mod common;

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{config, guest};
use pvisor_vmm::pause::Error as PauseError;
use pvisor_vmm::{VmExit, VmHandle};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Where count.S keeps its counter.
const COUNTER: GuestAddress = GuestAddress(0x20_0000);
/// How long a paused counter is watched for movement.
const QUIET: Duration = Duration::from_millis(300);
/// A bound on waiting for the counter to move, so that a broken resume fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

struct Counting {
    handle: VmHandle,
    memory: GuestMemoryMmap,
    runner: JoinHandle<VmExit>,
}

impl Counting {
    /// Builds the counting VM with `vcpus` vCPUs (only the first runs the guest; the others wait
    /// for a startup IPI inside KVM_RUN) and lets `before_run` act on it before `run`.
    fn start(vcpus: u8, before_run: impl FnOnce(&VmHandle)) -> Counting {
        common::require_kvm();
        let cfg = pvisor_vmm::VmConfig { vcpus, ..config() };
        assert!(cfg.vcpu_seccomp, "the test runs the vCPUs under their seccomp filter");
        let mut builder = pvisor_vmm::VmBuilder::new(cfg).unwrap();
        builder.load_flat(&guest("count")).unwrap();
        let vm = builder.build().unwrap();
        let handle = vm.handle();
        // The regions are shared with the VM, not copied: reads see the guest's stores.
        let memory = vm.memory().clone();
        before_run(&handle);
        let runner = std::thread::spawn(move || vm.run());
        Counting { handle, memory, runner }
    }

    fn count(&self) -> u64 {
        self.memory.load::<u64>(COUNTER, Ordering::SeqCst).unwrap()
    }

    /// Waits until the counter passes `than` (the guest runs), failing after [`PATIENCE`].
    fn wait_above(&self, than: u64) -> u64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let now = self.count();
            if now > than {
                return now;
            }
            assert!(!self.runner.is_finished(), "the VM ended while the test waited for the counter");
            assert!(Instant::now() < deadline, "the counter stayed at {now} for {PATIENCE:?}: the guest does not run");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Asserts that the counter does not move over [`QUIET`]; returns its value.
    fn assert_still(&self, why: &str) -> u64 {
        let before = self.count();
        std::thread::sleep(QUIET);
        let after = self.count();
        assert_eq!(before, after, "{why}: the counter moved by {} in {QUIET:?}", after.wrapping_sub(before));
        before
    }

    fn stop(self) -> VmExit {
        self.handle.stop();
        self.runner.join().unwrap()
    }
}

#[test]
fn a_paused_guest_does_not_run_and_a_resumed_one_does() {
    let vm = Counting::start(1, |_| {});
    let started = vm.wait_above(0);
    // Moving before the pause: the stillness below is the pause's doing.
    let moving = vm.wait_above(started);

    vm.handle.pause().expect("pausing a running VM");
    assert!(vm.handle.is_paused());
    let paused = vm.assert_still("paused");
    assert!(paused >= moving);
    vm.handle.pause().expect("pausing a paused VM again is a no-op");
    assert_eq!(vm.assert_still("paused twice"), paused);

    vm.handle.resume().expect("resuming a paused VM");
    assert!(!vm.handle.is_paused());
    let resumed = vm.wait_above(paused);
    vm.handle.resume().expect("resuming a running VM is a no-op");
    vm.wait_above(resumed);

    // And once more: a resumed VM pauses again.
    vm.handle.pause().unwrap();
    vm.assert_still("paused after a resume");
    vm.handle.resume().unwrap();
    vm.wait_above(vm.count());
    assert_eq!(vm.stop(), VmExit::Stopped);
}

#[test]
fn a_paused_vm_stops() {
    let vm = Counting::start(1, |_| {});
    vm.wait_above(0);
    vm.handle.pause().unwrap();
    vm.assert_still("paused");
    let handle = vm.handle.clone();
    assert_eq!(vm.stop(), VmExit::Stopped);
    assert_eq!(handle.pause(), Err(PauseError::Ended), "an ended VM cannot be paused");
    assert_eq!(handle.resume(), Err(PauseError::Ended), "nor resumed");
}

#[test]
fn every_vcpu_parks_including_one_waiting_for_startup_in_kvm_run() {
    // vCPU 1 sits in KVM_RUN waiting for an INIT/SIPI that never comes: the pause must kick it
    // out too, or it would never return.
    let vm = Counting::start(2, |_| {});
    vm.wait_above(0);
    vm.handle.pause().unwrap();
    let paused = vm.assert_still("paused with two vCPUs");
    vm.handle.resume().unwrap();
    vm.wait_above(paused);
    vm.handle.pause().unwrap();
    assert_eq!(vm.stop(), VmExit::Stopped);
}

#[test]
fn a_vm_paused_before_run_starts_paused() {
    let vm = Counting::start(1, |h| h.pause().expect("pausing before run"));
    assert_eq!(vm.assert_still("paused before run"), 0, "the guest never ran");
    vm.handle.resume().unwrap();
    vm.wait_above(0);
    assert_eq!(vm.stop(), VmExit::Stopped);
}

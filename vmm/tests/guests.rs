//! Test guests on this host's KVM (PVM): small long-mode programs, assembled by the test,
//! run natively under the VMM with the vcpu seccomp filter on. Each asserts what the VMM did.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use common::{config, guest, run, run_with, Probe};
use pvisor_vmm::bus::BusDevice;
use pvisor_vmm::devices::console::TRUNCATED_MARKER;
use pvisor_vmm::VmExit;
use vmm_sys_util::eventfd::EventFd;

#[test]
fn serial_output_reaches_the_console() {
    let (exit, out) = run(&guest("hello"));
    assert_eq!(exit, VmExit::DebugExit(0x11));
    assert_eq!(String::from_utf8_lossy(&out), "hello from the guest\n");
}

#[test]
fn port_io_exits_go_both_ways() {
    let probe = Probe::new(0x1234_5678);
    let p = probe.clone();
    let (exit, _) = run_with(&guest("pio"), config(), |b| {
        b.add_pio_device(0x510, 0x10, p).unwrap();
    });
    assert_eq!(exit, VmExit::DebugExit(0x12));
    let probe = probe.lock().unwrap();
    assert_eq!(probe.reads, vec![(0, 4)], "one 32-bit in at 0x510");
    assert_eq!(
        probe.writes,
        vec![(4, 0x1234_5679u32.to_le_bytes().to_vec()), (8, vec![0xff])],
        "the guest echoed the value plus one, and saw 0xff from an unclaimed port"
    );
}

#[test]
fn mmio_exits_go_both_ways() {
    let probe = Probe::new(0x0102_0304_0506_0708);
    let p = probe.clone();
    let (exit, _) = run_with(&guest("mmio"), config(), |b| {
        b.add_mmio_device(0xc000_0000, 0x1000, p).unwrap();
    });
    assert_eq!(exit, VmExit::DebugExit(0x13));
    let probe = probe.lock().unwrap();
    assert_eq!(probe.reads, vec![(0, 8)]);
    assert_eq!(probe.writes, vec![(8, 0x0102_0304_0506_0709u64.to_le_bytes().to_vec()), (0x10, vec![0xab])]);
}

/// Tells the test when the guest is ready for its interrupt, and records the handler's write.
struct IrqPorts {
    ready: mpsc::Sender<()>,
    handled: Vec<u8>,
}

impl BusDevice for IrqPorts {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            0 => {
                let _ = self.ready.send(());
            }
            _ => self.handled.extend_from_slice(data),
        }
    }
}

#[test]
fn an_irqfd_interrupts_the_halted_guest() {
    let (ready_tx, ready_rx) = mpsc::channel();
    let ports = Arc::new(Mutex::new(IrqPorts { ready: ready_tx, handled: Vec::new() }));
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let image = guest("irq");

    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.add_pio_device(0x520, 2, ports.clone()).unwrap();
    let gsi = builder.allocate_gsi().unwrap();
    assert_eq!(gsi, 5, "irq.S routes GSI 5");
    builder.register_irqfd(&irq, gsi).unwrap();
    builder.load_flat(&image).unwrap();
    let vm = builder.build().unwrap();
    let runner = std::thread::spawn(move || vm.run());

    ready_rx.recv().expect("the guest never said it was ready");
    assert!(ports.lock().unwrap().handled.is_empty(), "no interrupt before the irqfd fires");
    irq.write(1).unwrap();
    let exit = runner.join().unwrap();
    assert_eq!(exit, VmExit::DebugExit(0x14));
    assert_eq!(ports.lock().unwrap().handled, vec![0x77]);
}

#[test]
fn a_triple_fault_is_a_clean_shutdown() {
    let (exit, out) = run(&guest("triple_fault"));
    assert_eq!(exit, VmExit::Shutdown);
    assert_eq!(String::from_utf8_lossy(&out), "about to triple fault\n");
}

#[test]
fn an_i8042_reset_ends_the_vm_as_reset() {
    let (exit, _) = run(&guest("reset"));
    assert_eq!(exit, VmExit::Reset);
}

/// Waits until the console shows `text`, polling (the guest's progress is not timed).
fn wait_for_console(console: &pvisor_vmm::devices::console::SharedConsole, text: &str) {
    loop {
        if String::from_utf8_lossy(&console.lock().unwrap().contents()).contains(text) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn stop_from_another_thread(name: &str, banner: &str) {
    common::require_kvm();
    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.load_flat(&guest(name)).unwrap();
    let vm = builder.build().unwrap();
    let handle = vm.handle();
    let console = vm.console();
    let runner = std::thread::spawn(move || vm.run());
    wait_for_console(&console, banner);
    handle.stop();
    assert_eq!(runner.join().unwrap(), VmExit::Stopped);
}

#[test]
fn a_spinning_guest_is_stopped_from_another_thread() {
    stop_from_another_thread("hang", "spinning\n");
}

#[test]
fn a_halted_guest_is_stopped_from_another_thread() {
    stop_from_another_thread("halt", "halting\n");
}

#[test]
fn a_stop_before_run_ends_the_vm_at_once() {
    common::require_kvm();
    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.load_flat(&guest("hang")).unwrap();
    let vm = builder.build().unwrap();
    vm.handle().stop();
    assert_eq!(vm.run(), VmExit::Stopped);
}

#[test]
fn a_flooding_guest_keeps_the_console_log_under_its_caps() {
    let file = tempfile::tempfile().unwrap();
    let cfg = pvisor_vmm::VmConfig {
        console_memory_cap: 4096,
        console_file: Some((file.try_clone().unwrap(), 16 << 10)),
        ..config()
    };
    let (exit, out) = run_with(&guest("flood"), cfg, |_| {});
    assert_eq!(exit, VmExit::DebugExit(0x15));
    assert_eq!(out.len(), 4096, "memory keeps exactly its cap");
    assert!(String::from_utf8_lossy(&out).ends_with("xxxx\nflood done\n"));
    let len = file.metadata().unwrap().len();
    assert!(len <= 16 << 10, "the log file grew to {len} bytes past its 16 KiB cap");
    let mut content = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut content, 0).unwrap();
    assert!(content.starts_with(TRUNCATED_MARKER), "the file was truncated and marked");
    assert!(content.ends_with(b"flood done\n"), "the file keeps the most recent output");
}

#[test]
fn a_guest_kvm_cannot_run_fails_with_registers_and_console_tail() {
    let (exit, _) = run(&guest("fetch_mmio"));
    let VmExit::Failed { reason, console_tail } = exit else { panic!("expected a failure, got {exit:?}") };
    assert!(reason.contains("vCPU 0"), "{reason}");
    assert!(reason.contains("rip=0xc0000000"), "the registers are in the reason: {reason}");
    assert_eq!(console_tail, "jumping into the MMIO gap");
}

#[test]
fn a_second_vcpu_waiting_for_startup_does_not_keep_the_vm_alive() {
    // vCPU 1 waits in KVM_RUN for an INIT/SIPI that never comes; when vCPU 0's guest exits,
    // run() kicks it out and joins it.
    let cfg = pvisor_vmm::VmConfig { vcpus: 2, ..config() };
    let (exit, out) = run_with(&guest("hello"), cfg, |_| {});
    assert_eq!(exit, VmExit::DebugExit(0x11));
    assert_eq!(String::from_utf8_lossy(&out), "hello from the guest\n");
}

#[test]
fn a_virtio_mmio_window_gets_its_ioeventfds_irqfd_and_cmdline() {
    const MAGIC: u64 = 0x7472_6976; // "virt"
    let device = Probe::new(MAGIC);
    let magic_port = Probe::new(0);
    let notify = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let (d, m, n) = (device.clone(), magic_port.clone(), notify.try_clone().unwrap());
    let mut slot = None;
    let mut cmdline = String::new();
    let (exit, _) = run_with(&guest("virtio_notify"), config(), |b| {
        let ioevent = pvisor_vmm::IoEventFd { addr: 0x50, datamatch: Some(0), fd: n };
        slot = Some(b.add_virtio_mmio_device(d, vec![ioevent], &irq).unwrap());
        b.add_pio_device(0x540, 4, m).unwrap();
        cmdline = b.virtio_cmdline();
    });
    assert_eq!(exit, VmExit::DebugExit(0x17));
    let slot = slot.unwrap();
    assert_eq!((slot.addr, slot.gsi), (0xd000_0000, 5));
    assert_eq!(cmdline, "virtio_mmio.device=4K@0xd0000000:5");
    assert_eq!(notify.read().unwrap(), 1, "queue 0's notify went to the ioeventfd");
    let device = device.lock().unwrap();
    assert_eq!(device.writes, vec![(0x50, 1u32.to_le_bytes().to_vec())], "only queue 1's notify exited");
    assert_eq!(device.reads, vec![(0, 4)]);
    assert_eq!(magic_port.lock().unwrap().writes, vec![(0, (MAGIC as u32).to_le_bytes().to_vec())]);
}

#[test]
fn the_serial_port_interrupts_through_its_irqfd_on_gsi_4() {
    let iir = Probe::new(0);
    let p = iir.clone();
    let (exit, _) = run_with(&guest("serial_irq"), config(), |b| {
        b.add_pio_device(0x521, 1, p).unwrap();
    });
    assert_eq!(exit, VmExit::DebugExit(0x18));
    // IIR after a THR-empty interrupt: 0x02 (THR empty, pending), with the FIFO bits vm-superio
    // reports set.
    let writes = &iir.lock().unwrap().writes;
    assert_eq!(writes.len(), 1, "the handler ran once");
    assert_eq!(writes[0].1[0] & 0x0f, 0x02, "IIR says THR empty: {:#x}", writes[0].1[0]);
}

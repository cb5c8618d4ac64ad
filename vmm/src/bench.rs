//! Timing helpers for `bench/`: not used by the VMM itself. Boot to first exit, and
//! snapshot-restore to the first serial byte of a clone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bus::BusDevice;
use crate::devices::console::SharedConsole;
use crate::snapshot::{self, SnapshotPaths};
use crate::vm::{Error, Vm, VmBuilder, VmConfig};
use crate::VmExit;

/// The port [`FIRST_EXIT_GUEST`] writes first; the write's exit is timestamped.
pub const TIMESTAMP_PORT: u16 = 0x502;

/// A flat guest whose first instruction writes to [`TIMESTAMP_PORT`], then exits through the
/// debug exit port: `mov dx, 0x502; out dx, al; mov dx, 0x501; xor eax, eax; out dx, al; hlt`.
pub const FIRST_EXIT_GUEST: &[u8] = &[0x66, 0xba, 0x02, 0x05, 0xee, 0x66, 0xba, 0x01, 0x05, 0x31, 0xc0, 0xee, 0xf4];

/// Records when the guest first wrote its port.
struct Timestamp(Arc<Mutex<Option<Instant>>>);

impl BusDevice for Timestamp {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
    }
}

/// Time from opening `/dev/kvm` to the first exit of a guest that exits at its first
/// instruction: VM, `memory_bytes` of memfd RAM and its memory slot, irqchip, PIT, devices,
/// vCPU setup (CPUID, MSRs, registers), the vCPU thread's start and seccomp filter, and the
/// first `KVM_RUN` up to the exit's dispatch. Teardown is not included. `image` defaults to
/// [`FIRST_EXIT_GUEST`] and must write [`TIMESTAMP_PORT`] first. One sample; the benchmark
/// takes P50 over many.
pub fn time_to_first_exit(image: Option<&[u8]>, memory_bytes: u64) -> Result<Duration, Error> {
    let start = Instant::now();
    let stamp = Arc::new(Mutex::new(None));
    let mut builder = VmBuilder::new(VmConfig { memory_bytes, debug_exit: true, ..VmConfig::default() })?;
    builder.add_pio_device(TIMESTAMP_PORT, 1, Arc::new(Mutex::new(Timestamp(stamp.clone()))))?;
    builder.load_flat(image.unwrap_or(FIRST_EXIT_GUEST))?;
    let exit = builder.build()?.run();
    let first_exit = *stamp.lock().unwrap_or_else(|p| p.into_inner());
    match (exit, first_exit) {
        (VmExit::DebugExit(_), Some(at)) => Ok(at - start),
        _ => Err(Error::Config("the first-exit guest did not write the timestamp port and exit")),
    }
}

/// A flat guest for snapshot benchmarks: writes one byte into each of `pages` pages from 2 MiB
/// up, then prints `x` on COM1 forever (or, `idle`, once, then halts with interrupts off:
/// `out dx, al; cli; 3: hlt; jmp 3b`, an idle clone after a restore):
/// ```text
///   mov edi, 0x200000        bf 00 00 20 00
///   mov ecx, PAGES           b9 xx xx xx xx
/// 1:mov byte [rdi], 1        c6 07 01
///   add rdi, 0x1000          48 81 c7 00 10 00 00
///   dec ecx                  ff c9
///   jnz 1b                   75 f2
/// 2:mov dx, 0x3f8            66 ba f8 03
///   mov al, 'x'              b0 78
///   out dx, al               ee
///   jmp 2b                   eb f7
/// ```
/// Restored, its first instruction is within four of an `out` to the serial port, so the first
/// console byte after a restore times the restore up to the guest's first instruction.
pub fn serial_loop_guest(pages: u32, idle: bool) -> Vec<u8> {
    let mut code = vec![0xbf, 0x00, 0x00, 0x20, 0x00, 0xb9];
    code.extend_from_slice(&pages.to_le_bytes());
    code.extend_from_slice(&[
        0xc6, 0x07, 0x01, 0x48, 0x81, 0xc7, 0x00, 0x10, 0x00, 0x00, 0xff, 0xc9, 0x75, 0xf2, 0x66, 0xba, 0xf8, 0x03,
        0xb0, 0x78, 0xee,
    ]);
    if idle {
        code.extend_from_slice(&[0xfa, 0xf4, 0xeb, 0xfd]);
    } else {
        code.extend_from_slice(&[0xeb, 0xf7]);
    }
    code
}

/// Spins (yielding) until `console` has more than `seen` bytes or `deadline` passes.
fn wait_console(console: &SharedConsole, seen: u64, deadline: Instant) -> Result<(), Error> {
    loop {
        if console.lock().unwrap_or_else(|p| p.into_inner()).total_bytes() > seen {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Config("the benchmark guest printed nothing"));
        }
        std::thread::yield_now();
    }
}

/// Boots [`serial_loop_guest`] (`memory_bytes` of RAM, `touch_pages` pages touched), waits
/// for its first serial byte, and snapshots it into `paths` (the VM is stopped afterwards).
pub fn snapshot_serial_loop(
    paths: &SnapshotPaths,
    memory_bytes: u64,
    touch_pages: u32,
    idle: bool,
) -> Result<snapshot::SnapshotInfo, snapshot::Error> {
    let mut builder = VmBuilder::new(VmConfig { memory_bytes, ..VmConfig::default() })?;
    builder.load_flat(&serial_loop_guest(touch_pages, idle))?;
    let vm = builder.build()?;
    let snapshotter = vm.snapshotter()?;
    let (handle, console) = (vm.handle(), vm.console());
    let runner = std::thread::spawn(move || vm.run());
    let waited = wait_console(&console, 0, Instant::now() + Duration::from_secs(120));
    let result = waited.map_err(snapshot::Error::from).and_then(|()| {
        handle.pause()?;
        snapshotter.snapshot(paths)
    });
    handle.stop();
    let _ = runner.join();
    result
}

/// A VM restored from `paths` and running, and how long it took from the start of the restore
/// to its first serial byte.
pub struct RestoredClone {
    /// The clone.
    pub handle: crate::VmHandle,
    /// Its vCPU threads' runner.
    pub runner: std::thread::JoinHandle<VmExit>,
    /// Host address of its first RAM region (to find its mapping in /proc/self/smaps).
    pub ram_host_addr: u64,
    /// Start of `snapshot::restore` to the first console byte.
    pub first_byte: Duration,
}

/// Restores a clone of a (non-idle) [`snapshot_serial_loop`] snapshot and times it to its
/// first serial byte: reading and checking the state file, a fresh KVM VM with the saved irqchip, PIT and
/// clock, the private mapping of the memory file, devices, vCPUs with their state, the vCPU
/// thread and its seccomp filter, and the guest's first instructions up to its `out`.
pub fn restore_to_first_byte(paths: &SnapshotPaths) -> Result<RestoredClone, snapshot::Error> {
    restore_clone(paths, true)
}

/// Restores and runs a clone; with `wait_byte`, waits for its first serial byte (else
/// `first_byte` is the restore's time up to `run`).
pub fn restore_clone(paths: &SnapshotPaths, wait_byte: bool) -> Result<RestoredClone, snapshot::Error> {
    let start = Instant::now();
    let vm: Vm = snapshot::restore(paths, VmConfig::default())?;
    let (handle, console) = (vm.handle(), vm.console());
    let ram_host_addr = vm.ram().regions().first().map(|r| r.2).unwrap_or(0);
    let runner = std::thread::spawn(move || vm.run());
    if wait_byte {
        wait_console(&console, 0, start + Duration::from_secs(60))?;
    }
    let first_byte = start.elapsed();
    Ok(RestoredClone { handle, runner, ram_host_addr, first_byte })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_first_exit_is_measured() {
        assert!(std::path::Path::new("/dev/kvm").exists(), "/dev/kvm is expected on these hosts");
        let elapsed = super::time_to_first_exit(None, 4 << 20).unwrap();
        assert!(elapsed > std::time::Duration::ZERO);
    }

    #[test]
    fn a_restore_to_the_first_serial_byte_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let paths = super::SnapshotPaths::in_dir(dir.path());
        let info = super::snapshot_serial_loop(&paths, 8 << 20, 16, false).unwrap();
        assert!(info.memory_written >= 16 * 4096, "the touched pages are in the memory file");
        let clone = super::restore_to_first_byte(&paths).unwrap();
        assert!(clone.first_byte > std::time::Duration::ZERO);
        clone.handle.stop();
        assert_eq!(clone.runner.join().unwrap(), crate::VmExit::Stopped);
    }
}

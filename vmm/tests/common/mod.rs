//! The test-guest harness: assembles `tests/guests/NAME.S` into a flat binary and runs it
//! under the VMM on this host's KVM.
//!
//! Adding a guest is one `.S` file (Intel syntax, `.include "common.inc"`, entry `_start` in
//! `.text.start`, loaded at 1 MiB) and a test that calls [`guest`] and [`run`].

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pvisor_vmm::bus::BusDevice;
use pvisor_vmm::{VmBuilder, VmConfig, VmExit};

/// The test guests' sources (`tests/guests`).
pub fn guests_dir() -> PathBuf {
    pvisor_testkit::manifest_dir(env!("CARGO_MANIFEST_DIR")).join("tests/guests")
}

fn run_tool(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e} (binutils is expected on these hosts)"));
    assert!(out.status.success(), "{cmd:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// Assembles and links `tests/guests/<name>.S`; returns the flat image.
pub fn guest(name: &str) -> Vec<u8> {
    let dir = guests_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guests");
    std::fs::create_dir_all(&out).unwrap();
    // Unique per build: tests run in parallel (several may build the same guest), and in
    // several test binaries at once.
    static BUILDS: AtomicUsize = AtomicUsize::new(0);
    let stem = format!("{name}-{}-{}", std::process::id(), BUILDS.fetch_add(1, Ordering::Relaxed));
    let obj = out.join(format!("{stem}.o"));
    let bin = out.join(format!("{stem}.bin"));
    run_tool(Command::new("as").arg("--64").arg("-I").arg(&dir).arg("-o").arg(&obj).arg(dir.join(format!("{name}.S"))));
    run_tool(Command::new("ld").arg("-T").arg(dir.join("flat.ld")).arg("-o").arg(&bin).arg(&obj));
    let image = std::fs::read(&bin).unwrap();
    let _ = std::fs::remove_file(obj);
    let _ = std::fs::remove_file(bin);
    assert!(!image.is_empty(), "{name}: empty image");
    image
}

/// /dev/kvm exists on every host these tests run on (PVM); its absence is an error, not a skip.
pub fn require_kvm() {
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: these hosts provide KVM (PVM); see shared/docs/host-facts.md"
    );
}

/// A test VM: 32 MiB, debug exit port, vcpu seccomp filter on.
pub fn config() -> VmConfig {
    VmConfig { memory_bytes: 32 << 20, debug_exit: true, ..VmConfig::default() }
}

/// Builds a VM for `image`, lets `setup` add devices, runs it to its end.
pub fn run_with(image: &[u8], config: VmConfig, setup: impl FnOnce(&mut VmBuilder)) -> (VmExit, Vec<u8>) {
    require_kvm();
    let mut builder = VmBuilder::new(config).expect("building the VM");
    setup(&mut builder);
    builder.load_flat(image).expect("loading the guest");
    let vm = builder.build().expect("configuring the vCPUs");
    let console = vm.console();
    let exit = vm.run();
    let output = console.lock().unwrap().contents();
    (exit, output)
}

/// [`run_with`] with no extra devices.
pub fn run(image: &[u8]) -> (VmExit, Vec<u8>) {
    run_with(image, config(), |_| {})
}

/// A test device: records writes, answers reads with a fixed value.
pub struct Probe {
    pub read_value: u64,
    pub writes: Vec<(u64, Vec<u8>)>,
    pub reads: Vec<(u64, usize)>,
}

impl Probe {
    pub fn new(read_value: u64) -> Arc<Mutex<Probe>> {
        Arc::new(Mutex::new(Probe { read_value, writes: Vec::new(), reads: Vec::new() }))
    }
}

impl BusDevice for Probe {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.reads.push((offset, data.len()));
        let bytes = self.read_value.to_le_bytes();
        let n = data.len().min(8);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.writes.push((offset, data.to_vec()));
    }
}

/// Runs this test binary's ignored test `child` alone, in a child process, with `var=value`
/// in its environment (probes that must die by SIGSYS cannot run in the test process);
/// returns its status and stdout, and prints both outputs for the test log.
pub fn run_child(child: &str, var: &str, value: &str) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--ignored", "--nocapture", "--test-threads=1"])
        .env(var, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("child ({value}) stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    (out.status, stdout)
}

pub mod erofs_disk;
pub mod virtio;

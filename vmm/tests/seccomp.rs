//! The vCPU thread's seccomp filter, live: a vCPU thread runs the guest under it, and a
//! syscall it does not need, made on that thread (by a device handling the guest's port
//! write), kills the process with SIGSYS.
//!
//! The filter kills the whole process, so each probe runs in a child: this test binary
//! re-executed with `PVISOR_VMM_PROBE=<syscall>` running only [`probe_child`].

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use pvisor_vmm::bus::BusDevice;
use pvisor_vmm::VmExit;

const PROBE_ENV: &str = "PVISOR_VMM_PROBE";

/// Makes the probe's syscall when the guest writes its port.
struct SyscallProbe {
    syscall: String,
    console: pvisor_vmm::devices::console::SharedConsole,
}

impl BusDevice for SyscallProbe {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        let seen = String::from_utf8_lossy(&self.console.lock().unwrap().contents()).into_owned();
        println!("probe on {:?} after console {seen:?}: calling {}", std::thread::current().name(), self.syscall);
        // SAFETY: raw syscalls with constant arguments and 'static C strings; each either
        // fails or returns an fd that is closed (the probes expect the filter to kill first).
        let ret = unsafe {
            match self.syscall.as_str() {
                "socket" => libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0),
                "openat" => libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY),
                "execve" => libc::syscall(
                    libc::SYS_execve,
                    c"/bin/true".as_ptr(),
                    std::ptr::null::<*const libc::c_char>(),
                    std::ptr::null::<*const libc::c_char>(),
                ),
                // The control: no syscall beyond the allowed writes of the printlns.
                "none" => 0,
                other => panic!("unknown probe {other}"),
            }
        };
        println!("probe returned {ret}");
    }
}

#[test]
#[ignore = "helper of the vcpu_filter_* tests: runs only in their child process"]
fn probe_child() {
    let syscall = std::env::var(PROBE_ENV).expect("run by the vcpu_filter_* tests with PVISOR_VMM_PROBE set");
    let image = common::guest("probe");
    let (exit, out) = common::run_with(&image, common::config(), |b| {
        let probe = SyscallProbe { syscall, console: b.console() };
        b.add_pio_device(0x530, 1, std::sync::Arc::new(std::sync::Mutex::new(probe))).unwrap();
    });
    println!("exit {exit:?} console {:?}", String::from_utf8_lossy(&out));
    assert_eq!(exit, VmExit::DebugExit(0x16));
}

/// Runs [`probe_child`] with `syscall`; returns its status and stdout.
fn run_probe(syscall: &str) -> (std::process::ExitStatus, String) {
    common::require_kvm();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "probe_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(PROBE_ENV, syscall)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("child ({syscall}) stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    (out.status, stdout)
}

fn assert_killed_on_the_vcpu_thread(syscall: &str) {
    let (status, stdout) = run_probe(syscall);
    assert!(
        stdout.contains("probe on Some(\"vcpu0\") after console \"before probe\\n\": calling"),
        "the guest ran under the filter up to the probe, on the vCPU thread"
    );
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{syscall} on the vCPU thread must kill with SIGSYS: {status}");
    assert!(!stdout.contains("probe returned"), "{syscall} returned instead of being refused");
}

#[test]
fn vcpu_filter_lets_the_guest_run_and_allowed_work_through() {
    let (status, stdout) = run_probe("none");
    assert!(status.success(), "control probe failed: {status}");
    assert!(stdout.contains("probe returned 0"));
    assert!(stdout.contains("console \"before probe\\nafter probe\\n\""));
}

#[test]
fn vcpu_filter_kills_socket() {
    assert_killed_on_the_vcpu_thread("socket");
}

#[test]
fn vcpu_filter_kills_openat() {
    assert_killed_on_the_vcpu_thread("openat");
}

#[test]
fn vcpu_filter_kills_execve() {
    assert_killed_on_the_vcpu_thread("execve");
}

//! The vCPU thread's seccomp filter, live: a vCPU thread runs the guest under it, and a
//! syscall it does not need, made on that thread (by a device handling the guest's port
//! write), kills the process with SIGSYS.
//!
//! The filter kills the whole process, so each probe runs in a child: this test binary
//! re-executed with `PVISOR_VMM_PROBE=<syscall>` running only [`probe_child`].
//!
//! The device event loop filter likewise: a thread under it does what a vsock muxer does
//! (epoll, Unix socket connect/accept/read/write/shutdown/close), and an `AF_INET` socket or an
//! `ioctl` on it kills the process.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use pvisor_vmm::bus::BusDevice;
use pvisor_vmm::VmExit;
use vmm_sys_util::eventfd::EventFd;

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
    common::run_child("probe_child", PROBE_ENV, syscall)
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

const DEVICE_PROBE_ENV: &str = "PVISOR_VMM_DEVICE_PROBE";

/// What a vsock muxer does on the device thread: epoll on an eventfd, a Unix socket
/// connection to a host listener (connect, accept, both directions, half-close, close).
fn device_thread_work(listener: &std::os::unix::net::UnixListener, path: &Path, epoll: i32, event: &EventFd) {
    use std::io::{Read, Write};
    let mut client = std::os::unix::net::UnixStream::connect(path).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    server.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(client.read(&mut buf).unwrap(), 0, "EOF after the half-close");

    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 7 };
    // SAFETY: `epoll` and the eventfd are open fds owned by this test; `ev` outlives the calls.
    let ret = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, event.as_raw_fd(), &mut ev) };
    assert_eq!(ret, 0);
    event.write(1).unwrap();
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: `out` has room for the 4 events asked for.
    let n = unsafe { libc::epoll_wait(epoll, out.as_mut_ptr(), 4, -1) };
    assert_eq!(n, 1);
    assert_eq!({ out[0].u64 }, 7);
    assert_eq!(event.read().unwrap(), 1);
}

#[test]
#[ignore = "helper of the device_filter_* tests: runs only in their child process"]
fn device_probe_child() {
    let probe = std::env::var(DEVICE_PROBE_ENV).expect("run by the device_filter_* tests");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vsock.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // SAFETY: plain syscall; the fd is closed at the end of the test by exiting.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(epoll >= 0);
    let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let filter = pvisor_seccomp::vmm_device_filter().unwrap();
    std::thread::Builder::new()
        .name("vmm-device".into())
        .spawn(move || {
            pvisor_seccomp::apply_to_thread(&filter).unwrap();
            device_thread_work(&listener, &path, epoll, &event);
            println!("device work done under the filter");
            // SAFETY: raw syscalls with constant arguments; each returns an fd or fails.
            let ret = unsafe {
                match probe.as_str() {
                    "inet" => libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0),
                    "ioctl" => libc::syscall(libc::SYS_ioctl, 0, libc::FIONREAD, std::ptr::null_mut::<i32>()),
                    "none" => 0,
                    other => panic!("unknown probe {other}"),
                }
            };
            println!("probe returned {ret}");
        })
        .unwrap()
        .join()
        .unwrap();
}

fn run_device_probe(probe: &str) -> (std::process::ExitStatus, String) {
    common::run_child("device_probe_child", DEVICE_PROBE_ENV, probe)
}

#[test]
fn device_filter_lets_a_vsock_muxer_work() {
    let (status, stdout) = run_device_probe("none");
    assert!(status.success(), "{status}");
    assert!(stdout.contains("device work done under the filter") && stdout.contains("probe returned 0"));
}

#[test]
fn device_filter_kills_inet_sockets_and_ioctl() {
    for probe in ["inet", "ioctl"] {
        let (status, stdout) = run_device_probe(probe);
        assert!(stdout.contains("device work done under the filter"), "{probe}");
        assert_eq!(status.signal(), Some(libc::SIGSYS), "{probe} on the device thread must kill: {status}");
        assert!(!stdout.contains("probe returned"), "{probe}");
    }
}

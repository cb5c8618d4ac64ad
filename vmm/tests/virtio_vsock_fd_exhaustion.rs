//! The vsock back-end out of file descriptors: the listener is paused
//! rather than spun on, and resumes once a descriptor is freed. A test
//! binary of its own, since it lowers the process's RLIMIT_NOFILE.

use std::io::{Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use pvisor_vmm::devices::virtio::vsock::Vsock;
use pvisor_vmm::devices::virtio::{GuestMemory, VirtioDevice};

fn readable(dev: &Vsock, ms: u16) -> bool {
    let fd = dev.event_fd().expect("vsock event fd");
    // SAFETY: the fd belongs to `dev`, which outlives the borrow.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count() as u64
}

/// Whether the back-end hung up on `client` (after a bad CONNECT line).
fn hung_up(client: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(client.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn listener_pauses_without_fds_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let uds = dir.path().join("v.sock");
    let mut dev = Vsock::new(3, Some(uds.clone())).expect("vsock");
    let mem = GuestMemory::default();
    let mut clients: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&uds).expect("connect")).collect();
    for c in &clients {
        c.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    }

    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    // Room for exactly two accepted connections (read_dir itself used one).
    setrlimit(Resource::RLIMIT_NOFILE, open_fds() + 1, hard).expect("setrlimit");
    assert!(readable(&dev, 10_000));
    dev.handle_event(&mut [], &mem);
    assert!(!readable(&dev, 0), "listener paused: nothing ready, no spinning");

    // Client 0 was accepted: a bad line makes the back-end drop it, which
    // frees an fd and resumes the listener, which accepts client 2.
    clients[0].write_all(b"HELLO\n").expect("write");
    assert!(readable(&dev, 10_000));
    dev.handle_event(&mut [], &mem);
    assert!(hung_up(&mut clients[0]));
    assert!(readable(&dev, 10_000), "listener resumed");
    dev.handle_event(&mut [], &mem);
    clients[2].write_all(b"HELLO\n").expect("write");
    assert!(readable(&dev, 10_000));
    dev.handle_event(&mut [], &mem);
    assert!(hung_up(&mut clients[2]), "client 2 was accepted after the pause");

    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).expect("restore rlimit");
}

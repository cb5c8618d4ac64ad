//! The guest's console: the serial port is the sandbox's log, and the worker
//! reports its last lines when a boot fails, so every boot error goes there.
//!
//! The kernel opens `/dev/console` as fds 0–2 of init when the initramfs has
//! that node; when it does not, fds 0–2 are closed and [`attach`] opens the
//! console from devtmpfs instead.
use nix::fcntl::{fcntl, open, FcntlArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::dup2;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};

/// Makes fds 0–2 refer to the console if they are closed. Best effort: with
/// no console there is nowhere to say that it failed.
pub fn attach(console: &str) {
    let closed: Vec<i32> = (0..3).filter(|fd| fcntl(*fd, FcntlArg::F_GETFD).is_err()).collect();
    if closed.is_empty() {
        return;
    }
    // Without O_CLOEXEC: fds 0–2 are meant to be inherited.
    let Ok(raw) = open(console, OFlag::O_RDWR | OFlag::O_NOCTTY, Mode::empty()) else { return };
    for target in closed.iter().copied().filter(|t| *t != raw) {
        let _ = dup2(raw, target);
    }
    if raw > 2 {
        // SAFETY: `raw` was just returned by open(2), nothing else owns it, and
        // it is none of 0–2 (those got copies above); dropping closes it.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
    }
}

/// Writes one line `pvisor-agent: MSG` to the console (stderr).
pub fn line(msg: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "pvisor-agent: {msg}");
    let _ = err.flush();
}

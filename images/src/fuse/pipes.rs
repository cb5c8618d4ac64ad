//! The two pipes `pvisor-imaged` shares with whoever started it: `ready` goes out on one once
//! the mount is live, and EOF on the other (the lifeline) ends the server.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::error::{Error, Result};

/// Takes ownership of an fd named on the command line, after checking that it is open, and
/// marks it close-on-exec.
pub(crate) fn take_fd(flag: &'static str, fd: RawFd) -> Result<OwnedFd> {
    let err = |source: io::Error| Error::Fd { flag, fd, source };
    if fd <= 2 {
        return Err(err(io::Error::other("must not be stdin, stdout or stderr")));
    }
    // SAFETY: F_GETFD reads the fd flags and touches no memory; it fails with EBADF when the
    // fd is not open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: as above; sets FD_CLOEXEC on an open fd.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: the fd is open (F_GETFD succeeded), and the command line hands it to this process
    // alone; nothing else in the process refers to it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes `ready\n` and closes the fd.
pub(crate) fn signal_ready(fd: OwnedFd) -> Result<()> {
    let mut f = File::from(fd);
    f.write_all(b"ready\n").map_err(Error::Ready)
}

/// Starts a thread that waits for EOF (or an error) on the lifeline and then ends the process
/// with status 0. What is written to the lifeline is ignored.
pub(crate) fn watch_lifeline(fd: OwnedFd) -> Result<()> {
    let mut f = File::from(fd);
    std::thread::Builder::new()
        .name("lifeline".into())
        .spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
            std::process::exit(0);
        })
        .map(drop)
        .map_err(|e| Error::Serve(io::Error::other(format!("starting the lifeline thread: {e}"))))
}

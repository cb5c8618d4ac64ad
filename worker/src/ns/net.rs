//! Loopback inside the sandbox's network namespace.
use std::io;

/// Sets `lo` up (the only interface of a fresh network namespace).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket(2) call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own; the
    // union member ifru_flags is the one these requests use.
    let r = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            -1
        } else {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr)
        }
    };
    let err = io::Error::last_os_error();
    // SAFETY: closing the fd we opened above.
    unsafe { libc::close(fd) };
    if r < 0 {
        Err(err)
    } else {
        Ok(())
    }
}

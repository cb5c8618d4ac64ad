//! Loopback in the guest: `lo` comes up down in a fresh kernel, and sandbox
//! processes (and the agent's tunnels to 127.0.0.1) need it. The same
//! approach as the ns backend's `worker/src/ns/net.rs`: SIOCGIFFLAGS, set
//! IFF_UP, SIOCSIFFLAGS.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Sets `lo` up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket(2) call; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd that nothing else owns; OwnedFd closes it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the ifreq we own, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFFLAGS the union's ifru_flags member is the live one.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True when `lo` is up, read from sysfs (for the self-test).
pub fn loopback_is_up() -> bool {
    std::fs::read_to_string("/sys/class/net/lo/flags")
        .ok()
        .and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|flags| flags & libc::IFF_UP as u32 != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_loopback_reads_up() {
        // Every host running these tests has lo up in its own namespace.
        assert!(super::loopback_is_up());
    }
}

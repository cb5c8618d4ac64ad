//! Configuring interfaces from inside their network namespace with ioctls:
//! no netlink and no `ip` binary in the image needed. Used by the ns
//! backend's init (in the sandbox's new network namespace) and by the vm
//! guest's agent (in the guest kernel).
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An AF_INET datagram socket: the handle the SIOC* interface ioctls take.
fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain socket(2) call; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd that nothing else owns; OwnedFd closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// An `ifreq` naming `name` (at most IFNAMSIZ - 1 bytes).
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    Ok(ifr)
}

/// A `sockaddr` holding an IPv4 address (port 0), as SIOCSIFADDR and
/// SIOCSIFNETMASK and the route entry take it.
fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and
    // both are plain old data; this is the cast the socket API expects.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// The netmask of a prefix length (0 to 32).
pub fn netmask(prefix_len: u8) -> Ipv4Addr {
    match prefix_len {
        0 => Ipv4Addr::UNSPECIFIED,
        n => Ipv4Addr::from(u32::MAX << (32 - u32::from(n.min(32)))),
    }
}

/// One SIOC* ioctl on an ifreq we own.
fn ioctl(sock: &OwnedFd, request: libc::c_ulong, ifr: &mut libc::ifreq, what: &str) -> io::Result<()> {
    // SAFETY: every request passed here reads or writes a `struct ifreq`,
    // and `ifr` is a valid, exclusively borrowed one for the whole call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, ifr as *mut libc::ifreq) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Sets `name` up (IFF_UP | IFF_RUNNING), keeping its other flags.
pub fn up(name: &str) -> io::Result<()> {
    let sock = control_socket()?;
    let mut ifr = ifreq(name)?;
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut ifr, "SIOCGIFFLAGS")?;
    // SAFETY: after SIOCGIFFLAGS the union's ifru_flags member is the live one.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl(&sock, libc::SIOCSIFFLAGS, &mut ifr, "SIOCSIFFLAGS")
}

/// Sets `lo` up (the only interface of a fresh network namespace or guest,
/// and down in both).
pub fn loopback_up() -> io::Result<()> {
    up("lo")
}

/// Gives `name` the address `addr/prefix_len` and the MTU `mtu`, and sets it up.
pub fn configure(name: &str, addr: Ipv4Addr, prefix_len: u8, mtu: u32) -> io::Result<()> {
    let sock = control_socket()?;
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_addr = sockaddr_v4(addr);
    ioctl(&sock, libc::SIOCSIFADDR, &mut ifr, "SIOCSIFADDR")?;
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_netmask = sockaddr_v4(netmask(prefix_len));
    ioctl(&sock, libc::SIOCSIFNETMASK, &mut ifr, "SIOCSIFNETMASK")?;
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_mtu = i32::try_from(mtu).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    ioctl(&sock, libc::SIOCSIFMTU, &mut ifr, "SIOCSIFMTU")?;
    up(name)
}

/// Adds the default route through `gateway` (which must be on a configured
/// interface's subnet).
pub fn default_route(gateway: Ipv4Addr) -> io::Result<()> {
    let sock = control_socket()?;
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_v4(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT reads the rtentry we own, valid for the call; its
    // rt_dev pointer is null (the kernel picks the interface by gateway).
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &mut rt as *mut libc::rtentry) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("SIOCADDRT: {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmasks_of_prefix_lengths() {
        assert_eq!(netmask(0), Ipv4Addr::new(0, 0, 0, 0));
        assert_eq!(netmask(8), Ipv4Addr::new(255, 0, 0, 0));
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(30), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(netmask(32), Ipv4Addr::new(255, 255, 255, 255));
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(ifreq("").is_err());
        assert!(ifreq("a-name-far-too-long").is_err());
        assert!(ifreq("eth\0").is_err());
        assert!(ifreq("eth0").is_ok());
    }

    #[test]
    fn sockaddr_carries_the_address_in_network_order() {
        let sa = sockaddr_v4(Ipv4Addr::new(10, 0, 2, 100));
        assert_eq!(sa.sa_family, libc::AF_INET as libc::sa_family_t);
        // sin_port (2 bytes) then sin_addr.
        assert_eq!(&sa.sa_data[2..6].iter().map(|b| *b as u8).collect::<Vec<_>>(), &[10, 0, 2, 100]);
    }
}

//! The ns sandbox's network link: a tap device `eth0` in the sandbox's
//! network namespace, whose fd goes to the worker (and from there to netd).
//!
//! Two steps in the init. [`create_tap`] right after `clone`, while it still
//! has the worker's host credentials (so it can open `/dev/net/tun`) and
//! already sits in its new network namespace (a tap belongs to the namespace
//! of the process that opened `/dev/net/tun`; TUNSETIFF needs CAP_NET_ADMIN
//! in that namespace's user namespace, which the freshly cloned init has).
//! [`configure_and_send`] once it is root of its mapped user namespace (the
//! namespace's sysctls belong to that root): IPv6 off on `eth0` before it
//! goes up (netd speaks IPv4 only, so no link-local chatter reaches it),
//! address, MTU and default route from pvisor_net::plan, then the fd goes
//! over a socketpair and the init closes its own copy: nothing in the
//! sandbox can read or write the tap's host side.
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use pvisor_net::plan;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens `/dev/net/tun` and creates the tap `eth0` (one frame per read or
/// write, no packet-information header), still down.
pub fn create_tap() -> Result<OwnedFd, String> {
    let name = plan::IFACE;
    // SAFETY: open(2) of a constant path; the result is checked below.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        let hint = match e.raw_os_error() {
            Some(libc::EACCES) => " (an unprivileged worker needs it mode 0666, Debian's default)",
            _ => "",
        };
        return Err(format!("open /dev/net/tun: {e}{hint}"));
    }
    // SAFETY: open just returned this fd and nothing else owns it.
    let tun = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= ifr.ifr_name.len() {
        return Err(format!("interface name {name:?} too long"));
    }
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes the ifreq we own, valid for the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut ifr as *mut libc::ifreq) } < 0 {
        return Err(format!("TUNSETIFF {name}: {}", std::io::Error::last_os_error()));
    }
    Ok(tun)
}

/// Child side: configures `eth0` and sends its fd over `to_worker`; the
/// tap's fd is closed here once sent.
pub fn configure_and_send(tap: OwnedFd, to_worker: &OwnedFd) -> Result<(), String> {
    let sysctl = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", plan::IFACE);
    match std::fs::write(&sysctl, "1") {
        // A kernel without IPv6 has no such file, and nothing to disable.
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(format!("{sysctl}: {e}")),
        _ => {}
    }
    pvisor_net::iface::configure(plan::IFACE, plan::SANDBOX_IP, plan::PREFIX_LEN, plan::TAP_MTU)
        .map_err(|e| format!("{}: {e}", plan::IFACE))?;
    pvisor_net::iface::default_route(plan::GATEWAY_IP).map_err(|e| format!("default route: {e}"))?;
    let fds = [tap.as_raw_fd()];
    sendmsg::<()>(
        to_worker.as_raw_fd(),
        &[IoSlice::new(&[0])],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("passing the tap to the worker: {e}"))?;
    Ok(())
}

/// Worker side: the tap's fd, as the init sent it (close-on-exec here).
pub fn receive(from_init: &OwnedFd) -> Result<OwnedFd, String> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(from_init.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| format!("receiving the sandbox's tap: {e}"))?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(|e| format!("receiving the sandbox's tap: {e}"))? {
        if let ControlMessageOwned::ScmRights(r) = c {
            // SAFETY: SCM_RIGHTS installed these fds in this process just
            // now; nothing else owns them.
            fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(tap), None) => Ok(tap),
        (None, _) => Err("the sandbox's init sent no tap".into()),
        (Some(_), Some(_)) => Err("the sandbox's init sent more than one fd".into()),
    }
}

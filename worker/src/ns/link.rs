//! The ns sandbox's network link: a tap device `eth0` in the sandbox's
//! network namespace, whose fd goes to the worker (and from there to netd).
//!
//! Two steps in the init. [`open_tun`] right after `clone`, while it still
//! has the worker's host credentials (so it can open `/dev/net/tun`) and
//! already sits in its new network namespace (a tap belongs to the namespace
//! of the process that opened `/dev/net/tun`). [`configure_and_send`] once it
//! is root of its mapped user namespace (which owns the namespace's sysctls
//! and gives CAP_NET_ADMIN there): IPv6 off for new devices (netd speaks
//! IPv4 only, so no link-local chatter reaches it), the tap `eth0` created,
//! address, MTU and default route from pvisor_net::plan, then the fd goes
//! over a socketpair and the init closes its own copy: nothing in the
//! sandbox can read or write the tap's host side.
//!
//! Every step that changes a link takes the host-wide rtnl lock, which other
//! namespaces' teardowns hold for RCU grace periods; the set-up keeps those
//! steps few. IPv6 is turned off through the namespace's `default` entry
//! before the tap exists (that write takes no lock, where the device's own
//! entry spins on it) and the device inherits it.
//!
//! The tap is made persistent, which changes only who removes it: closing a
//! non-persistent tap's last fd unregisters the device on its own, paying
//! its own RCU waits while holding the host's rtnl lock (~40 ms measured
//! on a busy host, stalling the next sandbox's set-up of its links), whereas
//! a persistent one is removed with its namespace, in the same batch as the
//! namespace's loopback. The namespace lives as long as the sandbox's
//! processes or netd's fd (the tap's socket holds it), so the device never
//! outlives both; it never reaches the host's namespace (virtual devices are
//! deleted with theirs, not moved back).
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use pvisor_net::plan;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens `/dev/net/tun` (the tap it makes later belongs to the caller's
/// network namespace).
pub fn open_tun() -> Result<OwnedFd, String> {
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
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Makes `tun` the tap `eth0` (one frame per read or write, no
/// packet-information header, persistent: see the module docs), still down.
fn create_tap(tun: &OwnedFd) -> Result<(), String> {
    let name = plan::IFACE;
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
    // SAFETY: TUNSETPERSIST takes an integer argument, no pointer.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } < 0 {
        return Err(format!("TUNSETPERSIST {name}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// How long the init's steps took, in µs (sent with the tap, for the
/// worker's debug log: the link's share of a create).
#[derive(Debug, Default, Clone, Copy)]
pub struct SetupTimes {
    pub sysctl_us: u32,
    pub tap_us: u32,
    pub address_us: u32,
    pub route_us: u32,
}

impl SetupTimes {
    const LEN: usize = 16;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        for (i, v) in [self.sysctl_us, self.tap_us, self.address_us, self.route_us].into_iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> SetupTimes {
        let at = |i: usize| b.get(i * 4..i * 4 + 4).and_then(|s| s.try_into().ok()).map_or(0, u32::from_le_bytes);
        SetupTimes { sysctl_us: at(0), tap_us: at(1), address_us: at(2), route_us: at(3) }
    }
}

/// µs since `*t`, which moves to now.
fn lap(t: &mut std::time::Instant) -> u32 {
    let now = std::time::Instant::now();
    let us = now.duration_since(*t).as_micros().min(u32::MAX as u128) as u32;
    *t = now;
    us
}

/// Child side: makes `tun` the configured `eth0` and sends its fd over
/// `to_worker`; the tap's fd is closed here once sent.
pub fn configure_and_send(tap: OwnedFd, to_worker: &OwnedFd) -> Result<(), String> {
    let mut t = std::time::Instant::now();
    let mut times = SetupTimes::default();
    // Inherited by eth0 when it registers below.
    let sysctl = "/proc/sys/net/ipv6/conf/default/disable_ipv6";
    match std::fs::write(sysctl, "1") {
        // A kernel without IPv6 has no such file, and nothing to disable.
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(format!("{sysctl}: {e}")),
        _ => {}
    }
    times.sysctl_us = lap(&mut t);
    create_tap(&tap)?;
    times.tap_us = lap(&mut t);
    pvisor_net::iface::configure(plan::IFACE, plan::SANDBOX_IP, plan::PREFIX_LEN, plan::TAP_MTU)
        .map_err(|e| format!("{}: {e}", plan::IFACE))?;
    times.address_us = lap(&mut t);
    pvisor_net::iface::default_route(plan::GATEWAY_IP).map_err(|e| format!("default route: {e}"))?;
    times.route_us = lap(&mut t);
    let fds = [tap.as_raw_fd()];
    sendmsg::<()>(
        to_worker.as_raw_fd(),
        &[IoSlice::new(&times.encode())],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("passing the tap to the worker: {e}"))?;
    Ok(())
}

/// Worker side: the tap's fd, as the init sent it (close-on-exec here), and
/// the init's timings.
pub fn receive(from_init: &OwnedFd) -> Result<(OwnedFd, SetupTimes), String> {
    let mut bytes = [0u8; SetupTimes::LEN];
    let mut iov = [IoSliceMut::new(&mut bytes)];
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
    let n = msg.bytes.min(SetupTimes::LEN);
    let times = SetupTimes::decode(&bytes[..n]);
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(tap), None) => Ok((tap, times)),
        (None, _) => Err("the sandbox's init sent no tap".into()),
        (Some(_), Some(_)) => Err("the sandbox's init sent more than one fd".into()),
    }
}

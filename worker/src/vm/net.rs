//! The vm backend's network link: a SOCK_SEQPACKET socketpair whose one end
//! is the wire of the guest's virtio-net device (served by the device thread
//! under KVM, or the vhost-user-net back-end under QEMU) and whose other end
//! goes to netd as [`NetLink`] (kind LINK_SEQPACKET): one Ethernet frame per
//! message each way. The VMM never reaches the network itself.
use crate::backend::NetLink;
use crate::error::{Result, WorkerError};
use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
use pvisor_net::plan;
use pvisor_vmm::devices::virtio::net::Net;
use std::os::fd::OwnedFd;

/// The guest's MTU, as the ns backend's tap: large frames mean fewer trips
/// through netd; the device's mergeable rx buffers take them.
pub const MTU: u16 = plan::TAP_MTU as u16;
/// Socket buffer of each end: a few of the largest frames in flight before
/// a side that does not read makes the other wait.
const SOCKET_BUFFER: usize = 1 << 20;

/// The two ends of a new link: the device's, and netd's.
pub fn link() -> Result<(OwnedFd, NetLink)> {
    let (device, netd) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| WorkerError::sys("net link socketpair", e))?;
    for end in [&device, &netd] {
        // Best effort: the kernel caps it at net.core.wmem_max.
        let _ = setsockopt(end, sockopt::SndBuf, &SOCKET_BUFFER);
    }
    Ok((device, NetLink { fd: netd, kind: pvisor_proto::net::LinkKind::LinkSeqpacket }))
}

/// The guest's virtio-net device on the device's end of the link.
pub fn device(end: OwnedFd) -> Result<Net> {
    Net::new(end, plan::GUEST_MAC, MTU).map_err(|e| WorkerError::Start(format!("virtio-net: {e}")))
}

/// The guest's MAC as QEMU takes it (`02:70:76:00:00:64`).
pub fn mac_string() -> String {
    plan::GUEST_MAC.map(|b| format!("{b:02x}")).join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_link_is_a_seqpacket_pair_netd_can_use() {
        let (device_end, netd) = link().unwrap();
        assert_eq!(netd.kind, pvisor_proto::net::LinkKind::LinkSeqpacket);
        let kind = nix::sys::socket::getsockopt(&netd.fd, sockopt::SockType).unwrap();
        assert_eq!(kind, SockType::SeqPacket);
        // One frame per message, whole.
        nix::sys::socket::send(netd.fd.as_raw_fd(), &[7u8; 9000], nix::sys::socket::MsgFlags::empty()).unwrap();
        let mut buf = [0u8; 70000];
        let n = nix::sys::socket::recv(device_end.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty()).unwrap();
        assert_eq!(n, 9000);
        let dev = device(device_end).unwrap();
        let mut config = [0u8; 12];
        pvisor_vmm::devices::virtio::VirtioDevice::read_config(&dev, 0, &mut config);
        assert_eq!(&config[..6], &plan::GUEST_MAC);
        assert_eq!(u16::from_le_bytes([config[10], config[11]]), MTU);
        assert_eq!(mac_string(), "02:70:76:00:00:64");
    }
}

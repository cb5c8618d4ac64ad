//! The virtio-net model as a vhost-user-net back-end, for QEMU's
//! `-netdev vhost-user` (the test engine):
//!
//! ```text
//! -chardev socket,id=net,path=NET_SOCK -netdev vhost-user,id=n0,chardev=net
//! -device virtio-net-device,netdev=n0,mac=MAC,host_mtu=MTU,<QEMU_DEVICE_PROPS>
//! ```
//!
//! Two things differ from the other back-ends:
//!
//! * QEMU owns a virtio-net device's config space and control queue; only
//!   the rx/tx rings reach the back-end. [`QEMU_DEVICE_PROPS`] turns off the
//!   features that need a control queue, so the guest sees the device the
//!   project's own VMM shows it (rx and tx only), and the MAC and MTU are
//!   given to QEMU on the command line.
//! * QEMU 7.2 (Debian 12) sends SET_VRING_ENABLE before its SET_FEATURES
//!   acks VHOST_USER_F_PROTOCOL_FEATURES, which `vhost-user-backend` takes
//!   for a protocol violation (it drops the connection), and QEMU refuses to
//!   start a vhost-user netdev whose back-end offers no protocol features.
//!   So QEMU talks to a relay (`proxy`) that answers those early requests
//!   itself and passes everything else to the daemon unchanged.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use super::{proxy, serve_device, Error, VhostUserDevice, VhostUserServer};
use crate::devices::virtio::net::Net;

/// QEMU `virtio-net-device` properties for a device without a control
/// queue (and no multiqueue), as the model is.
pub const QEMU_DEVICE_PROPS: &str = "ctrl_vq=off,ctrl_rx=off,ctrl_vlan=off,ctrl_mac_addr=off,guest_announce=off,mq=off";

/// Binds `socket` before returning (a front-end may connect at once), then
/// serves `net` to the first front-end that connects, through the relay; the
/// daemon's own socket is `<socket>.daemon`, connected to here (before any
/// seccomp filter) and unlinked again.
pub fn serve_net(name: &str, net: Net, socket: &Path) -> Result<VhostUserServer<Net>, Error> {
    let mut inner = socket.as_os_str().to_owned();
    inner.push(".daemon");
    let inner = PathBuf::from(inner);
    let device = VhostUserDevice::new(net).map_err(Error::ExitEvent)?;
    let server = serve_device(name, device, &inner)?;
    let relay_err = |e: std::io::Error| Error::Relay { path: socket.to_path_buf(), source: e };
    let back = UnixStream::connect(&inner).map_err(relay_err)?;
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_file(socket);
    let front = UnixListener::bind(socket).map_err(relay_err)?;
    proxy::spawn(&format!("{name}-relay"), front, back).map_err(Error::Spawn)?;
    Ok(server)
}

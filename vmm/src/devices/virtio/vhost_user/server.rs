//! Serving one vhost-user front-end connection on a socket path.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;

use super::{Error, VhostUserDevice};
use crate::devices::virtio::{GuestMemory, VirtioDevice};

/// A back-end serving on its own thread until the front-end disconnects.
pub struct VhostUserServer<D: VirtioDevice + 'static> {
    device: Arc<VhostUserDevice<D>>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl<D: VirtioDevice + 'static> VhostUserServer<D> {
    /// The served device.
    pub fn device(&self) -> &Arc<VhostUserDevice<D>> {
        &self.device
    }

    /// Waits for the front-end to disconnect (QEMU exiting).
    pub fn join(mut self) -> Result<(), Error> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::Panicked),
            None => Ok(()),
        }
    }
}

/// Binds `socket` (replacing a stale file) before returning, so a front-end
/// may connect as soon as this returns, then serves `device` to the first
/// front-end that connects, on a new thread named `name`.
pub fn serve<D: VirtioDevice + 'static>(name: &str, device: D, socket: &Path) -> Result<VhostUserServer<D>, Error> {
    serve_device(name, VhostUserDevice::new(device).map_err(Error::ExitEvent)?, socket)
}

/// [`serve`] with the back-end already wrapped (e.g.
/// [`VhostUserDevice::without_protocol_features`]).
pub fn serve_device<D: VirtioDevice + 'static>(
    name: &str,
    device: VhostUserDevice<D>,
    socket: &Path,
) -> Result<VhostUserServer<D>, Error> {
    let mut listener =
        Listener::new(socket, true).map_err(|source| Error::Bind { path: socket.to_path_buf(), source })?;
    let device = Arc::new(device);
    let mut daemon =
        VhostUserDaemon::new(name.to_string(), device.clone(), GuestMemoryAtomic::new(GuestMemory::default()))
            .map_err(Error::Daemon)?;
    if let Some(fd) = device.event_fd() {
        let token = u64::from(device.device_event_token());
        for handler in daemon.get_epoll_handlers() {
            handler.register_listener(fd, EventSet::IN, token).map_err(Error::Register)?;
        }
    }
    let served = device.clone();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = match daemon.start(&mut listener).and_then(|()| daemon.wait()) {
                // The front-end going away (QEMU exiting) is the normal end.
                Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
                )) => Ok(()),
                other => other.map_err(Error::Serve),
            };
            served.notify_exit();
            result
        })
        .map_err(Error::Spawn)?;
    Ok(VhostUserServer { device, thread: Some(thread) })
}

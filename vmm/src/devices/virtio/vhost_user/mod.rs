//! vhost-user back-ends serving the same device models as the virtio-mmio
//! transport, for QEMU (the test engine that runs a Linux guest under TCG):
//!
//! ```text
//! qemu-system-x86_64 -M microvm,memory-backend=mem \
//!   -object memory-backend-memfd,id=mem,size=256M,share=on \
//!   -chardev socket,id=blk,path=BLK_SOCK -device vhost-user-blk-device,chardev=blk \
//!   -chardev socket,id=vs,path=VSOCK_SOCK -device vhost-user-vsock-device,chardev=vs
//! ```
//!
//! [`VhostUserDevice`] adapts any [`VirtioDevice`](super::VirtioDevice) to
//! `vhost_user_backend::VhostUserBackend`; [`serve`] binds a socket and
//! answers one front-end connection on a thread of its own.

mod backend;
mod server;

pub use backend::VhostUserDevice;
pub use server::{serve, VhostUserServer};

/// Errors of the vhost-user back-ends.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {path}: {source}")]
    Bind {
        path: std::path::PathBuf,
        #[source]
        source: vhost::vhost_user::Error,
    },
    #[error("creating the daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    #[error("registering the device's event source: {0}")]
    Register(#[source] std::io::Error),
    #[error("creating the exit event: {0}")]
    ExitEvent(#[source] std::io::Error),
    #[error("spawning the server thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("serving the front-end: {0}")]
    Serve(vhost_user_backend::Error),
    #[error("the server thread panicked")]
    Panicked,
}

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
//!
//! Threads per served device and their syscalls (observed with `strace -f`
//! on the QEMU test), for seccomp filters:
//!
//! * `<name>` (from [`serve`]): `accept4`, `unlink` (stale socket),
//!   `clone3` (spawns the next), `close`, `futex`, `write`.
//! * `<name>` (the library's request handler): `recvmsg`, `sendmsg`
//!   (messages with fds), `mmap` with `MAP_SHARED` of the front-end's
//!   memfd (SET_MEM_TABLE), `munmap`, `epoll_ctl` (vring kicks),
//!   `read`/`write`, `close`, `shutdown`, `fcntl`, `futex`, and glibc's
//!   `openat("/sys/devices/system/cpu/online")` (malloc arena sizing).
//! * `vring_worker` (the library's queue thread, where the device model
//!   runs): `epoll_wait`, `read`/`write` (kick/call eventfds), `futex`,
//!   `getrandom` (hash seeds); blk: `pread64`, `pwrite64`, `fdatasync`,
//!   `fallocate`; vsock: as on the device thread of
//!   [`super::event_loop`] (`epoll_ctl`, `socket`, `connect`, `accept4`,
//!   `recvfrom`, `sendto`, `shutdown`, `close`).
//! * all: allocator (`mmap`, `munmap`, `mprotect`, `madvise`) and thread
//!   start/exit (`rt_sigprocmask`, `sigaltstack`, `sched_getaffinity`,
//!   `prctl`, `set_robust_list`, `rseq`, `gettid`, `exit`).

mod backend;
pub mod net;
mod proxy;
mod server;

pub use backend::VhostUserDevice;
pub use server::{serve, serve_device, VhostUserServer};

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
    #[error("vhost-user relay at {path}: {source}")]
    Relay {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the server thread panicked")]
    Panicked,
}

//! The image server filter.
//!
//! `pvisor-imaged` serves one image read-only through FUSE to every sandbox of that image. It
//! opens the pool (every pack file) and mounts before jailing itself; from then on it only
//! reads requests from `/dev/fuse`, reads compressed chunks with `pread64`, decompresses them in
//! memory and writes replies. So, unlike the sandbox and worker filters (deny lists), this one is
//! an allow list in the style of Firecracker: what the table does not allow kills the process
//! (`SECCOMP_RET_KILL_PROCESS`, logged by the kernel). Memory may never become executable
//! (`mmap`/`mprotect` with `PROT_EXEC` are killed), `clone` may only create threads, and no
//! syscall that opens, creates or receives a file descriptor is allowed, so the server can
//! reach nothing but the fds it held when the filter went on.
//!
//! The server also runs with `no_new_privs`, non-dumpable and with every capability dropped;
//! see `images/src/fuse/jail.rs`.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

/// Compiles the image server filter. Install it with
/// [`apply_to_all_threads`](crate::apply_to_all_threads) once the FUSE mount is live and the
/// capabilities are dropped.
pub fn image_server_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::ImageServer, rules(FilterKind::ImageServer))
}

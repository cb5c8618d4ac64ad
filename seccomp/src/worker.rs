//! The worker filter.
//!
//! The per-sandbox worker is a tokio + tonic gRPC server on a Unix socket. By the time it
//! installs this filter it has spawned its sandbox and its network process (`pvisor-netd`, exec'd
//! while the worker waited for its configuration), and it will never exec, mount or create a
//! namespace again. Talking to netd afterwards needs only what a Unix socket does: `sendmsg`
//! with `SCM_RIGHTS`, `recvfrom`, `poll`, `wait4` to reap it. It installs the filter with
//! [`apply_to_all_threads`](crate::apply_to_all_threads) (TSYNC), so the tokio worker threads
//! that already exist are covered too, and threads created later inherit it.
//!
//! The filter is the sandbox filter (everything Docker's default profile refuses, the mount
//! API, namespace creation and `setns`, `clone3` -> `ENOSYS`, ...) plus, for the worker:
//! `execve`/`execveat`, `unshare` with any flags, `ptrace`, `process_vm_readv`/`writev`,
//! `chroot`, and `socket` for any domain but `AF_UNIX` (`EAFNOSUPPORT`). Thread creation keeps
//! working: glibc's `pthread_create` gets `ENOSYS` from `clone3` and falls back to `clone`
//! without namespace flags.
//!
//! KVM: nothing yet. This is a deny list with default allow, because today's worker is an
//! ordinary tokio program whose exact syscall set moves with its dependencies. An allow list
//! for the worker (default deny, Firecracker-style, including the KVM ioctls it needs) comes
//! with the vm backend, whose worker will be a VMM with a small, known syscall set.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

/// Compiles the worker filter. Install it with
/// [`apply_to_all_threads`](crate::apply_to_all_threads) once the sandbox is running.
pub fn worker_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::Worker, rules(FilterKind::Worker))
}

//! The sandbox filter.
//!
//! Installed with [`apply_to_thread`](crate::apply_to_thread) (which sets `no_new_privs`
//! first) by the sandbox's init right before it execs the in-sandbox agent. A seccomp filter
//! survives `execve` and is inherited by every child, so it covers every process of the
//! sandbox, and nothing inside can remove it.
//!
//! The sandbox already runs in its own user, pid, mount, network, IPC, UTS and cgroup
//! namespaces, as root of its user namespace. The namespaces decide *what* a syscall can
//! reach; this filter removes the syscalls whose reach the namespaces do not limit (kernel
//! modules, clocks, keyrings, the kernel log, ...), the ones that would let the sandbox rebuild
//! its own confinement (mounts, new namespaces, `setns`), and large kernel attack surfaces
//! the workloads do not need (eBPF, perf, io_uring, userfaultfd).
//!
//! Default action: allow. Denied syscalls fail with `EPERM`, as in Docker's default profile,
//! so software that copes with running in Docker copes here; `clone3` fails with `ENOSYS` so
//! that libc falls back to `clone`, whose flags the filter can inspect. A syscall from a
//! foreign architecture (32-bit `int 0x80`) kills the process; an x32 syscall fails with
//! `EPERM`. See `rules.rs` or `RULES.md` for the table and the reason behind every entry.
//!
//! `no_new_privs` is part of the deal: inside the sandbox, setuid and file-capability binaries
//! no longer gain privileges on exec (as root of its user namespace the agent rarely needs them).
//!
//! `ptrace` and `process_vm_readv`/`process_vm_writev` stay allowed: the pid namespace already
//! hides every process outside the sandbox, and debuggers and profilers need them.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

/// Compiles the sandbox filter. Install it with [`apply_to_thread`](crate::apply_to_thread)
/// in the single-threaded init just before `execve`.
pub fn sandbox_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::Sandbox, rules(FilterKind::Sandbox))
}

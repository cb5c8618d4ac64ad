//! The isolator filter.
//!
//! The agent's isolator is the one process of a sandbox that keeps what building namespaces
//! takes (`CAP_SYS_ADMIN` over the sandbox's user namespace, or of the vm guest): it is forked
//! before the sandbox drops its privileges and builds isolated sessions (pid, mount, ipc, uts
//! and network namespaces, a read-only copy of the sandbox's root with the session's mounts).
//! It installs this filter on itself before it serves the agent: the sandbox filter, with
//! `clone`/`unshare` let through for those namespaces (never a user, cgroup or time
//! namespace) and `mount`, `umount2`, `pivot_root` and `mount_setattr` for a session's layout (the
//! rest of the mount API stays refused). Each session's init inherits
//! it and, once its mounts are built, adds the [sandbox filter](crate::sandbox) (filters
//! stack; the stricter answer wins), so every process of a session runs under exactly the
//! sandbox's rules. See `ISOLATOR` in `rules.rs`.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

/// Compiles the isolator filter. Install it with [`apply_to_thread`](crate::apply_to_thread)
/// in the single-threaded isolator before it reads a request.
pub fn isolator_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::Isolator, rules(FilterKind::Isolator))
}

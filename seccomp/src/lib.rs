//! pvisor's seccomp-BPF filters, kept as data in the style of Firecracker: every rule is an
//! entry of a table ([`rules`]) with a one-line justification, compiled to BPF at run time with
//! seccompiler (no build script, no JSON).
//!
//! Seven filters:
//!
//! * the [sandbox filter](sandbox), installed by the sandbox's init right before it execs the
//!   in-sandbox agent, so that it applies to every process in the sandbox;
//! * the [worker filter](worker), installed by the per-sandbox worker on all its threads once
//!   its sandbox runs;
//! * the [image server filter](image_server), installed by `pvisor-imaged` (the FUSE server of
//!   one image) once its mount is live;
//! * the [vCPU and VMM device filters](vmm), installed per thread by the VMM of a vm-backend
//!   worker (allow lists);
//! * the [netd filter](netd), installed by `pvisor-netd`, a sandbox's network process (an
//!   allow list);
//! * the [isolator filter](isolator), installed by the agent's isolator, the in-sandbox helper
//!   that builds isolated sessions (the sandbox filter with namespace creation and mounts let
//!   through).
//!
//! The sandbox, worker and isolator filters default to *allow* and refuse a deny list (mostly
//! with `EPERM`, like Docker's default profile); the image server, vCPU, VMM device and netd
//! filters are allow lists. `RULES.md` next to this crate's manifest is the generated table of
//! all seven.
//!
//! ```no_run
//! // In the sandbox's init, after setting up namespaces and mounts, before execve:
//! let filter = pvisor_seccomp::sandbox_filter()?;
//! pvisor_seccomp::apply_to_thread(&filter)?;
//! # Ok::<(), pvisor_seccomp::Error>(())
//! ```
//!
//! Linux only, x86_64 and aarch64.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("pvisor-seccomp supports Linux on x86_64 and aarch64 only");

mod compile;
mod error;
pub mod image_server;
pub mod isolator;
pub mod netd;
pub mod privileges;
mod rules;
pub mod sandbox;
pub mod vmm;
pub mod worker;

#[cfg(test)]
mod tests;

pub use compile::BPF_MAX_LEN;
pub use error::Error;
pub use image_server::image_server_filter;
pub use isolator::isolator_filter;
pub use netd::netd_filter;
pub use rules::{
    rules, rules_markdown, Action, DefaultAction, FilterKind, Rule, When, ALLOWED_PERSONAS, CLONE_NAMESPACE_FLAGS,
    UNSHARE_NAMESPACE_FLAGS,
};
pub use sandbox::sandbox_filter;
pub use seccompiler::{sock_filter, BpfProgram};
pub use vmm::{vcpu_filter, vmm_device_filter};
pub use worker::worker_filter;

/// Compiles the filter of the given kind.
pub fn filter(kind: FilterKind) -> Result<BpfProgram, Error> {
    match kind {
        FilterKind::Sandbox => sandbox_filter(),
        FilterKind::Worker => worker_filter(),
        FilterKind::ImageServer => image_server_filter(),
        FilterKind::Vcpu => vcpu_filter(),
        FilterKind::VmmDevice => vmm_device_filter(),
        FilterKind::Netd => netd_filter(),
        FilterKind::Isolator => isolator_filter(),
    }
}

/// Installs `prog` on the calling thread only, after setting `PR_SET_NO_NEW_PRIVS` on it
/// (required to install a filter without `CAP_SYS_ADMIN`, and what stops a setuid binary from
/// running with privileges the filter did not expect). The filter is inherited by threads and
/// processes the thread creates afterwards and survives `execve`; it cannot be removed.
pub fn apply_to_thread(prog: &BpfProgram) -> Result<(), Error> {
    // seccompiler sets PR_SET_NO_NEW_PRIVS, then calls seccomp(SECCOMP_SET_MODE_FILTER, 0, ..).
    seccompiler::apply_filter(prog).map_err(Error::from)
}

/// Installs `prog` on every thread of the process at once (`SECCOMP_FILTER_FLAG_TSYNC`),
/// after setting `PR_SET_NO_NEW_PRIVS` on the calling thread; the kernel propagates
/// `no_new_privs` to the other threads with the filter. Either every thread gets the filter or
/// none does ([`Error::ThreadSync`]).
pub fn apply_to_all_threads(prog: &BpfProgram) -> Result<(), Error> {
    // seccompiler sets PR_SET_NO_NEW_PRIVS, then calls seccomp(.., SECCOMP_FILTER_FLAG_TSYNC, ..).
    seccompiler::apply_filter_all_threads(prog).map_err(Error::from)
}

//! The netd filter: `pvisor-netd`, a sandbox's user-space network stack, between the
//! sandbox's link and ordinary host sockets. An allow list that kills the process on anything
//! else, installed once netd has pivoted into an empty root and dropped every capability; see
//! `src/netd_rules.rs` for the table and netd's `jail.rs` for the rest of its jail.

use seccompiler::BpfProgram;

use crate::rules::{rules, FilterKind};
use crate::Error;

/// Compiles the netd filter. Install it with [`apply_to_thread`](crate::apply_to_thread)
/// (netd has one thread).
pub fn netd_filter() -> Result<BpfProgram, Error> {
    crate::compile::compile(FilterKind::Netd, rules(FilterKind::Netd))
}

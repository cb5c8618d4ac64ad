//! Durability: sandboxes outlive the broker.
//!
//! The broker's state is on disk in the data dir: each sandbox's record
//! ([`store`]: spec, metadata, expiry, endpoint token, state, egress policy,
//! its worker's identity), snapshot records (`snapshot::store`) and named
//! volumes (`volumes::store`). Records are JSON files, one per sandbox,
//! replaced atomically (temporary file, rename; fsync of file and directory
//! right after, off the request path: see [`store`]) rather than an
//! embedded database: each sandbox changes independently, so a file per
//! record needs no shared log or lock; a crash leaves every record whole
//! (old or new); the snapshot store already works this way; and it adds no
//! dependency (SQLite would be a C library built into the broker for what
//! amounts to a handful of small key-value writes).
//!
//! Workers and image servers are started so that they outlive the broker
//! (`WorkerConfig.outlive_broker`, no image-server lifeline) unless
//! `pvisor serve --stop-sandboxes-on-exit`. A restarted broker
//! ([`recover`], then [`adopt`]) finds each worker again by pid, start time
//! and name ([`proc`]), holds it by a pidfd, connects to its socket and
//! keeps its cgroup and files; a worker that died while the broker was down
//! is reported `Failed` (`WORKER_EXITED`); after a host reboot (a new boot
//! id) every sandbox that ran is `Terminated` (`HOST_RESTARTED`). While the
//! broker is down, each worker enforces its sandbox's expiry itself
//! (`worker/src/expiry.rs`).
pub mod adopt;
pub mod proc;
pub mod recover;
pub mod store;

pub use recover::{recover, Keep};
pub use store::{SandboxRecord, SandboxStore};

/// A cgroup's name (the last component of its directories).
pub fn cgroup_name(g: &pvisor_worker::cgroup::GroupPaths) -> Option<String> {
    g.dirs().first().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned())
}

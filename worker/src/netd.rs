//! The sandbox's network process (`pvisor-netd`), from the worker's side.
//!
//! SKELETON: to be written (ns-link helper). Intended API, used by both
//! backends' plumbing in `main.rs`:
//!
//! ```ignore
//! pub struct Netd { /* control socket, pid */ }
//! impl Netd {
//!     /// Spawns pvisor-netd (next to the worker's executable) in the
//!     /// worker's cgroup, before the configuration arrives (warm workers
//!     /// carry an idle netd, so a create does not pay for its start).
//!     pub fn spawn() -> Result<Netd>;
//!     /// Hands netd the sandbox's link and network configuration; waits for its answer.
//!     pub fn start(&self, sandbox_id: &str, link: NetLink, cfg: &NetConfig) -> Result<()>;
//!     pub fn set_policy(&self, p: &EgressPolicy) -> Result<()>;
//!     pub fn stats(&self) -> Result<NetStats>;
//! }
//! ```

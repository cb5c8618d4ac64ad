//! The agent as init of a Linux microVM guest (the vm backend).
//!
//! In the vm backend the agent is `/init` of the initramfs and PID 1 of the
//! guest kernel. Before serving anything it builds the sandbox's root
//! ([`boot`]): the image's erofs view (a read-only virtio-blk disk) as the
//! lower layer of an overlay whose upper lives on the sandbox's scratch disk
//! (ext4), switched to as `/`. It then serves the same gRPC API as in the
//! ns backend, over vsock ([`vsock`]), accepting again whenever the worker
//! reconnects. Its configuration comes from `pvisor.*` keys on the kernel
//! command line ([`cmdline`]). A boot that fails says why on the console
//! (the sandbox's log) and powers the guest off ([`power`]).
//!
//! For `main`: [`is_guest_init`] tells guest mode apart (PID 1 and no
//! arguments: the kernel starts init with none), [`init`] does everything up
//! to serving and returns the command line; then serve on
//! [`vsock::incoming`]`(cfg.port)` inside the tokio runtime.
pub mod boot;
pub mod cmdline;
pub mod console;
pub mod error;
pub mod mounts;
pub mod net;
pub mod power;
pub mod selftest;
pub mod vsock;

pub use boot::boot;
pub use cmdline::GuestCmdline;
pub use error::GuestError;
pub use selftest::run_selftest;

/// True when this process is the init of a guest: PID 1, started without
/// arguments (the ns backend starts the agent with `--fd`).
pub fn is_guest_init() -> bool {
    nix::unistd::getpid().as_raw() == 1 && std::env::args_os().len() <= 1
}

/// The guest's start, before any thread exists: early mounts, the command
/// line, [`boot`]. On failure it reports on the console and powers off; with
/// `pvisor.selftest=1` it runs [`run_selftest`] and powers off. Otherwise it
/// returns the command line, and the caller serves on `cfg.port`.
pub fn init() -> GuestCmdline {
    let cfg = match boot::early().and_then(|()| GuestCmdline::from_proc()) {
        Ok(cfg) => cfg,
        Err(e) => power::fatal(&e),
    };
    if let Err(e) = boot(&cfg) {
        power::fatal(&e);
    }
    console::line(&format!("sandbox root ready (hostname {}, vsock port {})", cfg.hostname, cfg.port));
    if cfg.selftest {
        run_selftest(&cfg);
        power::poweroff();
    }
    cfg
}

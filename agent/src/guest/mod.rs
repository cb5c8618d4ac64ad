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
//! `--flag` arguments: the kernel starts init with none), [`init`] does everything up
//! to serving and returns the command line; then serve on
//! [`vsock::incoming`]`(cfg.port)` inside the tokio runtime.
pub mod boot;
pub mod cmdline;
pub mod console;
pub mod error;
pub mod etc;
pub mod mounts;
pub mod net;
pub mod power;
pub mod refresh;
pub mod selftest;
pub mod vsock;

pub use boot::boot;
pub use cmdline::GuestCmdline;
pub use error::GuestError;
pub use selftest::run_selftest;

/// True when this process is the init of a guest: PID 1 and no `--flag`
/// argument (the ns backend starts the agent with `--fd`; the kernel starts
/// init with none, though it passes on stray command-line words, such as a
/// bare `single`, as arguments).
pub fn is_guest_init() -> bool {
    nix::unistd::getpid().as_raw() == 1 && !is_agent_invocation(std::env::args_os().skip(1))
}

/// True when `args` (without argv[0]) hold a `--flag`: the agent's own command line.
fn is_agent_invocation(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.any(|a| a.as_encoded_bytes().starts_with(b"--"))
}

/// What [`init`] leaves the agent.
pub struct Guest {
    pub cfg: GuestCmdline,
    /// The agent's bound vsock socket, which the caller serves on
    /// (`vsock::VsockListener::from_bound`, host connections only).
    pub listener: std::os::fd::OwnedFd,
    /// The agent's end of its isolator's socket (None if it could not start).
    pub isolator: Option<std::os::fd::OwnedFd>,
}

/// Forks the isolator (isolated sessions) while this process still has every
/// privilege and no thread: it keeps what building namespaces takes, the
/// agent drops it. `uppers` is the scratch disk's `isolated/`.
fn start_isolator(uppers: std::os::fd::OwnedFd, listener: &std::os::fd::OwnedFd) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    let (ours, theirs) = match crate::isolated::wire::pair() {
        Ok(p) => p,
        Err(e) => {
            console::line(&format!("warning: no isolator (socketpair: {e}); isolated sessions unavailable"));
            return None;
        }
    };
    // SAFETY: no thread exists yet (the refresh thread starts after this), so
    // the child is a consistent copy; it runs the isolator and never returns.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ours);
            // The agent's vsock listener is not the isolator's.
            let _ = nix::unistd::close(listener.as_raw_fd());
            crate::isolated::isolator::main(theirs, Some(uppers))
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => Some(ours),
        Err(e) => {
            console::line(&format!("warning: no isolator (fork: {e}); isolated sessions unavailable"));
            None
        }
    }
}

/// The guest's start, before any thread exists: early mounts, the command
/// line, [`boot`], the isolator. On failure it reports on the console and
/// powers off; with `pvisor.selftest=1` it runs [`run_selftest`] and powers
/// off. Otherwise it returns what the agent serves with ([`Guest`]).
pub fn init() -> Guest {
    let cfg = match boot::early().and_then(|()| GuestCmdline::from_proc()) {
        Ok(cfg) => cfg,
        Err(e) => power::fatal(&e),
    };
    let uppers = match boot(&cfg) {
        Ok(fd) => fd,
        Err(e) => power::fatal(&e),
    };
    console::line(&format!("sandbox root ready (hostname {}, vsock port {})", cfg.hostname, cfg.port));
    if cfg.selftest {
        run_selftest(&cfg);
        power::poweroff();
    }
    // The agent's socket, while socket(AF_VSOCK) is still allowed.
    let listener = match vsock::bind_socket(cfg.port) {
        Ok(fd) => fd,
        Err(e) => power::fatal(&GuestError::io(format!("bind vsock port {}", cfg.port), e)),
    };
    let isolator = start_isolator(uppers, &listener);
    // The one thread that keeps the privileges to step the clock, reseed the
    // random generator and set the hostname (Agent.Refresh).
    if let Err(e) = refresh::start() {
        power::fatal(&GuestError::io("start the refresh thread", e));
    }
    // From here on the guest is the sandbox: what runs in it gets the
    // privileges of an ns sandbox: the capabilities (Docker's default set), inherited from
    // the agent, which is non-dumpable: no CAP_SYS_ADMIN (mounts), no
    // CAP_SYS_BOOT (ending the VM), no CAP_SYS_PTRACE (the agent itself).
    if let Err(e) = pvisor_seccomp::privileges::drop_to_sandbox_caps() {
        power::fatal(&GuestError::Harden(e));
    }
    // And the sandbox's seccomp filter (with no_new_privs), as in ns. It
    // refuses socket(AF_VSOCK), hence the listener bound above.
    match pvisor_seccomp::sandbox_filter().and_then(|f| pvisor_seccomp::apply_to_thread(&f)) {
        Ok(()) => {}
        Err(e) => power::fatal(&GuestError::Harden(format!("seccomp: {e}"))),
    }
    Guest { cfg, listener, isolator }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> impl Iterator<Item = std::ffi::OsString> {
        a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>().into_iter()
    }

    #[test]
    fn guest_mode_only_without_agent_flags() {
        assert!(!is_guest_init(), "the test runner is not PID 1");
        assert!(!is_agent_invocation(args(&[])));
        assert!(!is_agent_invocation(args(&["single", "1"])), "stray kernel words");
        assert!(is_agent_invocation(args(&["--fd", "3"])));
        assert!(is_agent_invocation(args(&["--listen", "/tmp/a.sock", "--config", "{}"])));
    }
}

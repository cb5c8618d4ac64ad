//! The child side of the ns backend: from `clone` to `exec` of the agent.
//!
//! Runs in the cloned child of a still single-threaded worker. Any failure is
//! written to the error pipe (the worker reports it) and the child exits.
use super::mounts::{self, RootfsSpec};
use super::volumes::{self, Detached};
use crate::config::Volume;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::{sethostname, Gid, Uid};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The agent's fd number for its control connection.
pub const AGENT_FD: RawFd = 3;
/// The agent's fd number for its end of the isolator's socket.
pub const ISOLATOR_FD: RawFd = 4;

pub struct InitArgs {
    pub go: OwnedFd,
    pub err: OwnedFd,
    pub agent_sock: OwnedFd,
    pub agent_exe: OwnedFd,
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Beside them on the sandbox's own disk: where isolated sessions'
    /// persistent uppers go (the isolator's; none without a disk).
    pub isolated: Option<PathBuf>,
    /// See `NsConfig.tmp_on_root`.
    pub tmp_on_root: bool,
    pub hostname: String,
    /// With a network: the init's end of the socketpair the tap's fd
    /// goes over (see super::link).
    pub link_sock: Option<OwnedFd>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub volumes: InitVolumes,
    /// `/tmp` and `/dev/shm` sizes (mounts::tmpfs_sizes).
    pub tmp_size: u64,
    pub shm_size: u64,
    /// Host files for `/proc` entries (super::procfs), opened before the
    /// identity change like the layers.
    pub proc_files: Vec<super::procfs::ProcFile>,
    /// `NsConfig.memory_merge`: opt the sandbox into KSM (crate::ksm).
    pub memory_merge: bool,
}

/// The sandbox's volumes as the init gets them.
pub enum InitVolumes {
    /// Detached by a root worker before the clone (and idmapped by it before
    /// the release): the fds are the child's copies.
    Detached(Vec<Detached>),
    /// For the init to detach in its own mount namespace (an unprivileged
    /// worker cannot clone mounts in its own).
    Pending(Vec<Volume>),
}

/// Entry point of the cloned child; returns only on failure.
pub fn child_main(a: &InitArgs) -> isize {
    let msg = match run(a) {
        Ok(never) => match never {},
        Err(m) => m,
    };
    let _ = nix::unistd::write(&a.err, msg.as_bytes());
    1
}

fn run(a: &InitArgs) -> Result<std::convert::Infallible, String> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(|e| format!("pdeathsig: {e}"))?;
    // /dev/net/tun first, with the worker's host identity (the tap is made
    // once root of the namespace, see super::link).
    let tap = a.link_sock.as_ref().map(|_| super::link::open_tun()).transpose()?;
    // Open the layers while still holding the worker's host identity (the
    // sandbox's root may not be able to traverse the data directory's
    // parents) and already inside the new mount namespace (overlayfs only
    // takes layers from the caller's own namespace). Mounted below through
    // their /proc/self/fd links.
    let open_dir = |p: &PathBuf| -> Result<OwnedFd, String> {
        nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            // SAFETY: open(2) just returned this fd; nothing else owns it.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .map_err(|e| format!("open {}: {e}", p.display()))
    };
    let layers = [open_dir(&a.lower)?, open_dir(&a.upper)?, open_dir(&a.work)?];
    let isolated = a.isolated.as_ref().map(open_dir).transpose()?;
    let proc_fds = a
        .proc_files
        .iter()
        .map(|(p, name)| {
            nix::fcntl::open(p, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
                // SAFETY: open(2) just returned this fd; nothing else owns it.
                .map(|fd| (unsafe { OwnedFd::from_raw_fd(fd) }, *name))
                .map_err(|e| format!("open {}: {e}", p.display()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let pending: Vec<Detached>;
    let trees: &[Detached] = match &a.volumes {
        InitVolumes::Detached(t) => t,
        InitVolumes::Pending(v) => {
            pending = v.iter().map(volumes::detach).collect::<Result<_, _>>()?;
            &pending
        }
    };
    let mut b = [0u8; 1];
    match nix::unistd::read(a.go.as_raw_fd(), &mut b) {
        Ok(1) => {}
        _ => return Err("worker did not release the sandbox".into()),
    }
    // Now mapped: become root of the user namespace.
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0))
        .map_err(|e| format!("setresgid: {e}"))?;
    let _ = nix::unistd::setgroups(&[]);
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0))
        .map_err(|e| format!("setresuid: {e}"))?;
    // Die with the worker: armed again after the id change, which clears it
    // (our parent is outside our pid namespace, so getppid() cannot tell
    // whether it went in between; the broker's cgroup sweep covers that).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(|e| format!("pdeathsig: {e}"))?;
    // Root of the namespace now, which owns its network sysctls: eth0 is
    // configured and handed over (the socket itself is close-on-exec).
    if let (Some(tap), Some(sock)) = (tap, &a.link_sock) {
        super::link::configure_and_send(tap, sock)?;
    }
    // A session of its own: no controlling terminal shared with the host.
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    // The worker has moved us into the sandbox leaf: root the cgroup namespace there.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).map_err(|e| format!("cgroup namespace: {e}"))?;
    let fd_path = |fd: &OwnedFd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let (lower, upper, work) = (fd_path(&layers[0]), fd_path(&layers[1]), fd_path(&layers[2]));
    let proc_files: Vec<_> = proc_fds.iter().map(|(fd, name)| (fd_path(fd), *name)).collect();
    let isolated_path = isolated.as_ref().map(fd_path);
    mounts::setup(&RootfsSpec {
        lower: &lower,
        upper: &upper,
        work: &work,
        volumes: trees,
        tmp_on_root: a.tmp_on_root,
        tmp_size: a.tmp_size,
        shm_size: a.shm_size,
        proc_files: &proc_files,
        under_dev: isolated_path.as_deref(),
    })?;
    super::etc::write(&super::etc::EtcFiles { hostname: &a.hostname, net: a.link_sock.is_some() })?;
    sethostname(&a.hostname).map_err(|e| format!("sethostname: {e}"))?;
    pvisor_net::iface::loopback_up().map_err(|e| format!("loopback: {e}"))?;
    // Last before the privilege drop: the flag survives the exec below and
    // every fork after it, so each process of the sandbox is mergeable.
    if a.memory_merge {
        crate::ksm::merge_this_process().map_err(|e| format!("prctl(PR_SET_MEMORY_MERGE): {e}"))?;
    }
    // The isolator keeps what building isolated sessions takes; a sandbox
    // without one only lacks those (its agent says so).
    let isolator = match start_isolator(a, isolated) {
        Ok(fd) => Some(above(&fd)?),
        Err(e) => {
            eprintln!("pvisor sandbox init: no isolator: {e}");
            None
        }
    };
    nix::unistd::dup2(a.agent_sock.as_raw_fd(), AGENT_FD).map_err(|e| format!("dup2: {e}"))?;
    let mut argv = a.argv.clone();
    if let Some(fd) = &isolator {
        nix::unistd::dup2(fd.as_raw_fd(), ISOLATOR_FD).map_err(|e| format!("dup2: {e}"))?;
        argv.extend([CString::from(c"--isolator-fd"), CString::new(ISOLATOR_FD.to_string()).expect("digits")]);
    }
    // Nothing but fds 0-4 crosses into the sandbox (the agent's own exe fd is
    // still needed by fexecve, so mark rather than close).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our fds.
    if unsafe { libc::syscall(libc::SYS_close_range, ISOLATOR_FD + 1, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } != 0 {
        return Err(format!("close_range: {}", std::io::Error::last_os_error()));
    }
    pvisor_seccomp::privileges::drop_to_sandbox_caps()?;
    let filter = pvisor_seccomp::sandbox_filter().map_err(|e| format!("seccomp: {e}"))?;
    pvisor_seccomp::apply_to_thread(&filter).map_err(|e| format!("seccomp: {e}"))?;
    nix::unistd::fexecve(a.agent_exe.as_raw_fd(), &argv, &a.env).map_err(|e| format!("exec agent: {e}"))?;
    unreachable!("fexecve returned without error")
}

/// A copy of `fd` numbered above the fds the init hands over (close-on-exec).
fn above(fd: &OwnedFd) -> Result<OwnedFd, String> {
    let high = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(16))
        .map_err(|e| format!("dup: {e}"))?;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Forks the sandbox's isolator (`pvisor-agent --isolator 3 [--uppers 4]`)
/// while the init still holds every privilege of the sandbox's user
/// namespace; returns the agent's end of its socket. The isolator drops what
/// it does not need itself (see the agent's `isolated::isolator`).
fn start_isolator(a: &InitArgs, uppers: Option<OwnedFd>) -> Result<OwnedFd, String> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| format!("socketpair: {e}"))?;
    let mut argv = vec![c"pvisor-agent", c"--isolator", c"3"];
    if uppers.is_some() {
        argv.extend([c"--uppers", c"4"]);
    }
    let argv: Vec<CString> = argv.into_iter().map(CString::from).collect();
    let sock = above(&theirs)?;
    let uppers = uppers.as_ref().map(above).transpose()?;
    let first_closed: u32 = if uppers.is_some() { 5 } else { 4 };
    // SAFETY: the init is single-threaded; the child only makes the dup2,
    // close_range and fexecve calls below on fds it owns, then _exits.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            let ok = nix::unistd::dup2(sock.as_raw_fd(), 3).is_ok()
                && uppers.as_ref().is_none_or(|u| nix::unistd::dup2(u.as_raw_fd(), 4).is_ok())
                // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our fds.
                && unsafe { libc::syscall(libc::SYS_close_range, first_closed, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) } == 0;
            if ok {
                let _ = nix::unistd::fexecve(a.agent_exe.as_raw_fd(), &argv, &a.env);
            }
            // SAFETY: _exit ends the failed child without running the init's destructors.
            unsafe { libc::_exit(1) }
        }
        nix::unistd::ForkResult::Parent { .. } => Ok(ours),
    }
}

//! The sandbox's network process (`pvisor-netd`), from the worker's side.
//!
//! One netd per worker, exec'd by [`Netd::spawn`] while the worker is still a
//! warm, single-threaded process waiting for its configuration, so a create
//! does not pay for netd's start. Its process contract (netd/src/lib.rs): the
//! control socket (SOCK_SEQPACKET) on fd 3 and nothing else, one encoded
//! `pvisor.net.v1.NetdControl` per message, one `NetdReply` back per message.
//!
//! What the worker guarantees about the process it starts:
//! * stdin is /dev/null, stdout /dev/null, stderr the worker's own (its log);
//!   no other fd crosses (close_range), and it runs in a session of its own;
//! * it holds no capabilities, not even as root (bounding set emptied,
//!   `SECBIT_NOROOT` locked, `no_new_privs`), so exec cannot give it any;
//! * it dies with the worker (`PR_SET_PDEATHSIG`), and the worker reaps it;
//! * it runs in the group's `worker` leaf, not the `sandbox` one, so pausing
//!   the sandbox (the freezer on `sandbox`) does not freeze netd: policy
//!   updates and stats keep being answered, and the flows netd holds on the
//!   host side stay serviced while the sandbox sleeps.
//!
//! On the create path the worker does not wait for netd: [`Netd::send_start`]
//! hands over the link and returns, the agent is connected and configured
//! meanwhile, and [`Netd::await_start`] reads netd's answer before the
//! sandbox is reported ready (a round trip to another process costs a
//! scheduling delay on a busy host, which is the agent's to hide). A request
//! made while the answer is still unread reads it first, so answers never
//! cross.
//!
//! A config without `net` drops its [`Netd`] (killed and reaped). netd dying
//! kills nothing else: the sandbox only loses its network, which the worker
//! logs; requests after that fail with [`NetdError::Gone`].
use crate::backend::NetLink;
use crate::cgroup::{GroupPaths, WORKER_LEAF};
use pvisor_proto::net::{netd_control, EgressPolicy, NetConfig, NetStats, NetdControl, NetdReply, NetdStart};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Overrides where the worker finds `pvisor-netd` (tests; by default it is
/// the worker's sibling, as the worker and the agent are the broker's).
pub const NETD_ENV: &str = "PVISOR_NETD";

/// How long one request may wait for netd's answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest reply the worker reads (a NetdReply is a few dozen bytes).
const MAX_REPLY: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum NetdError {
    #[error("starting {path}: {source}")]
    Spawn { path: String, source: io::Error },
    #[error("moving netd into the {leaf} leaf: {reason}")]
    Cgroup { leaf: &'static str, reason: String },
    #[error("the sandbox's network process is gone ({0})")]
    Gone(String),
    #[error("the sandbox's network process did not answer within {} s", REPLY_TIMEOUT.as_secs())]
    Timeout,
    #[error("the sandbox's network process refused: {0}")]
    Refused(String),
    #[error("talking to the sandbox's network process: {0}")]
    Io(#[source] io::Error),
    #[error("bad answer from the sandbox's network process: {0}")]
    BadReply(String),
}

pub type Result<T> = std::result::Result<T, NetdError>;

/// A running `pvisor-netd`, owned by the worker.
pub struct Netd {
    pid: i32,
    /// The worker's end of the control socket; held for a whole request
    /// and its reply, so answers never cross.
    control: Mutex<Control>,
    /// Set once the process was reaped: how it ended.
    exit: Arc<Mutex<Option<String>>>,
    /// Whether a [`Netd::watch`] thread reaps it (else drop does).
    watched: bool,
}

/// The control socket and where the `start` request stands.
struct Control {
    fd: OwnedFd,
    start: StartState,
}

enum StartState {
    /// No start sent, or its answer already handed out.
    Settled,
    /// Sent; netd's answer is unread.
    Pending,
    /// Read by another request first: the failure, for [`Netd::await_start`].
    Failed(NetdError),
}

/// Where `pvisor-netd` is: [`NETD_ENV`], else next to the running executable.
pub fn netd_path() -> PathBuf {
    if let Some(p) = std::env::var_os(NETD_ENV) {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("pvisor-netd")))
        .unwrap_or_else(|| PathBuf::from("pvisor-netd"))
}

impl Netd {
    /// Starts [`netd_path`] and, when the worker has a cgroup group, moves
    /// it into that group's `worker` leaf (where the freezer acts). Call while the worker is still
    /// single-threaded (before the configuration arrives).
    pub fn spawn(group: Option<&GroupPaths>) -> Result<Netd> {
        let netd = Netd::spawn_at(&netd_path())?;
        if let Some(g) = group {
            // Out of the sandbox's freeze scope (the freezer hierarchy on v1,
            // the unified one on v2: limits sit on the group, so elsewhere
            // either leaf is the same). One migration, off the create path.
            g.join_freeze_scope(WORKER_LEAF, netd.pid)
                .map_err(|e| NetdError::Cgroup { leaf: WORKER_LEAF, reason: e.to_string() })?;
        }
        Ok(netd)
    }

    /// Starts `exe` as a netd (see the module docs for what it gets).
    pub fn spawn_at(exe: &Path) -> Result<Netd> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let spawn_err = |source: io::Error| NetdError::Spawn { path: exe.display().to_string(), source };
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| spawn_err(e.into()))?;
        set_recv_timeout(&ours, REPLY_TIMEOUT).map_err(spawn_err)?;
        let mut cmd = Command::new(exe);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        crate::launch::pass_fds(&mut cmd, [theirs.as_raw_fd()]);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: runs in the forked child before exec and calls only
        // async-signal-safe syscalls (prctl, capset, getppid) on its own
        // credentials; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || confine_child(parent));
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        drop(theirs);
        Ok(Netd {
            pid: child.id() as i32,
            control: Mutex::new(Control { fd: ours, start: StartState::Settled }),
            exit: Arc::new(Mutex::new(None)),
            watched: false,
        })
    }

    /// netd's host pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Hands netd the sandbox's link (its fd travels as SCM_RIGHTS and is
    /// closed here once sent) and its network configuration, and waits
    /// for netd to accept them.
    pub fn start(&self, sandbox_id: &str, link: NetLink, cfg: &NetConfig) -> Result<()> {
        self.send_start(sandbox_id, link, cfg)?;
        self.await_start()
    }

    /// The first half of [`Netd::start`]: sends the link and configuration
    /// and returns without waiting; [`Netd::await_start`] reads the answer.
    pub fn send_start(&self, sandbox_id: &str, link: NetLink, cfg: &NetConfig) -> Result<()> {
        let msg = netd_control::Msg::Start(NetdStart {
            sandbox_id: sandbox_id.to_owned(),
            link: link.kind as i32,
            config: Some(cfg.clone()),
        });
        self.check_alive()?;
        let bytes = prost::Message::encode_to_vec(&NetdControl { msg: Some(msg) });
        let mut control = self.lock_control();
        send(&control.fd, &bytes, Some(&link.fd))?;
        control.start = StartState::Pending;
        Ok(())
    }

    /// The second half of [`Netd::start`]: netd's answer to the start sent
    /// by [`Netd::send_start`] (Ok at once when none is pending).
    pub fn await_start(&self) -> Result<()> {
        let mut control = self.lock_control();
        match std::mem::replace(&mut control.start, StartState::Settled) {
            StartState::Settled => Ok(()),
            StartState::Pending => read_reply(&control.fd).map(drop),
            StartState::Failed(e) => Err(e),
        }
    }

    /// Replaces the policy netd applies to new flows.
    pub fn set_policy(&self, policy: &EgressPolicy) -> Result<()> {
        self.request(netd_control::Msg::Policy(policy.clone()), None).map(drop)
    }

    /// netd's counters.
    pub fn stats(&self) -> Result<NetStats> {
        let reply = self.request(netd_control::Msg::Stats(pvisor_proto::net::Empty {}), None)?;
        Ok(reply.stats.unwrap_or_default())
    }

    /// Starts a thread that reaps netd when it ends and reports it (the
    /// sandbox has lost its network): logged, then `on_exit` gets how it
    /// ended ("exited with code 1", "was killed by SIGKILL"). Call after the
    /// worker's filter is installed, so the thread inherits it.
    pub fn watch(&mut self, on_exit: impl FnOnce(&str) + Send + 'static) {
        self.watched = true;
        let (pid, exit) = (self.pid, self.exit.clone());
        std::thread::spawn(move || {
            let how = wait_exit(pid);
            if !crate::SHUTTING_DOWN.load(std::sync::atomic::Ordering::SeqCst) {
                tracing::error!(netd = pid, "the sandbox's network process {how}: the sandbox has no network now");
            }
            *exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(how.clone());
            on_exit(&how);
        });
    }

    /// Fails with [`NetdError::Gone`] once netd was reaped.
    fn check_alive(&self) -> Result<()> {
        match self.exit.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(how) => Err(NetdError::Gone(how)),
            None => Ok(()),
        }
    }

    fn lock_control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One request and its reply (a pending start's answer is read first).
    fn request(&self, msg: netd_control::Msg, fd: Option<OwnedFd>) -> Result<NetdReply> {
        self.check_alive()?;
        let bytes = prost::Message::encode_to_vec(&NetdControl { msg: Some(msg) });
        let mut control = self.lock_control();
        if matches!(control.start, StartState::Pending) {
            // The start's answer comes first; a failure waits for await_start
            // (this request then gets netd's own "not started").
            control.start = match read_reply(&control.fd) {
                Ok(_) => StartState::Settled,
                Err(e) => StartState::Failed(e),
            };
        }
        send(&control.fd, &bytes, fd.as_ref())?;
        drop(fd);
        read_reply(&control.fd)
    }
}

/// One `NetdReply`, an error when it carries one.
fn read_reply(control: &OwnedFd) -> Result<NetdReply> {
    let reply = recv(control)?;
    let reply =
        <NetdReply as prost::Message>::decode(reply.as_slice()).map_err(|e| NetdError::BadReply(e.to_string()))?;
    match reply.error.is_empty() {
        true => Ok(reply),
        false => Err(NetdError::Refused(reply.error)),
    }
}

impl Drop for Netd {
    /// An unwatched netd (a configuration without `net`, a failed start) is
    /// killed and reaped; a watched one is the watcher's to reap.
    fn drop(&mut self) {
        if !self.watched {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGKILL);
            let _ = wait_exit(self.pid);
        }
    }
}

/// In netd's child, before exec: no capabilities now or after exec, no new
/// privileges, death with the worker.
fn confine_child(parent: libc::pid_t) -> io::Result<()> {
    let check = |r: libc::c_int| if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: (the whole block) prctl and capset change only this process's
    // own credentials; every pointer passed is to a local that outlives the call.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0))?;
        // The worker may have died before the line above: then nobody kills us.
        if libc::getppid() != parent {
            return Err(io::Error::other("the worker exited"));
        }
        // Empty the bounding set: needs CAP_SETPCAP (a root worker has it;
        // an unprivileged one has nothing to drop, so EPERM is fine).
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINVAL) => break, // past the kernel's last capability
                    Some(libc::EPERM) => break,
                    _ => return Err(io::Error::last_os_error()),
                }
            }
        }
        if libc::geteuid() == 0 {
            // Root gets no capabilities back at exec, ever.
            const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
            const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
            check(libc::prctl(libc::PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0))?;
        }
        let _ = libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
        #[repr(C)]
        struct CapHeader {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        struct CapData {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
        let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let data = [
            CapData { effective: 0, permitted: 0, inheritable: 0 },
            CapData { effective: 0, permitted: 0, inheritable: 0 },
        ];
        check(libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) as libc::c_int)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

fn set_recv_timeout(fd: &OwnedFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: setsockopt reads a timeval we own, of the size we pass.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn send(control: &OwnedFd, bytes: &[u8], fd: Option<&OwnedFd>) -> Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = fd.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = fds.as_ref().map(|f| ControlMessage::ScmRights(f)).into_iter().collect();
    match sendmsg::<()>(control.as_raw_fd(), &[io::IoSlice::new(bytes)], &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
        Ok(_) => Ok(()),
        Err(e @ (nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET | nix::errno::Errno::ECONNREFUSED)) => {
            Err(NetdError::Gone(e.desc().to_owned()))
        }
        Err(e) => Err(NetdError::Io(e.into())),
    }
}

/// One reply. An empty message is a valid (all-default) `NetdReply`; an
/// empty read with the peer gone is netd's end.
fn recv(control: &OwnedFd) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_REPLY];
    loop {
        // Plain recv: any fds netd might attach are discarded by the kernel.
        match nix::sys::socket::recv(control.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::MSG_TRUNC) {
            Ok(n) if n > MAX_REPLY => return Err(NetdError::BadReply(format!("{n} bytes"))),
            Ok(0) if peer_closed(control) => return Err(NetdError::Gone("its control socket closed".into())),
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Err(NetdError::Timeout),
            Err(e @ nix::errno::Errno::ECONNRESET) => return Err(NetdError::Gone(e.desc().to_owned())),
            Err(e) => return Err(NetdError::Io(e.into())),
        }
    }
}

/// Whether netd's end of the control socket is closed.
fn peer_closed(control: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: control.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    // SAFETY: poll reads and writes the one pollfd we own; timeout 0.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0
}

/// Waits for `pid` to end; how it ended, in words.
fn wait_exit(pid: i32) -> String {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return format!("exited with code {code}"),
            Ok(WaitStatus::Signaled(_, sig, _)) => return format!("was killed by {sig}"),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return format!("could not be waited for: {e}"),
        }
    }
}

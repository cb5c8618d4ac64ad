//! A session's init: PID 1 of the session's pid namespace.
//!
//! Cloned by the isolator into the session's namespaces, it builds the
//! session's root ([`super::layout`]), then takes the sandbox's privileges
//! for good (Docker's default capabilities, the sandbox filter on top of the
//! isolator's, not dumpable) and says Ready, handing the agent the session's
//! root for the file API. From then on it serves the agent over its control
//! socket: it spawns the session's processes (the shell, background runs) as
//! the session's identity, each a session and process group of its own, kills
//! process groups on request and reports the exits of what it spawned; it
//! reaps whatever else ends up its child.
//!
//! The session ends with it: when the agent closes the socket (delete, idle
//! collection, the agent gone) or the isolator kills it, the kernel kills
//! every process of the pid namespace, and the mount namespace goes with
//! the last of them.
use super::layout;
use super::wire::{self, Received};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use pvisor_proto::isolator::{init_event, init_request, Done, Exited, Failed, InitEvent, InitRequest, Layout, Ready};
use pvisor_proto::isolator::{Spawn, Spawned};
use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// `PATH` searched when the spawn's environment has none.
const DEFAULT_PATH: &str = crate::spawn::DEFAULT_PATH;

fn event(seq: u64, kind: init_event::Kind) -> InitEvent {
    InitEvent { seq, kind: Some(kind) }
}

fn failed(seq: u64, message: String, invalid: bool) -> InitEvent {
    event(seq, init_event::Kind::Failed(Failed { message, invalid }))
}

/// Entry point of session `id`'s cloned init: never returns.
pub fn main(l: &Layout, ctl: OwnedFd, id: &str) -> ! {
    let code = match run(l, &ctl, id) {
        Ok(never) => match never {},
        Err(e) => {
            let _ = wire::send(&ctl, &failed(0, e.message, e.invalid), &[]);
            1
        }
    };
    // SAFETY: _exit ends this single-threaded process without running any
    // handler of the isolator it was cloned from.
    unsafe { libc::_exit(code) }
}

fn run(l: &Layout, ctl: &OwnedFd, id: &str) -> Result<std::convert::Infallible, layout::LayoutError> {
    let fail = |what: &str, e: String| layout::LayoutError { message: format!("{what}: {e}"), invalid: false };
    // Die with the isolator (and so with the sandbox's agent).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| fail("pdeathsig", e.to_string()))?;
    let root = layout::build(l, id)?;
    // The sandbox's privileges from here on; every session process inherits them.
    nix::sys::prctl::set_dumpable(false).map_err(|e| fail("prctl(PR_SET_DUMPABLE)", e.to_string()))?;
    pvisor_seccomp::privileges::drop_to_sandbox_caps().map_err(|e| fail("capabilities", e))?;
    let filter = pvisor_seccomp::sandbox_filter().map_err(|e| fail("seccomp", e.to_string()))?;
    pvisor_seccomp::apply_to_thread(&filter).map_err(|e| fail("seccomp", e.to_string()))?;
    wire::send(ctl, &event(0, init_event::Kind::Ready(Ready {})), &[root.as_raw_fd()])
        .map_err(|e| fail("report ready", e.to_string()))?;
    drop(root);
    serve(ctl)
}

/// Serves spawn and kill requests until the agent closes the socket.
fn serve(ctl: &OwnedFd) -> ! {
    // SIGCHLD stays blocked (the isolator blocked it before cloning us).
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let Ok(sfd) = SignalFd::with_flags(&mask, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC) else {
        // SAFETY: see `main`.
        unsafe { libc::_exit(1) }
    };
    let mut tracked = HashSet::new();
    loop {
        let mut fds = [
            nix::poll::PollFd::new(ctl.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(sfd.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // SAFETY: see `main`.
            Err(_) => unsafe { libc::_exit(1) },
        }
        let (ctl_ready, sig_ready) = (fds[0].any().unwrap_or(false), fds[1].any().unwrap_or(false));
        if sig_ready {
            let _ = sfd.read_signal();
            reap(ctl, &mut tracked);
        }
        if ctl_ready {
            match wire::recv::<InitRequest>(ctl) {
                Ok(Received::Message(req, fds)) => handle(ctl, req, fds, &mut tracked),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
                // The agent is done with the session (or gone): the session ends with us.
                // SAFETY: see `main`.
                Ok(Received::Closed) | Err(_) => unsafe { libc::_exit(0) },
            }
        }
    }
}

fn handle(ctl: &OwnedFd, req: InitRequest, fds: Vec<OwnedFd>, tracked: &mut HashSet<i32>) {
    let seq = req.seq;
    let reply = match req.kind {
        Some(init_request::Kind::Spawn(s)) => match spawn(&s, &fds) {
            Ok(pid) => {
                tracked.insert(pid);
                event(seq, init_event::Kind::Spawned(Spawned { pid }))
            }
            Err((message, invalid)) => failed(seq, message, invalid),
        },
        Some(init_request::Kind::KillGroup(k)) => {
            kill_group(ctl, k.pid, tracked);
            event(seq, init_event::Kind::Done(Done {}))
        }
        None => failed(seq, "empty request".into(), true),
    };
    drop(fds);
    let _ = wire::send(ctl, &reply, &[]);
}

/// Reaps every child that ended; reports the ones the agent spawned.
fn reap(ctl: &OwnedFd, tracked: &mut HashSet<i32>) {
    loop {
        let (pid, code) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid.as_raw(), code),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid.as_raw(), 128 + sig as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if tracked.remove(&pid) {
            let _ = wire::send(ctl, &event(0, init_event::Kind::Exited(Exited { pid, code })), &[]);
        }
    }
}

/// SIGKILLs process group `pgid` until it is empty (a fork bomb's members
/// fork while the first signal is delivered), reaping as it goes.
fn kill_group(ctl: &OwnedFd, pgid: i32, tracked: &mut HashSet<i32>) {
    if pgid <= 1 {
        return;
    }
    for _ in 0..1000 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        if unsafe { libc::kill(-pgid, libc::SIGKILL) } != 0 {
            break; // ESRCH: nobody left
        }
        reap(ctl, tracked);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    reap(ctl, tracked);
}

/// What the child failed at, written to the error pipe as (step, errno).
#[derive(Clone, Copy)]
#[repr(u8)]
enum Step {
    Chdir = 1,
    Identity = 2,
    Exec = 3,
}

/// The candidates for argv[0]: itself when it names a path, else each PATH entry.
fn candidates(argv0: &str, env: &[String]) -> Vec<CString> {
    if argv0.contains('/') {
        return CString::new(argv0).into_iter().collect();
    }
    let path = env.iter().find_map(|kv| kv.strip_prefix("PATH=")).unwrap_or(DEFAULT_PATH);
    path.split(':')
        .filter(|d| !d.is_empty())
        .filter_map(|d| CString::new(std::path::Path::new(d).join(argv0).as_os_str().as_bytes()).ok())
        .collect()
}

/// Forks and execs `s` with `fds` as its stdin, stdout and stderr; returns its pid.
fn spawn(s: &Spawn, fds: &[OwnedFd]) -> Result<i32, (String, bool)> {
    if fds.len() != 3 || s.argv.is_empty() {
        return Err(("a spawn needs argv and three descriptors".into(), true));
    }
    let cstrs = |v: &[String]| -> Result<Vec<CString>, (String, bool)> {
        v.iter().map(|a| CString::new(a.as_str()).map_err(|_| (format!("{a:?} contains NUL"), true))).collect()
    };
    let env = cstrs(&s.env)?;
    // argv[0] found nowhere: the fallback, if any.
    let found = |argv0: &str| {
        candidates(argv0, &s.env)
            .into_iter()
            .any(|c| std::path::Path::new(std::ffi::OsStr::from_bytes(c.as_bytes())).exists())
    };
    let chosen = if !found(&s.argv[0]) && !s.fallback_argv.is_empty() { &s.fallback_argv } else { &s.argv };
    let argv = cstrs(chosen)?;
    let progs = candidates(&chosen[0], &s.env);
    let cwd = CString::new(s.cwd.as_str()).map_err(|_| ("cwd contains NUL".to_string(), true))?;
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    env_p.push(std::ptr::null());
    let (err_rd, err_wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| (format!("pipe: {e}"), false))?;
    let io: [RawFd; 3] = [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()];
    let (uid, gid) = (s.uid, s.gid);
    // SAFETY: this process is single-threaded (the init never starts a thread),
    // so the child is a consistent copy; it only makes the async-signal-safe
    // calls below on data prepared before the fork, then execs or _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err((format!("fork: {}", std::io::Error::last_os_error()), false));
    }
    if pid == 0 {
        // SAFETY: the child side of the fork above; see there.
        unsafe { child(&io, &cwd, uid, gid, &progs, &argv_p, &env_p, err_wr.as_raw_fd()) }
    }
    drop(err_wr);
    let mut buf = [0u8; 5];
    let n = nix::unistd::read(err_rd.as_raw_fd(), &mut buf).unwrap_or(0);
    if n < 5 {
        return Ok(pid);
    }
    // The child failed and exits: it is reaped (untracked) with the others.
    let errno = std::io::Error::from_raw_os_error(i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]));
    Err(match buf[0] {
        x if x == Step::Chdir as u8 => (format!("working directory {}: {errno}", s.cwd), true),
        x if x == Step::Identity as u8 => (format!("uid {uid} / gid {gid} in this sandbox: {errno}"), true),
        _ => (format!("{}: {errno}", chosen[0]), errno.kind() == std::io::ErrorKind::NotFound),
    })
}

/// The child of [`spawn`]: never returns.
///
/// # Safety
/// Must run in the child of a fork of a single-threaded process; every
/// pointer must point into data that lived across the fork.
#[allow(clippy::too_many_arguments)]
unsafe fn child(
    io: &[RawFd; 3],
    cwd: &CString,
    uid: u32,
    gid: u32,
    progs: &[CString],
    argv: &[*const libc::c_char],
    env: &[*const libc::c_char],
    err: RawFd,
) -> ! {
    // SAFETY: the caller guarantees we are the child of a fork of a
    // single-threaded process; everything below is a plain syscall on
    // integers or on data that lived across the fork, then exec or _exit.
    unsafe {
        let fail = |step: Step| -> ! {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0).to_ne_bytes();
            let msg = [step as u8, errno[0], errno[1], errno[2], errno[3]];
            libc::write(err, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        };
        // Signals as a fresh process has them: nothing blocked, nothing ignored.
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for sig in [libc::SIGPIPE, libc::SIGINT, libc::SIGQUIT, libc::SIGCHLD] {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::setsid();
        for (i, fd) in io.iter().enumerate() {
            libc::dup2(*fd, i as i32);
        }
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
        // As the agent's commands (crate::spawn): the usual RLIMIT_MEMLOCK, nice 0,
        // the memory cgroup's victims before the agent.
        let lim = libc::rlimit { rlim_cur: 8 << 20, rlim_max: 8 << 20 };
        libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        libc::setpriority(libc::PRIO_PROCESS, 0, 0);
        let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, b"500".as_ptr().cast(), 3);
            libc::close(fd);
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            fail(Step::Chdir);
        }
        let groups = [gid];
        // Refused where the user namespace denies setgroups; the gid below still applies.
        libc::setgroups(1, groups.as_ptr());
        if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            fail(Step::Identity);
        }
        let mut last = libc::ENOENT;
        for p in progs {
            libc::execve(p.as_ptr(), argv.as_ptr(), env.as_ptr());
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOENT);
            // As execvp: a missing file tries the next entry, anything else is the answer.
            if e != libc::ENOENT && e != libc::ENOTDIR {
                last = e;
                break;
            }
        }
        *libc::__errno_location() = last;
        fail(Step::Exec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_looked_up_on_the_path_of_the_environment() {
        let env = vec!["HOME=/root".to_string(), "PATH=/opt/bin::/usr/bin".to_string()];
        let c: Vec<_> = candidates("bash", &env).iter().map(|c| c.to_string_lossy().into_owned()).collect();
        assert_eq!(c, ["/opt/bin/bash", "/usr/bin/bash"]);
        let c = candidates("/bin/sh", &env);
        assert_eq!(c.len(), 1);
        assert_eq!(candidates("sh", &[]).len(), DEFAULT_PATH.split(':').count());
    }
}

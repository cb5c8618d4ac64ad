//! The isolator: the sandbox's one process that may build namespaces.
//!
//! Forked before the sandbox drops its privileges (ns: by the sandbox's
//! init, which execs it as `pvisor-agent --isolator`; vm: by the guest agent
//! before it drops its own), it keeps Docker's default capabilities plus
//! `CAP_SYS_ADMIN` (namespaces, mounts) and `CAP_NET_ADMIN` (a session's
//! loopback), installs the isolator filter (the sandbox filter with those
//! namespaces and the mount syscalls a session's layout needs let through)
//! and is not dumpable: a sandbox process, holding fewer capabilities, can
//! neither trace it nor open its `/proc` entries. It serves the agent alone,
//! over a socketpair no sandbox process holds, one request at a time:
//!
//! * `Create`: clones the session's init into new pid, mount, ipc and uts
//!   namespaces (and a network namespace unless it shares the sandbox's),
//!   with the session's directory of persistent uppers on the sandbox's disk;
//!   the init builds the session and reports to the agent itself;
//! * `Destroy`: kills the session's init (the kernel kills its pid namespace
//!   with it) and removes its uppers;
//! * `Probe`: builds a throwaway session (namespaces, tmpfs, overlay, proc)
//!   to tell whether sessions can be built here.
//!
//! A session's init that ends for any other reason is reaped and cleaned up
//! the same way. When the agent's end closes, the isolator kills every
//! session and exits.
use super::wire::{self, Received};
use pvisor_proto::isolator::{isolator_reply, isolator_request, Create, Created, Done, Failed};
use pvisor_proto::isolator::{IsolatorReply, IsolatorRequest};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// The capabilities the isolator keeps: the sandbox's, plus what building a
/// session takes. Its children drop back to the sandbox's.
fn keep() -> caps::CapsHashSet {
    let mut keep: caps::CapsHashSet = pvisor_seccomp::privileges::SANDBOX_CAPS.into_iter().collect();
    keep.insert(caps::Capability::CAP_SYS_ADMIN);
    keep.insert(caps::Capability::CAP_NET_ADMIN);
    keep
}

fn harden() -> Result<(), String> {
    use caps::CapSet;
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("prctl(PR_SET_DUMPABLE): {e}"))?;
    let keep = keep();
    for cap in caps::all() {
        if !keep.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| format!("drop {cap}: {e}"))?;
        }
    }
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        let cur = caps::read(None, set).map_err(|e| format!("read caps: {e}"))?;
        caps::set(None, set, &cur.intersection(&keep).cloned().collect()).map_err(|e| format!("set caps: {e}"))?;
    }
    let filter = pvisor_seccomp::isolator_filter().map_err(|e| format!("seccomp: {e}"))?;
    pvisor_seccomp::apply_to_thread(&filter).map_err(|e| format!("seccomp: {e}"))
}

/// Runs the isolator on `sock` (its end of the agent's socketpair) with
/// `uppers`, a directory on the sandbox's disk for persistent uppers. Never returns.
pub fn main(sock: OwnedFd, uppers: Option<OwnedFd>) -> ! {
    if let Err(e) = harden() {
        eprintln!("pvisor isolator: {e}");
        std::process::exit(1);
    }
    let mut iso = Isolator { sock, uppers, sessions: HashMap::new() };
    iso.serve();
    iso.kill_all();
    std::process::exit(0)
}

/// Namespaces of a session.
fn clone_flags(share_net: bool) -> libc::c_ulong {
    let mut f = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    if !share_net {
        f |= libc::CLONE_NEWNET;
    }
    f as libc::c_ulong
}

/// Forks into new namespaces like fork(2) (the child continues on a copy of
/// the stack); returns the child's pid, or 0 in the child.
fn clone_into(flags: libc::c_ulong) -> std::io::Result<i32> {
    // SAFETY: raw clone(2) without CLONE_VM and with a null stack is fork(2)
    // with namespace flags; the isolator is single-threaded, so the child is
    // a consistent copy of it.
    let r = unsafe {
        libc::syscall(libc::SYS_clone, flags | libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as i32)
}

/// A session id is a UUID: it names a directory, so nothing else gets in.
fn valid_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

struct Session {
    pid: i32,
}

struct Isolator {
    sock: OwnedFd,
    uppers: Option<OwnedFd>,
    sessions: HashMap<String, Session>,
}

fn reply(kind: isolator_reply::Kind) -> IsolatorReply {
    IsolatorReply { kind: Some(kind) }
}

fn failed(message: String, invalid: bool) -> IsolatorReply {
    reply(isolator_reply::Kind::Failed(Failed { message, invalid }))
}

impl Isolator {
    fn serve(&mut self) {
        use nix::sys::signal::{SigSet, SigmaskHow, Signal};
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        if nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).is_err() {
            return;
        }
        let Ok(sfd) = nix::sys::signalfd::SignalFd::with_flags(&mask, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC) else {
            return;
        };
        loop {
            let mut fds = [
                nix::poll::PollFd::new(self.sock.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(sfd.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
            let (req_ready, sig_ready) = (fds[0].any().unwrap_or(false), fds[1].any().unwrap_or(false));
            if sig_ready {
                let _ = sfd.read_signal();
                self.reap();
            }
            if req_ready {
                let (req, fds) = match wire::recv::<IsolatorRequest>(&self.sock) {
                    Ok(Received::Message(r, fds)) => (r, fds),
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        let _ = wire::send(&self.sock, &failed(format!("bad request: {e}"), true), &[]);
                        continue;
                    }
                    Ok(Received::Closed) | Err(_) => return,
                };
                let answer = match req.kind {
                    Some(isolator_request::Kind::Create(c)) => self.create(c, fds, sfd.as_raw_fd()),
                    Some(isolator_request::Kind::Destroy(d)) => self.destroy(&d.id),
                    Some(isolator_request::Kind::Probe(_)) => self.probe(sfd.as_raw_fd()),
                    None => failed("empty request".into(), true),
                };
                if wire::send(&self.sock, &answer, &[]).is_err() {
                    return;
                }
            }
        }
    }

    /// The fds a child must not keep: the agent's socket, the uppers root, the signalfd.
    fn close_in_child(&self, sfd: RawFd) {
        let mut fds = vec![self.sock.as_raw_fd(), sfd];
        fds.extend(self.uppers.as_ref().map(|u| u.as_raw_fd()));
        for fd in fds {
            // SAFETY: in the child of a fork, closing the child's copies of
            // fds the parent keeps; the child never touches them again (it
            // exits without running destructors).
            unsafe {
                libc::close(fd);
            }
        }
    }

    fn create(&mut self, c: Create, mut fds: Vec<OwnedFd>, sfd: RawFd) -> IsolatorReply {
        if !valid_id(&c.id) || self.sessions.contains_key(&c.id) {
            return failed(format!("bad session id {:?}", c.id), true);
        }
        let (Some(layout), 1) = (c.layout, fds.len()) else {
            return failed("create needs a layout and the init's socket".into(), true);
        };
        let ctl = fds.remove(0);
        // The session's directory of persistent uppers (its init finds it
        // under the sandbox's /dev, see super::layout).
        if let (Some(root), true) = (&self.uppers, layout.overlays.iter().any(|m| m.persist)) {
            if let Err(e) = make_dir(root, &c.id) {
                return failed(format!("create the session's uppers: {e}"), false);
            }
        }
        match clone_into(clone_flags(layout.share_net)) {
            Err(e) => {
                self.remove_dir(&c.id);
                failed(format!("clone the session's init: {e}"), false)
            }
            Ok(0) => {
                self.close_in_child(sfd);
                super::init::main(&layout, ctl, &c.id)
            }
            Ok(pid) => {
                self.sessions.insert(c.id, Session { pid });
                reply(isolator_reply::Kind::Created(Created { pid }))
            }
        }
    }

    fn destroy(&mut self, id: &str) -> IsolatorReply {
        if let Some(s) = self.sessions.remove(id) {
            let pid = nix::unistd::Pid::from_raw(s.pid);
            // Killing a pid namespace's init kills everything in it; the wait
            // returns once they are all gone.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
            self.remove_dir(id);
        }
        reply(isolator_reply::Kind::Done(Done {}))
    }

    /// Reaps session inits that ended on their own and removes their uppers.
    fn reap(&mut self) {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        loop {
            let pid = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, _)) | Ok(WaitStatus::Signaled(pid, _, _)) => pid.as_raw(),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            let gone: Vec<String> =
                self.sessions.iter().filter(|(_, s)| s.pid == pid).map(|(id, _)| id.clone()).collect();
            for id in gone {
                self.sessions.remove(&id);
                self.remove_dir(&id);
            }
        }
    }

    fn remove_dir(&self, id: &str) {
        let (Some(root), Ok(name)) = (&self.uppers, CString::new(id)) else { return };
        match pvisor_fstree::remove_tree_at(root.as_fd(), &name, id) {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => eprintln!("pvisor isolator: remove the uppers of session {id}: {e}"),
        }
    }

    fn kill_all(&mut self) {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for id in ids {
            self.destroy(&id);
        }
    }

    fn probe(&mut self, sfd: RawFd) -> IsolatorReply {
        let (rd, wr) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => return failed(format!("pipe: {e}"), false),
        };
        match clone_into(clone_flags(false)) {
            Err(e) => failed(format!("clone into new namespaces: {e}"), false),
            Ok(0) => {
                self.close_in_child(sfd);
                drop(rd);
                let code = match super::layout::probe() {
                    Ok(()) => 0,
                    Err(e) => {
                        let _ = nix::unistd::write(&wr, e.message.as_bytes());
                        1
                    }
                };
                // SAFETY: _exit ends the probe child without running the
                // isolator's handlers or destructors.
                unsafe { libc::_exit(code) }
            }
            Ok(pid) => {
                drop(wr);
                let mut msg = Vec::new();
                let mut buf = [0u8; 512];
                while let Ok(n) = nix::unistd::read(rd.as_raw_fd(), &mut buf) {
                    if n == 0 {
                        break;
                    }
                    msg.extend_from_slice(&buf[..n]);
                }
                let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                match status {
                    Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => reply(isolator_reply::Kind::Done(Done {})),
                    _ if !msg.is_empty() => failed(String::from_utf8_lossy(&msg).into_owned(), false),
                    other => failed(format!("the probe ended with {other:?}"), false),
                }
            }
        }
    }
}

/// Makes `<root>/<name>` (0700).
fn make_dir(root: &OwnedFd, name: &str) -> std::io::Result<()> {
    let c = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: mkdirat reads a NUL-terminated name relative to an fd we own.
    if unsafe { libc::mkdirat(root.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuids() {
        assert!(valid_id("0b6e4a70-3c9c-4c1a-9f8e-1d2c3b4a5f60"));
        for bad in ["", "../etc", "0b6e4a70-3c9c-4c1a-9f8e-1d2c3b4a5f6/", "x".repeat(36).as_str()] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_isolator_keeps_sys_admin_and_net_admin_only_beyond_the_sandbox() {
        let k = keep();
        assert!(k.contains(&caps::Capability::CAP_SYS_ADMIN) && k.contains(&caps::Capability::CAP_NET_ADMIN));
        assert!(!k.contains(&caps::Capability::CAP_SYS_PTRACE) && !k.contains(&caps::Capability::CAP_SYS_MODULE));
        assert_eq!(k.len(), pvisor_seccomp::privileges::SANDBOX_CAPS.len() + 2);
    }
}

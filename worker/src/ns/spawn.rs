//! The worker side of starting an ns sandbox.
use super::init::{self, InitArgs, InitVolumes, AGENT_FD};
use super::volumes;
use crate::config::{Common, IdMap, NsConfig};
use crate::error::{Result, WorkerError};
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

const STACK_SIZE: usize = 512 * 1024;

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| WorkerError::Start(format!("argument contains NUL: {s:?}")))
}

fn mkdir_owned(p: &Path, ids: &IdMap) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| WorkerError::sys(format!("mkdir {}", p.display()), e))?;
    if ids.count > 1 {
        std::os::unix::fs::chown(p, Some(ids.uid_base), Some(ids.gid_base))
            .map_err(|e| WorkerError::sys(format!("chown {}", p.display()), e))?;
    }
    Ok(())
}

fn write_id_maps(pid: i32, ids: &IdMap) -> Result<()> {
    let proc_file = |f: &str| format!("/proc/{pid}/{f}");
    if ids.count == 1 {
        // Unprivileged: setgroups must be denied before an unprivileged gid_map.
        fs::write(proc_file("setgroups"), "deny").map_err(|e| WorkerError::sys("setgroups deny", e))?;
    }
    fs::write(proc_file("uid_map"), format!("0 {} {}\n", ids.uid_base, ids.count))
        .map_err(|e| WorkerError::sys("uid_map", e))?;
    fs::write(proc_file("gid_map"), format!("0 {} {}\n", ids.gid_base, ids.count))
        .map_err(|e| WorkerError::sys("gid_map", e))?;
    Ok(())
}

/// Idmaps the detached volume trees through the child's user namespace, so
/// host ids appear as the same ids inside (sandbox root owns what host root
/// owns). Where the filesystem cannot be idmapped, the volume is mounted as
/// is: host files then appear with the overflow id to the sandbox and are
/// writable only where their mode lets "others" write.
fn idmap_volumes(pid: i32, trees: &[volumes::Detached]) -> Result<()> {
    if trees.is_empty() {
        return Ok(());
    }
    let userns: OwnedFd = fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(|e| WorkerError::sys("open the sandbox's user namespace", e))?
        .into();
    for t in trees {
        if let Err(e) = volumes::idmap(&t.tree, &userns) {
            tracing::warn!(volume = %t.name, "volume not idmapped ({e}): host ownership applies as is");
        }
    }
    Ok(())
}

/// Everything the child wrote to the error pipe, until it closes.
fn read_to_end(fd: &OwnedFd) -> String {
    let mut msg = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = nix::unistd::read(fd.as_raw_fd(), &mut buf) {
        if n == 0 {
            break;
        }
        msg.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&msg).into_owned()
}

/// What [`start`] started.
pub struct Spawned {
    /// The init's host pid.
    pub pid: i32,
    /// The worker's end of the agent's connection socket.
    pub connections: OwnedFd,
    /// With `net`: the tap `eth0` the init created in the sandbox's network namespace.
    pub tap: Option<OwnedFd>,
    /// The writer that keeps the sandbox's `/proc/meminfo` current.
    pub meminfo: super::meminfo::Live,
}

/// Clones the sandbox init and waits until it has exec'd the agent. With
/// `net`, the init creates the sandbox's tap first and sends it here.
pub fn start(common: &Common, ns: &NsConfig, net: bool) -> Result<Spawned> {
    let ids: IdMap = ns.ids.ok_or_else(|| WorkerError::Config("ns: ids missing".into()))?.into();
    let state_dir = Path::new(&ns.state_dir);
    let agent_path = Path::new(&ns.agent_path);
    if ns.image_root.is_empty() || ns.state_dir.is_empty() || ns.agent_path.is_empty() {
        return Err(WorkerError::Config("ns: image_root, state_dir and agent_path are required".into()));
    }
    // The writable layer: on the sandbox's own disk where the broker bounds
    // it (a root worker, in a mount namespace of its own from here on),
    // else in the state dir.
    let layer_dir = match ns.disk_template.as_str() {
        "" => state_dir.to_path_buf(),
        t => super::disk::own(state_dir, Path::new(t), common.disk_ahead.as_ref())?,
    };
    let upper = layer_dir.join("upper");
    let work = layer_dir.join("work");
    for d in [&upper, &work] {
        mkdir_owned(d, &ids)?;
    }
    // Isolated sessions' persistent uppers, on the sandbox's own disk (its
    // bound counts them). Only there: the directory is bound (covered) into
    // the sandbox, and a host file system's would show its host path in
    // /proc/self/mountinfo; without a disk they live on the sessions' tmpfs.
    let isolated = match ns.disk_template.is_empty() {
        true => None,
        false => {
            let d = layer_dir.join("isolated");
            mkdir_owned(&d, &ids)?;
            Some(d)
        }
    };
    let (proc_files, meminfo) = super::procfs::write(state_dir, &common.limits, common.cgroup.clone())?;
    let (tmp_size, shm_size) = super::mounts::tmpfs_sizes(common.limits.memory_bytes, common.limits.disk_bytes);

    // Datagram-like (SEQPACKET): one message per connection, each carrying
    // one stream socket for the agent to serve.
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| WorkerError::sys("socketpair", e))?;
    let (go_rd, go_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| WorkerError::sys("pipe", e))?;
    let (err_rd, err_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| WorkerError::sys("pipe", e))?;
    let link = match net {
        true => Some(
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| WorkerError::sys("socketpair", e))?,
        ),
        false => None,
    };
    let (link_ours, link_theirs) = link.unzip();
    let agent_exe: OwnedFd = fs::File::open(agent_path)
        .map_err(|e| WorkerError::sys(format!("open agent {}", agent_path.display()), e))?
        .into();
    // A root worker detaches the volumes here (cloning mounts of its own
    // namespace needs its CAP_SYS_ADMIN) so it can idmap them once the
    // child's user namespace exists; an unprivileged one leaves it to the init.
    let privileged = ids.count > 1;
    let init_volumes = match privileged {
        true => InitVolumes::Detached(
            ns.volumes
                .iter()
                .map(volumes::detach)
                .collect::<std::result::Result<_, _>>()
                .map_err(WorkerError::Start)?,
        ),
        false => InitVolumes::Pending(ns.volumes.clone()),
    };
    let args = InitArgs {
        go: go_rd,
        err: err_wr,
        agent_sock: theirs,
        agent_exe,
        lower: ns.image_root.clone().into(),
        upper,
        work,
        isolated,
        tmp_on_root: ns.tmp_on_root,
        hostname: common.hostname.clone(),
        link_sock: link_theirs,
        argv: vec![cstr("pvisor-agent")?, cstr("--fd")?, cstr(&AGENT_FD.to_string())?],
        // The configuration arrives over the first connection (Agent.Configure).
        env: vec![cstr("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")?],
        volumes: init_volumes,
        tmp_size,
        shm_size,
        proc_files,
        memory_merge: ns.memory_merge,
    };
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    let mut stack = vec![0u8; STACK_SIZE];
    // The user namespace's owner: a uid of this sandbox's own (super::owner).
    let owner = super::owner::owner_uid(std::process::id());
    let pid = super::owner::as_owner(owner, || {
        // SAFETY: the worker is single-threaded here (no runtime or helper
        // thread has been started), so the child's copy of the address space
        // is consistent; the child only runs `child_main`, which execs or exits.
        unsafe { nix::sched::clone(Box::new(|| init::child_main(&args)), &mut stack, flags, Some(libc::SIGCHLD)) }
            .map_err(|e| WorkerError::sys("clone", e))
    })?;
    let InitArgs { go, err, agent_sock, link_sock, volumes: our_volumes, .. } = args;
    drop((go, err, agent_sock, link_sock));
    let pid = pid.as_raw();
    let t = std::time::Instant::now();
    let release = || -> Result<()> {
        write_id_maps(pid, &ids)?;
        if let InitVolumes::Detached(trees) = &our_volumes {
            idmap_volumes(pid, trees)?;
        }
        // No cgroup move: the child inherited the worker's `sandbox` leaf.
        // OOM score, nice and RLIMIT_MEMLOCK come from the worker
        // (harden::protect_worker, before the clone).
        nix::unistd::write(&go_wr, b"1").map_err(|e| WorkerError::sys("release sandbox", e))?;
        Ok(())
    };
    if let Err(e) = release() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        // The child may have failed first (and that is why releasing it did):
        // its own message is the better reason.
        let msg = read_to_end(&err_rd);
        return Err(if msg.is_empty() { e } else { WorkerError::Start(msg) });
    }
    drop(go_wr);
    tracing::debug!(release = ?t.elapsed(), "sandbox init released");
    // The error pipe is close-on-exec: EOF without data means the agent runs.
    let msg = read_to_end(&err_rd);
    if !msg.is_empty() {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(WorkerError::Start(msg));
    }
    tracing::debug!(exec = ?t.elapsed(), "agent exec'd");
    // Sent before the exec, so it is queued on the socket by now.
    let tap = match &link_ours {
        Some(sock) => {
            let (tap, times) = super::link::receive(sock).map_err(|e| {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
                WorkerError::Start(e)
            })?;
            tracing::debug!(
                sysctl_us = times.sysctl_us,
                tap_us = times.tap_us,
                address_us = times.address_us,
                route_us = times.route_us,
                "the init's link set-up"
            );
            Some(tap)
        }
        None => None,
    };
    Ok(Spawned { pid, connections: ours, tap, meminfo })
}

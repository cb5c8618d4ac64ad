//! The QEMU TCG test engine (`PVISOR_VM_ENGINE=qemu-tcg`), and the same under KVM
//! (`qemu-kvm`: the yardstick the benchmarks measure the project's own VMM against).
//!
//! On hosts without hardware virtualization no Linux guest boots under the
//! project's own VMM, so for tests the worker starts `qemu-system-x86_64 -M
//! microvm` under TCG (no `-enable-kvm`) with the guest kernel and initramfs,
//! and serves the guest's virtio-blk, virtio-vsock and (with a network)
//! virtio-net devices itself as vhost-user back-ends: the same device models as behind its own
//! virtio-mmio transport. Guest memory is a memfd QEMU shares with the
//! back-ends. The guest's serial console is QEMU's stdout, kept by the
//! worker in a bounded log. This engine exists for testing; its timings are
//! not performance figures.
//!
//! **Snapshots** ([`Sandbox::snapshot`]): the worker drives QEMU over QMP
//! ([`super::qmp`], a socket beside the others): `stop` (vCPUs stop, QEMU
//! stops the vhost-user devices, so the back-ends are idle), then `migrate`
//! to a file: the machine's state with guest RAM; the scratch disk is copied
//! while the vCPUs are still stopped, as the guest left it; then `cont`. A restore ([`VmConfig::restore`]) starts QEMU with the
//! same devices and kernel command line and `-incoming file:…`; QEMU loads
//! the state (and stays paused, as the source was when it was saved) and the
//! worker's `cont` runs it on. It needs a QEMU whose vhost-user-vsock device
//! migrates (upstream marks it unmigratable: `scripts/common.sh` builds
//! QEMU 10.0.2 with `scripts/qemu/`'s patch, `PVISOR_QEMU`), `file:`
//! migration (QEMU 8.2 and later) and the back-ends' `VHOST_F_LOG_ALL` and
//! LOG_SHMFD (see `pvisor_vmm`'s vhost-user back-end).
use super::cmdline::{cmdline, AGENT_PORT};
use super::console::Console;
use super::disks;
use super::net;
use super::qmp::Qmp;
use crate::backend::{Sandbox, SandboxExit, SnapshotFiles, SnapshotTaken};
use crate::config::{VmConfig, VmEngine};
use crate::error::{Result, WorkerError};
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pvisor_vmm::devices::virtio::block::Block;
use pvisor_vmm::devices::virtio::vhost_user;
use pvisor_vmm::devices::virtio::vsock::{Vsock, VsockHandle};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest Unix socket path.
const SUN_PATH_MAX: usize = 107;

/// How long a QMP command may take (QEMU answers at once but under load).
const QMP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long writing a snapshot's state may take.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(300);

pub struct QemuSandbox {
    pid: i32,
    vsock: VsockHandle,
    console: Console,
    /// Until when a refused agent connection means "still booting".
    boot_deadline: Instant,
    /// The guest kernel command line (a restore's is its source's).
    cmdline: String,
    /// The scratch disk's file (a snapshot copies it).
    scratch: PathBuf,
    qmp_path: PathBuf,
    /// The QMP connection (QEMU serves one client), once a snapshot or a restore opened it.
    qmp: Mutex<Option<Qmp>>,
    /// Keeps the sockets' directory fd (if any) open: `qmp_path` may name it.
    _sockets: SocketDir,
}

/// Where the sockets are named: the sandbox's directory itself, or, when it
/// lies too deep for a socket path (108 bytes), `/proc/self/fd/N` of an fd to
/// it that QEMU inherits at the same number (the worker and QEMU then name
/// the same directory by the same short path).
struct SocketDir {
    base: PathBuf,
    /// The directory's fd when `base` is its `/proc/self/fd` path; open as long as the sandbox.
    _fd: Option<OwnedFd>,
}

/// The longest name [`SocketDir::path`] is asked for.
const LONGEST_SOCKET: &str = "vu-scratch.sock";

impl SocketDir {
    fn new(dir: &Path) -> Result<SocketDir> {
        if dir.join(LONGEST_SOCKET).as_os_str().len() <= SUN_PATH_MAX {
            return Ok(SocketDir { base: dir.to_path_buf(), _fd: None });
        }
        // No O_CLOEXEC: QEMU inherits it.
        let fd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, nix::sys::stat::Mode::empty())
            .map_err(|e| WorkerError::Start(format!("open {}: {e}", dir.display())))?;
        // SAFETY: open returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SocketDir { base: PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())), _fd: Some(fd) })
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        let p = self.base.join(name);
        if p.as_os_str().len() > SUN_PATH_MAX {
            return Err(WorkerError::Start(format!("socket path {} is too long", p.display())));
        }
        Ok(p)
    }
}

fn vhost_err(what: &str) -> impl Fn(vhost_user::Error) -> WorkerError + '_ {
    move |e| WorkerError::Start(format!("{what}: {e}"))
}

/// Starts the back-ends, then QEMU. `dir` holds the sockets. `net_end`: the
/// device's end of the network link, when the sandbox has one.
pub fn start(
    vm: &VmConfig,
    hostname: &str,
    dir: &Path,
    boot_timeout: Duration,
    net_end: Option<OwnedFd>,
) -> Result<QemuSandbox> {
    let root_disk = vm.root_disk.as_ref().ok_or_else(|| WorkerError::Config("vm: root_disk missing".into()))?;
    let root = disks::open_root(root_disk)?;
    let scratch = disks::open_scratch(&vm.scratch_disk)?;
    let sockets = SocketDir::new(dir)?;
    let socket_path = |name: &str| sockets.path(name);
    let vsock = Vsock::new(u64::from(vm.guest_cid), Some(socket_path("vsock.sock")?))
        .map_err(|e| WorkerError::Start(format!("vsock: {e}")))?;
    let handle = vsock.handle();
    let root_sock = socket_path("vu-root.sock")?;
    let scratch_sock = socket_path("vu-scratch.sock")?;
    let vsock_sock = socket_path("vu-vsock.sock")?;
    let qmp_path = socket_path("qmp.sock")?;
    // Each server runs on its own thread until QEMU disconnects; they are
    // detached: the worker ends with its sandbox.
    std::mem::forget(
        vhost_user::serve("vu-root", Block::new(root, disks::ROOT_ID), &root_sock).map_err(vhost_err("root disk"))?,
    );
    std::mem::forget(
        vhost_user::serve("vu-scratch", Block::new(scratch, disks::SCRATCH_ID), &scratch_sock)
            .map_err(vhost_err("scratch disk"))?,
    );
    std::mem::forget(vhost_user::serve("vu-vsock", vsock, &vsock_sock).map_err(vhost_err("vsock"))?);
    let net_sock = match net_end {
        Some(end) => {
            let sock = socket_path("vu-net.sock")?;
            let server = vhost_user::net::serve_net("vu-net", net::device(end)?, &sock).map_err(vhost_err("net"))?;
            std::mem::forget(server);
            Some(sock)
        }
        None => None,
    };

    let mem = format!("{}M", vm.memory_mib);
    // A restore boots nothing: its command line is its source's, so the
    // machine matches the state it loads.
    let cmdline = match &vm.restore {
        Some(r) => r.cmdline.clone(),
        None => cmdline(vm, hostname, net_sock.is_some()),
    };
    let chardev = |id: &str, p: &Path| format!("socket,id={id},path={}", p.display());
    let mut cmd = Command::new(qemu_binary());
    // TCG: a bounded translation cache (QEMU's default reserves 1 GiB), charged to the
    // sandbox's group with the guest's memory. KVM (the benchmarks' yardstick): the host's CPU.
    let (accel, cpu) = match VmEngine::try_from(vm.engine) {
        Ok(VmEngine::QemuKvm) => ("kvm", "host"),
        _ => ("tcg,tb-size=64", "max"),
    };
    cmd.args(["-accel", accel, "-M", "microvm,acpi=off,memory-backend=mem", "-object"])
        .arg(format!("memory-backend-memfd,id=mem,size={mem},share=on"))
        .args(["-m", &mem, "-cpu", cpu, "-smp", &vm.vcpus.max(1).to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio"])
        .args(["-no-reboot", "-kernel", &vm.kernel, "-initrd", &vm.initramfs, "-append", &cmdline])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp_path.display()))
        // The image first, then the scratch disk: vda and vdb in the guest.
        .args(["-chardev", &chardev("root", &root_sock), "-device", "vhost-user-blk,chardev=root,num-queues=1"])
        .args(["-chardev", &chardev("scratch", &scratch_sock)])
        .args(["-device", "vhost-user-blk,chardev=scratch,num-queues=1"])
        .args(["-chardev", &chardev("vs", &vsock_sock), "-device", "vhost-user-vsock-device,chardev=vs"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(sock) = &net_sock {
        // QEMU keeps the device's config (MAC, MTU) and would add a control
        // queue; the props make the guest see the model as under KVM.
        let device = format!(
            "virtio-net-device,netdev=net0,mac={},host_mtu={},{}",
            net::mac_string(),
            net::MTU,
            vhost_user::net::QEMU_DEVICE_PROPS
        );
        cmd.args(["-chardev", &chardev("net", sock), "-netdev", "vhost-user,id=net0,chardev=net", "-device", &device]);
    }
    if let Some(r) = &vm.restore {
        cmd.arg("-incoming").arg(format!("file:{}", r.state_file));
    }
    // QEMU jails itself (its seccomp sandbox) and dies with the worker.
    cmd.args(["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
    // SAFETY: runs in the forked child before exec; prctl takes integers only.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let console = Console::open(Path::new(&vm.console_log))?;
    // QEMU's own messages go to the worker's log (its stderr).
    let mut child = cmd.spawn().map_err(|e| WorkerError::sys("start qemu-system-x86_64", e))?;
    if let Some(out) = child.stdout.take() {
        console.follow(out);
    }
    let pid = child.id() as i32;
    // Reaped by `wait`, not by the Child.
    std::mem::forget(child);
    let mut qmp = None;
    if vm.restore.is_some() {
        // The state was saved from a stopped machine, so QEMU loads it and stays paused.
        let loaded = (|| {
            let mut q = Qmp::connect(&qmp_path, QMP_TIMEOUT)?;
            q.wait_migration(MIGRATE_TIMEOUT)?;
            q.execute("cont", None)?;
            Ok::<_, super::qmp::QmpError>(q)
        })();
        match loaded {
            Ok(q) => qmp = Some(q),
            Err(e) => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                return Err(WorkerError::Start(format!("loading the snapshot's state: {e}; {}", console.tail())));
            }
        }
    }
    Ok(QemuSandbox {
        pid,
        vsock: handle,
        console,
        boot_deadline: Instant::now() + boot_timeout,
        cmdline,
        scratch: PathBuf::from(&vm.scratch_disk),
        qmp_path,
        qmp: Mutex::new(qmp),
        _sockets: sockets,
    })
}

fn qmp_err(e: super::qmp::QmpError) -> WorkerError {
    WorkerError::Snapshot(e.to_string())
}

impl QemuSandbox {
    /// Runs `f` on the QMP connection (made on first use).
    fn with_qmp<T>(&self, f: impl FnOnce(&mut Qmp) -> Result<T>) -> Result<T> {
        let mut conn = self.qmp.lock().unwrap_or_else(PoisonError::into_inner);
        if conn.is_none() {
            *conn = Some(Qmp::connect(&self.qmp_path, QMP_TIMEOUT).map_err(qmp_err)?);
        }
        let q = conn.as_mut().expect("connected above");
        let r = f(q);
        if r.is_err() {
            // A broken connection is made again next time.
            *conn = None;
        }
        r
    }
}

fn qemu_binary() -> PathBuf {
    std::env::var_os("PVISOR_QEMU").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"))
}

impl Sandbox for QemuSandbox {
    fn backend(&self) -> &'static str {
        "vm"
    }

    fn init_pid(&self) -> i32 {
        self.pid
    }

    fn connect_agent(&self) -> Result<UnixStream> {
        super::connect_with_retry(&self.vsock, AGENT_PORT, self.boot_deadline)
    }

    /// The test engine pauses the whole QEMU process.
    fn pause(&self) -> Result<()> {
        kill(Pid::from_raw(self.pid), Signal::SIGSTOP).map_err(|e| WorkerError::sys("pause", e))
    }

    fn resume(&self) -> Result<()> {
        kill(Pid::from_raw(self.pid), Signal::SIGCONT).map_err(|e| WorkerError::sys("resume", e))
    }

    /// QEMU's migration stream holds guest RAM: `files.memory` is not made.
    fn snapshot(&self, files: &SnapshotFiles) -> Result<SnapshotTaken> {
        let uri = format!("file:{}", files.state.display());
        self.with_qmp(|q| {
            let t = Instant::now();
            q.execute("stop", None).map_err(qmp_err)?;
            let saved = (|| {
                q.execute("migrate", Some(serde_json::json!({ "uri": uri }))).map_err(qmp_err)?;
                q.wait_migration(MIGRATE_TIMEOUT).map_err(qmp_err)?;
                let bytes = std::fs::metadata(&files.state).map_err(|e| WorkerError::sys("snapshot state", e))?.len();
                // The vCPUs are stopped and QEMU has stopped the back-ends: the disk is as the guest left it.
                crate::ns::disk::copy_sparse(&self.scratch, &files.scratch)?;
                Ok(bytes)
            })();
            // Run on whatever the save did.
            let resumed = q.execute("cont", None).map_err(qmp_err);
            let state_bytes = saved?;
            resumed?;
            Ok(SnapshotTaken { cmdline: self.cmdline.clone(), state_bytes, stopped: t.elapsed() })
        })
    }

    fn kill(&self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
    }

    fn wait(&self) -> SandboxExit {
        // -no-reboot: the guest's reboot (reboot=t, panic=-1) ends QEMU with 0.
        crate::backend::wait_child(self.pid, |code| match code {
            0 => SandboxExit::GuestShutdown,
            c => SandboxExit::Failed(format!("qemu exited with code {c}")),
        })
    }

    fn console_tail(&self) -> String {
        self.console.tail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox directory deeper than a socket path can name still gets its sockets, through
    /// a short `/proc/self/fd` path a child inherits; a shallow one is named as it is.
    #[test]
    fn sockets_of_a_deep_directory_are_named_through_an_inherited_fd() {
        let d = tempfile::tempdir().unwrap();
        let shallow = SocketDir::new(d.path()).unwrap();
        assert_eq!(shallow.path("qmp.sock").unwrap(), d.path().join("qmp.sock"));
        let deep = d.path().join("x".repeat(60)).join("y".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let sockets = SocketDir::new(&deep).unwrap();
        let p = sockets.path(LONGEST_SOCKET).unwrap();
        assert!(p.starts_with("/proc/self/fd/") && p.as_os_str().len() <= SUN_PATH_MAX, "{}", p.display());
        let _listener = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert!(deep.join(LONGEST_SOCKET).exists(), "the socket is in the sandbox's directory");
        // A child (QEMU) names the same directory by the same path: the fd is inherited.
        let seen = std::process::Command::new("sh").arg("-c").arg(format!("test -S {}", p.display())).status().unwrap();
        assert!(seen.success(), "the child does not see {}", p.display());
    }
}

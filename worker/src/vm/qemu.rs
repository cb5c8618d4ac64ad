//! The QEMU TCG test engine (`PVISOR_VM_ENGINE=qemu-tcg`).
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
use super::cmdline::{cmdline, AGENT_PORT};
use super::console::Console;
use super::disks;
use super::net;
use crate::backend::{Sandbox, SandboxExit};
use crate::config::VmConfig;
use crate::error::{Result, WorkerError};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pvisor_vmm::devices::virtio::block::Block;
use pvisor_vmm::devices::virtio::vhost_user;
use pvisor_vmm::devices::virtio::vsock::{Vsock, VsockHandle};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest Unix socket path.
const SUN_PATH_MAX: usize = 107;

pub struct QemuSandbox {
    pid: i32,
    vsock: VsockHandle,
    console: Console,
    /// Until when a refused agent connection means "still booting".
    boot_deadline: Instant,
}

fn socket_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    if p.as_os_str().len() > SUN_PATH_MAX {
        return Err(WorkerError::Start(format!("socket path {} is too long", p.display())));
    }
    Ok(p)
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
    let vsock = Vsock::new(u64::from(vm.guest_cid), Some(socket_path(dir, "vsock.sock")?))
        .map_err(|e| WorkerError::Start(format!("vsock: {e}")))?;
    let handle = vsock.handle();
    let root_sock = socket_path(dir, "vu-root.sock")?;
    let scratch_sock = socket_path(dir, "vu-scratch.sock")?;
    let vsock_sock = socket_path(dir, "vu-vsock.sock")?;
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
            let sock = socket_path(dir, "vu-net.sock")?;
            let server = vhost_user::net::serve_net("vu-net", net::device(end)?, &sock).map_err(vhost_err("net"))?;
            std::mem::forget(server);
            Some(sock)
        }
        None => None,
    };

    let mem = format!("{}M", vm.memory_mib);
    let chardev = |id: &str, p: &Path| format!("socket,id={id},path={}", p.display());
    let mut cmd = Command::new(qemu_binary());
    // A bounded translation cache (QEMU's default reserves 1 GiB), charged
    // to the sandbox's group with the guest's memory.
    cmd.args(["-accel", "tcg,tb-size=64", "-M", "microvm,acpi=off,memory-backend=mem", "-object"])
        .arg(format!("memory-backend-memfd,id=mem,size={mem},share=on"))
        .args(["-m", &mem, "-cpu", "max", "-smp", &vm.vcpus.max(1).to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio"])
        .args([
            "-no-reboot",
            "-kernel",
            &vm.kernel,
            "-initrd",
            &vm.initramfs,
            "-append",
            &cmdline(vm, hostname, net_sock.is_some()),
        ])
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
    Ok(QemuSandbox { pid, vsock: handle, console, boot_deadline: Instant::now() + boot_timeout })
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

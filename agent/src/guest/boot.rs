//! The guest's boot, run by the agent as PID 1 of the microVM before any
//! thread exists: from the initramfs to the sandbox's root.
//!
//! 1. proc, sysfs, devtmpfs in the initramfs (the console, the disks);
//! 2. wait for the two disks, mount the image's erofs view read-only at
//!    /mnt/lower and the scratch ext4 at /mnt/scratch (upper/, work/ on it);
//! 3. overlay of both at /newroot, then /proc, /sys, /dev, /dev/pts,
//!    /dev/shm, /tmp inside it ([`mounts::sandbox_dirs`]), with the scratch
//!    disk's `isolated/` (isolated sessions' persistent uppers) bound under `/dev`;
//! 4. switch root the way `switch_root` does (an initramfs cannot be
//!    pivot_root'ed): chdir, move the new root onto `/`, chroot;
//! 5. hostname, `/etc/hostname` and `/etc/hosts` (as the ns backend writes
//!    them), loopback up; with `pvisor.net=1`, `eth0` configured, the default
//!    route through netd and `/etc/resolv.conf` ([`net`], [`etc`]).
//!
//! The initramfs is not emptied: its only content of size is `/init`, this
//! very binary, whose pages stay mapped while the agent runs anyway.
use super::cmdline::GuestCmdline;
use super::error::GuestError;
use super::etc;
use super::mounts::{detach, initramfs_dirs, mkdir, mount_fs, sandbox_dirs};
use super::net;
use nix::mount::{mount, MsFlags};
use std::path::Path;
use std::time::{Duration, Instant};

/// The image's read-only erofs view.
pub const LOWER: &str = "/mnt/lower";
/// The scratch disk, home of the overlay's upper and work directories.
pub const SCRATCH: &str = "/mnt/scratch";
/// Where the sandbox's root is assembled before the switch.
pub const NEWROOT: &str = "/newroot";

/// How long the disks may take to appear: virtio-blk probes before init
/// runs, so this only matters on a loaded host.
const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// Fails unless this process is PID 1: the boot remounts `/`, and the power
/// helpers end the machine.
pub fn ensure_init(step: &'static str) -> Result<(), GuestError> {
    if nix::unistd::getpid().as_raw() == 1 {
        Ok(())
    } else {
        Err(GuestError::NotInit(step))
    }
}

/// Mounts proc, sysfs and devtmpfs in the initramfs (idempotent) and gives
/// init a console if the kernel found none to open. Needed before
/// [`GuestCmdline::from_proc`].
pub fn early() -> Result<(), GuestError> {
    ensure_init("early mounts")?;
    initramfs_dirs()?;
    super::console::attach("/dev/console");
    Ok(())
}

/// Boots from the initramfs into the sandbox's root (see the module docs).
/// Returns `isolated/` on the scratch disk (O_PATH), for isolated sessions'
/// persistent uppers; the isolator keeps it, nothing in the sandbox sees it.
pub fn boot(cfg: &GuestCmdline) -> Result<std::os::fd::OwnedFd, GuestError> {
    early()?;
    let (lower, scratch, newroot) = (Path::new(LOWER), Path::new(SCRATCH), Path::new(NEWROOT));
    let root_dev = path_str(&cfg.root)?;
    let scratch_dev = path_str(&cfg.scratch)?;
    wait_for(&cfg.root, DEVICE_WAIT)?;
    wait_for(&cfg.scratch, DEVICE_WAIT)?;
    for d in [Path::new("/mnt"), lower, scratch, newroot] {
        mkdir(d)?;
    }
    mount_fs(root_dev, lower, "erofs", MsFlags::MS_RDONLY, None)?;
    mount_fs(scratch_dev, scratch, "ext4", MsFlags::MS_NOATIME, None)?;
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    mkdir(&upper)?;
    mkdir(&work)?;
    let isolated = scratch.join("isolated");
    mkdir(&isolated)?;
    let uppers = nix::fcntl::open(
        &isolated,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    // SAFETY: open(2) just returned this fd; nothing else owns it.
    .map(|fd| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    .map_err(|e| GuestError::sys(format!("open {}", isolated.display()), e))?;
    let opts = format!("lowerdir={LOWER},upperdir={},workdir={}", upper.display(), work.display());
    mount_fs("overlay", newroot, "overlay", MsFlags::empty(), Some(&opts))?;
    // The overlay holds its own references to both layers: nothing needs
    // them mounted in the initramfs any more (once `isolated/` is bound).
    detach(lower)?;
    sandbox_dirs(newroot, Some(&isolated))?;
    detach(scratch)?;
    for d in ["/proc", "/sys", "/dev"] {
        detach(Path::new(d))?;
    }
    switch_root(newroot)?;
    nix::unistd::sethostname(&cfg.hostname).map_err(|e| GuestError::sys("sethostname", e))?;
    net::loopback_up().map_err(|e| GuestError::io("loopback up", e))?;
    if cfg.net {
        net::configure_eth0()?;
    }
    write_etc(&cfg.hostname, cfg.net);
    Ok(uppers)
}

/// Moves `newroot` onto `/` and makes it the root of this process.
fn switch_root(newroot: &Path) -> Result<(), GuestError> {
    std::env::set_current_dir(newroot).map_err(|e| GuestError::io(format!("chdir {}", newroot.display()), e))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| GuestError::sys(format!("move {} to /", newroot.display()), e))?;
    nix::unistd::chroot(".").map_err(|e| GuestError::sys("chroot .", e))?;
    std::env::set_current_dir("/").map_err(|e| GuestError::io("chdir /", e))
}

/// Writes `/etc/hostname` and `/etc/hosts` (and, with a network,
/// `/etc/resolv.conf`) as the ns backend does. Only after the switch: the
/// image controls /etc, so no symlink in it is followed ([`etc`]). An image
/// without /etc (or with a symlinked one) is left as it is; a file that
/// cannot be written (a directory in its place) is reported on the console,
/// not fatal: the sandbox works without it.
pub(crate) fn write_etc(hostname: &str, net: bool) {
    let root = Path::new("/");
    let hosts = if net {
        pvisor_net::plan::hosts(hostname)
    } else {
        format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost {hostname}\n")
    };
    let mut files = vec![("hostname", format!("{hostname}\n")), ("hosts", hosts)];
    if net {
        files.push(("resolv.conf", pvisor_net::plan::resolv_conf()));
    }
    for (name, content) in files {
        if let Err(e) = etc::write_file(root, name, &content) {
            super::console::line(&format!("warning: {e}"));
        }
    }
}

/// Waits up to `limit` until the block device `dev` exists (devtmpfs adds it
/// when its driver has probed).
fn wait_for(dev: &Path, limit: Duration) -> Result<(), GuestError> {
    let start = Instant::now();
    while !dev.exists() {
        if start.elapsed() >= limit {
            return Err(GuestError::NoDevice {
                device: dev.display().to_string(),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn path_str(p: &Path) -> Result<&str, GuestError> {
    p.to_str().ok_or_else(|| GuestError::Cmdline { key: p.display().to_string(), reason: "not UTF-8".into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_outside_pid_1() {
        // The test runner is never PID 1: boot must not touch this host's mounts.
        let e = boot(&GuestCmdline::default()).unwrap_err();
        assert!(matches!(e, GuestError::NotInit(_)), "{e}");
        assert!(matches!(early().unwrap_err(), GuestError::NotInit(_)));
    }

    #[test]
    fn missing_device_times_out_with_its_name() {
        let e = wait_for(Path::new("/dev/pvisor-no-such-disk"), Duration::from_millis(30)).unwrap_err();
        assert!(e.to_string().starts_with("/dev/pvisor-no-such-disk: no such device after"), "{e}");
        wait_for(Path::new("/dev/null"), Duration::ZERO).unwrap();
    }
}

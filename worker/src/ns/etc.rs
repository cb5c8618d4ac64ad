//! The files pvisor writes into the sandbox's `/etc`: `hostname`, `hosts`
//! and, with a network, `resolv.conf`.
//!
//! They are written after `pivot_root`, with the old root detached, but the
//! image still controls what `/etc/<name>` is: a symlink (Debian's
//! resolv.conf often is one), even one meant to reach out of the root
//! through `/proc/self/fd/N` or a host path. So nothing here follows a
//! symlink: `/etc` is opened with `O_NOFOLLOW` (an `/etc` that is a symlink or
//! not a directory gets nothing), each file is written to a fresh temporary
//! name inside it (`O_EXCL | O_NOFOLLOW`) and renamed over the image's entry,
//! which replaces a symlink rather than writing through it.
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What to write.
pub struct EtcFiles<'a> {
    pub hostname: &'a str,
    /// Whether the sandbox has a network (eth0, netd's resolver).
    pub net: bool,
}

/// `/etc/hosts` without a network: loopback only.
fn loopback_hosts(hostname: &str) -> String {
    format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost {hostname}\n")
}

/// Writes the files into `/etc` of the current root (the sandbox's).
pub fn write(f: &EtcFiles) -> Result<(), String> {
    let Some(etc) = open_etc()? else { return Ok(()) };
    replace(&etc, "hostname", &format!("{}\n", f.hostname))?;
    if f.net {
        replace(&etc, "hosts", &pvisor_net::plan::hosts(f.hostname))?;
        replace(&etc, "resolv.conf", &pvisor_net::plan::resolv_conf())?;
    } else {
        replace(&etc, "hosts", &loopback_hosts(f.hostname))?;
    }
    Ok(())
}

/// `/etc`, created if the image has none; None when the image made it
/// something other than a directory.
fn open_etc() -> Result<Option<OwnedFd>, String> {
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    match nix::fcntl::open("/etc", flags, Mode::empty()) {
        // SAFETY: open just returned this fd and nothing else owns it.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(nix::errno::Errno::ENOENT) => {
            nix::unistd::mkdir("/etc", Mode::from_bits_truncate(0o755)).map_err(|e| format!("mkdir /etc: {e}"))?;
            open_etc()
        }
        // A symlink (ELOOP) or a file (ENOTDIR): the image's business.
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => Ok(None),
        Err(e) => Err(format!("open /etc: {e}")),
    }
}

/// Replaces `etc/name` by a regular file holding `content`, never following
/// what the image put at that name.
fn replace(etc: &OwnedFd, name: &str, content: &str) -> Result<(), String> {
    let tmp = format!(".pvisor-{name}.new");
    let dir = Some(etc.as_raw_fd());
    let err = |what: &str, e: nix::errno::Errno| format!("/etc/{name}: {what}: {e}");
    // Whatever the image left at the temporary name goes (unlinkat removes
    // a symlink itself; a directory there makes the open below fail).
    let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, tmp.as_str(), flags, Mode::from_bits_truncate(0o644)).map_err(|e| err("create", e))?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut &file, content.as_bytes()).map_err(|e| format!("/etc/{name}: write: {e}"))?;
    drop(file);
    renameat(dir, tmp.as_str(), dir, name).map_err(|e| err("rename", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_names_the_sandbox() {
        assert_eq!(loopback_hosts("sb"), "127.0.0.1\tlocalhost sb\n::1\tlocalhost ip6-localhost sb\n");
    }
}

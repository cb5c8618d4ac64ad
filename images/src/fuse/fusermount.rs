//! Mounting through the setuid `fusermount3` helper, for a server that is not
//! root: `/dev/fuse` is often root-only, and mount(2) of FUSE needs
//! `CAP_SYS_ADMIN` anyway. The helper opens `/dev/fuse`, mounts, and passes
//! the fd back over a socket (`_FUSE_COMMFD`, SCM_RIGHTS), as libfuse does.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// The helper's name (found on `PATH`, as libfuse does).
const FUSERMOUNT: &str = "fusermount3";

/// Mounts `mountpoint` with `options` (as `-o` takes them) and returns the
/// `/dev/fuse` fd of the new mount.
pub fn mount(mountpoint: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o").arg(options).arg("--").arg(mountpoint);
    cmd.env("_FUSE_COMMFD", fd.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: runs in the forked child before exec; only fcntl on an fd the
    // parent keeps open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("{FUSERMOUNT}: {e}")))?;
    drop(theirs);
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    match received {
        Ok(fd) if out.status.success() => Ok(fd),
        _ => Err(io::Error::other(format!(
            "{FUSERMOUNT} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The one fd the helper sends.
fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(std::os::fd::RawFd);
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: the kernel just installed this fd in our table for us.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no fd received from fusermount3"))
}

//! File operations as another identity (execd's `/v1/filesystem/{uid}/{gid}/...`).
//!
//! The broker names the identity in the request's gRPC metadata
//! ([`METADATA_KEY`], `uid:gid`); a request without it runs as the agent.
//! The work runs on a thread of its own whose filesystem ids
//! (`setfsuid`/`setfsgid`) and supplementary groups are those of the
//! identity, so every permission check the kernel makes (search on each
//! directory, read, write, create, chmod, chown) is that user's. Moving the
//! filesystem uid away from 0 drops the filesystem capabilities
//! (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_CHOWN`, ...) from the thread's
//! effective set, so root's overrides do not leak into the operation. New
//! files get the identity as owner.
//!
//! Credentials are per thread in the kernel, but glibc broadcasts
//! `setgroups` to every thread of the process: the calls below are raw
//! syscalls, made on a thread that ends with the operation, so no other
//! work of the agent ever runs with these ids.
use crate::error::AgentError;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// The metadata key carrying `uid:gid`.
pub const METADATA_KEY: &str = "x-pvisor-identity";

/// The metadata key naming an isolated session: the file call runs inside
/// its root, as its identity (execd's `/v1/isolated/session/{id}/files/...`).
pub const SESSION_KEY: &str = "x-pvisor-isolated-session";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// Parses `uid:gid` (decimal; `u32::MAX`, the kernel's "no change", is refused).
    pub fn parse(s: &str) -> Result<Identity, AgentError> {
        let bad = || AgentError::InvalidArgument(format!("invalid identity {s:?}: want uid:gid"));
        let (u, g) = s.split_once(':').ok_or_else(bad)?;
        let id = |v: &str| v.parse::<u32>().ok().filter(|n| *n != u32::MAX).ok_or_else(bad);
        Ok(Identity { uid: id(u)?, gid: id(g)? })
    }

    /// The identity a request names, if any.
    pub fn from_metadata(m: &MetadataMap) -> Result<Option<Identity>, Status> {
        let Some(v) = m.get(METADATA_KEY) else { return Ok(None) };
        let s = v.to_str().map_err(|_| Status::invalid_argument(format!("{METADATA_KEY} is not text")))?;
        Ok(Some(Identity::parse(s)?))
    }

    /// Takes this identity for the filesystem on the calling thread. The
    /// thread must not be reused for other work afterwards.
    fn assume(self) -> Result<(), AgentError> {
        let denied = |what: &str, e: std::io::Error| {
            AgentError::io(
                format!("identity {}:{}", self.uid, self.gid),
                std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{what}: {e} (is the id mapped in this sandbox?)"),
                ),
            )
        };
        let groups = [self.gid as libc::gid_t];
        // SAFETY: raw setgroups on this thread only (glibc's wrapper would change
        // every thread); the pointer and length describe `groups`, which lives
        // across the call.
        let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // A user namespace with setgroups denied: acceptable only if this
            // thread holds no supplementary groups that could grant access.
            // SAFETY: getgroups with size 0 only returns the count; no buffer is written.
            let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
            if n != 0 {
                return Err(denied("setgroups", e));
            }
        }
        // setfsgid/setfsuid return the previous id and report no error: read
        // the id back (an invalid id, -1, changes nothing and returns the current one).
        // SAFETY: plain integer syscalls changing this thread's filesystem ids.
        let gid_now = unsafe {
            libc::syscall(libc::SYS_setfsgid, self.gid);
            libc::syscall(libc::SYS_setfsgid, u32::MAX)
        };
        if gid_now != self.gid as libc::c_long {
            return Err(denied("setfsgid", std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        // SAFETY: as above.
        let uid_now = unsafe {
            libc::syscall(libc::SYS_setfsuid, self.uid);
            libc::syscall(libc::SYS_setfsuid, u32::MAX)
        };
        if uid_now != self.uid as libc::c_long {
            return Err(denied("setfsuid", std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        Ok(())
    }
}

/// Where and as whom file work runs: the agent's root or an isolated
/// session's (`root`), as the agent or another identity (`who`).
#[derive(Clone, Default)]
pub struct Scope {
    pub who: Option<Identity>,
    pub root: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// Makes `root` the calling thread's root (and cwd): the thread leaves the
/// filesystem context it shares with the process first (`unshare(CLONE_FS)`),
/// so nothing else of the agent moves. Paths then resolve inside that root,
/// `..` and symlinks included, with the mounts of the namespace it belongs to.
fn enter(root: &std::os::fd::OwnedFd) -> Result<(), AgentError> {
    use std::os::fd::AsRawFd;
    let err = |what: &str, e: nix::errno::Errno| AgentError::io(format!("enter the session's root ({what})"), e.into());
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).map_err(|e| err("unshare", e))?;
    nix::unistd::fchdir(root.as_raw_fd()).map_err(|e| err("fchdir", e))?;
    nix::unistd::chroot(".").map_err(|e| err("chroot", e))?;
    nix::unistd::chdir("/").map_err(|e| err("chdir", e))
}

impl Scope {
    /// Runs blocking file work in this scope: on the runtime's blocking pool
    /// for the agent itself, else on a thread of its own that takes the root
    /// and identity and ends with the work.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
    ) -> Result<T, Status> {
        let Some(root) = self.root.clone() else {
            return blocking_as(self.who, f).await;
        };
        let who = self.who;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("isolated-files".into())
            .spawn(move || {
                let r = enter(&root).and_then(|()| who.map_or(Ok(()), Identity::assume)).and_then(|()| f());
                let _ = tx.send(r);
            })
            .map_err(|e| Status::resource_exhausted(format!("file thread: {e}")))?;
        rx.await.map_err(|_| Status::internal("file thread ended without an answer"))?.map_err(Status::from)
    }
}

/// Runs blocking file work, as `who` when given (on a thread of its own),
/// else on the runtime's blocking pool with the agent's identity.
pub async fn blocking_as<T: Send + 'static>(
    who: Option<Identity>,
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, Status> {
    let Some(who) = who else {
        return tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::from);
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("as-{}", who.uid))
        .spawn(move || {
            let r = who.assume().and_then(|()| f());
            let _ = tx.send(r);
        })
        .map_err(|e| Status::resource_exhausted(format!("identity thread: {e}")))?;
    rx.await.map_err(|_| Status::internal("identity thread ended without an answer"))?.map_err(Status::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uid_gid() {
        assert_eq!(Identity::parse("1000:100").unwrap(), Identity { uid: 1000, gid: 100 });
        for bad in ["", "1000", "a:b", "1:", ":1", "-1:0", "4294967295:0", "1:2:3"] {
            assert!(Identity::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Root on the host (CI): a thread as 65534 cannot read a 0600 root file,
    /// and creates files owned by 65534; the rest of the process stays root.
    #[tokio::test]
    async fn operations_run_with_the_identity() {
        if !pvisor_testkit::require_root("setfsuid to another user") {
            return;
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = Identity { uid: 65534, gid: 65534 };
        let s = secret.clone();
        let err = blocking_as(Some(nobody), move || std::fs::read(&s).map_err(|e| AgentError::io("secret", e)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        let made = dir.path().join("made");
        let m = made.clone();
        blocking_as(Some(nobody), move || std::fs::write(&m, "y").map_err(|e| AgentError::io("made", e)))
            .await
            .unwrap();
        let md = std::fs::metadata(&made).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534));
        // The calling side still reads what root may read.
        assert_eq!(std::fs::read(&secret).unwrap(), b"x");
        let s = secret.clone();
        blocking_as(None, move || std::fs::read(&s).map_err(|e| AgentError::io("secret", e))).await.unwrap();
    }
}

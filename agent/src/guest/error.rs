//! Errors of the guest's boot, each naming the step that failed and its errno.
use nix::errno::Errno;
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A `pvisor.*` key on the kernel command line is unknown or its value bad.
    #[error("kernel command line: {key}: {reason}")]
    Cmdline { key: String, reason: String },
    /// A system call of a boot step failed.
    #[error("{step}: {errno}")]
    Sys { step: String, errno: Errno },
    /// An I/O error without an errno (rare: a short read, bad UTF-8).
    #[error("{step}: {source}")]
    Io { step: String, source: io::Error },
    /// A block device named on the command line did not appear in time.
    #[error("{device}: no such device after {waited_ms} ms (is the disk attached?)")]
    NoDevice { device: String, waited_ms: u64 },
    /// Guest boot steps run only as PID 1 (they remount `/`, power off the machine).
    #[error("{0}: not PID 1 (the guest boot runs only as the init of a microVM)")]
    NotInit(&'static str),
    /// Dropping the sandbox's privileges (capabilities, seccomp) failed.
    #[error("dropping privileges: {0}")]
    Harden(String),
}

impl GuestError {
    /// A failed step from an [`Errno`].
    pub fn sys(step: impl Into<String>, errno: Errno) -> Self {
        GuestError::Sys { step: step.into(), errno }
    }

    /// A failed step from an [`io::Error`]; one carrying an errno becomes [`GuestError::Sys`].
    pub fn io(step: impl Into<String>, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(raw) => GuestError::Sys { step: step.into(), errno: Errno::from_raw(raw) },
            None => GuestError::Io { step: step.into(), source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_step_and_errno() {
        let e = GuestError::io("mount erofs /dev/vda on /mnt/lower", io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(e.to_string(), "mount erofs /dev/vda on /mnt/lower: EINVAL: Invalid argument");
        let e = GuestError::io("read /proc/cmdline", io::Error::new(io::ErrorKind::InvalidData, "bad utf-8"));
        assert_eq!(e.to_string(), "read /proc/cmdline: bad utf-8");
    }
}

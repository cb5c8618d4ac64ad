//! What the sandbox's `/proc` says about the machine: `/proc/meminfo` shows
//! the sandbox's memory limit and its cgroup's usage, not the host's RAM
//! (super::meminfo), and `/proc/cmdline` a neutral line, not the host's
//! kernel command line.
//!
//! The worker writes both files into the state dir (outside the sandbox's
//! file systems, owned by host root, which no sandbox maps, mode 0444); the
//! init opens them before it changes identity and bind-mounts them read-only
//! over the fresh `/proc`'s entries. The sandbox cannot change them: it does
//! not own them, the binds are read-only, and its seccomp filter refuses
//! `mount` and `umount2`. The worker keeps the write end it created
//! `proc-meminfo` with (a 0444 file is writable through the descriptor
//! that created it) and keeps it current (super::meminfo::Live).
use super::meminfo::{render, Live, Usage};
use crate::cgroup::GroupPaths;
use crate::config::Limits;
use crate::error::{Result, WorkerError};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The neutral kernel command line every sandbox sees.
pub const CMDLINE: &str = "console=ttyS0 ro quiet\n";

/// A file over a `/proc` entry: (host file, entry name under /proc).
pub type ProcFile = (PathBuf, &'static str);

/// Creates `p` afresh (a stale one from an earlier start is
/// replaced) holding `text`, mode 0444; returns its write end.
fn create(p: &Path, text: &str) -> Result<File> {
    match std::fs::remove_file(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(WorkerError::sys(format!("remove {}", p.display()), e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_CLOEXEC)
        .open(p)
        .map_err(|e| WorkerError::sys(format!("create {}", p.display()), e))?;
    f.write_all(text.as_bytes()).map_err(|e| WorkerError::sys(format!("write {}", p.display()), e))?;
    // The umask may have taken bits off; 0444 exactly.
    f.set_permissions(std::fs::Permissions::from_mode(0o444))
        .map_err(|e| WorkerError::sys(format!("chmod {}", p.display()), e))?;
    Ok(f)
}

/// Writes the files into `state_dir`; returns them with their `/proc`
/// entries, and the live writer of `meminfo`.
pub fn write(state_dir: &Path, limits: &Limits, group: Option<GroupPaths>) -> Result<(Vec<ProcFile>, Live)> {
    let meminfo_path = state_dir.join("proc-meminfo");
    let meminfo = create(&meminfo_path, &render(limits.memory_bytes, &Usage::default()))?;
    let cmdline_path = state_dir.join("proc-cmdline");
    drop(create(&cmdline_path, CMDLINE)?);
    let live = Live::new(meminfo, limits.memory_bytes, group);
    Ok((vec![(meminfo_path, "meminfo"), (cmdline_path, "cmdline")], live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn files_are_0444_and_meminfo_stays_writable_through_its_fd() {
        let dir = std::env::temp_dir().join(format!("pvisor-procfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let limits = Limits { cpu_millis: 1000, memory_bytes: 256 << 20, pids: 64, disk_bytes: 0 };
        let (files, live) = write(&dir, &limits, None).unwrap();
        assert_eq!(files.iter().map(|(_, n)| *n).collect::<Vec<_>>(), ["meminfo", "cmdline"]);
        for (p, _) in &files {
            assert_eq!(std::fs::metadata(p).unwrap().mode() & 0o7777, 0o444, "{}", p.display());
        }
        assert!(std::fs::read_to_string(&files[0].0).unwrap().starts_with("MemTotal:         262144 kB\n"));
        // No group: refresh leaves the start-up view.
        live.refresh().unwrap();
        // A second start over the same dir replaces the files.
        let (again, _) = write(&dir, &limits, None).unwrap();
        assert_eq!(std::fs::read_to_string(&again[1].0).unwrap(), CMDLINE);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

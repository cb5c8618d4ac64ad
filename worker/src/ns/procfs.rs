//! What the sandbox's `/proc` says about the machine: `/proc/meminfo` shows
//! the sandbox's memory limit, not the host's RAM, and `/proc/cmdline` a
//! neutral line, not the host's kernel command line.
//!
//! The worker writes both files into the state dir (outside the sandbox's
//! file systems, owned by host root, which no sandbox maps, mode 0444); the
//! init opens them before it changes identity and bind-mounts them read-only
//! over the fresh `/proc`'s entries. The sandbox cannot change them: it does
//! not own them, the binds are read-only, and its seccomp filter refuses
//! `mount` and `umount2`. `/proc/meminfo` is the state at start (the whole
//! limit free): `free` and runtimes sizing their heaps from it see the
//! limit, as under LXCFS-style container views.
use crate::config::Limits;
use crate::error::{Result, WorkerError};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The neutral kernel command line every sandbox sees.
pub const CMDLINE: &str = "console=ttyS0 ro quiet\n";

/// A file over a `/proc` entry: (host file, entry name under /proc).
pub type ProcFile = (PathBuf, &'static str);

/// `/proc/meminfo` for a sandbox with `memory_bytes` of memory.
pub fn meminfo(memory_bytes: u64) -> String {
    let kib = memory_bytes / 1024;
    let mut out = String::new();
    let mut line = |k: &str, v: u64| out.push_str(&format!("{:<16}{v:>8} kB\n", format!("{k}:")));
    line("MemTotal", kib);
    line("MemFree", kib);
    line("MemAvailable", kib);
    for k in ["Buffers", "Cached", "SwapCached", "Active", "Inactive", "Unevictable", "Mlocked"] {
        line(k, 0);
    }
    line("SwapTotal", 0);
    line("SwapFree", 0);
    for k in ["Dirty", "Writeback", "AnonPages", "Mapped", "Shmem", "Slab", "SReclaimable", "SUnreclaim"] {
        line(k, 0);
    }
    line("CommitLimit", kib);
    line("Committed_AS", 0);
    out
}

/// Writes the files into `state_dir`; returns them with their `/proc` entries.
pub fn write(state_dir: &Path, limits: &Limits) -> Result<Vec<ProcFile>> {
    let files = [("meminfo", meminfo(limits.memory_bytes)), ("cmdline", CMDLINE.to_string())];
    let mut out = Vec::new();
    for (name, text) in files {
        let p = state_dir.join(format!("proc-{name}"));
        std::fs::write(&p, text).map_err(|e| WorkerError::sys(format!("write {}", p.display()), e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
            .map_err(|e| WorkerError::sys(format!("chmod {}", p.display()), e))?;
        out.push((p, name));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_shows_the_limit() {
        let m = meminfo(512 << 20);
        assert!(m.starts_with("MemTotal:         524288 kB\n"), "{m}");
        assert!(m.contains("\nMemAvailable:     524288 kB\n"), "{m}");
        assert!(m.contains("\nSwapTotal:             0 kB\n"), "{m}");
    }
}

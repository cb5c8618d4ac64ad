//! Removing what sandboxes leave on the host: their state directories
//! (overlay upper, work dir, logs) and the leftovers a previous broker run
//! left in `sandboxes/` and the socket dir.
//!
//! A sandbox controls the shape of its upper directory (any depth: a tenant
//! makes 25,000 levels in a second), so the removal is `pvisor_fstree`'s
//! iterative, fd-relative one, never `std::fs::remove_dir_all` (recursive:
//! it overflowed the broker's stack and took every sandbox down). Callers
//! run it on a blocking thread. Every failure is logged with what was left.
use pvisor_fstree::{remove_tree, Removed};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// What cleaning a directory of leftovers did.
#[derive(Debug, Default)]
pub struct CleanReport {
    /// Top-level entries removed.
    pub removed: u64,
    /// Entries (at any depth) those held.
    pub entries: u64,
    /// Entries that could not be removed, with why.
    pub failed: Vec<(PathBuf, String)>,
}

/// Removes one sandbox's state directory; a missing one is not an error.
pub fn remove_state_dir(sandbox: &str, dir: &Path) -> Result<Removed, String> {
    match remove_tree(dir) {
        Ok(r) => {
            if r.max_depth > 1000 {
                tracing::info!(sandbox, entries = r.entries, depth = r.max_depth, "removed a deep sandbox tree");
            }
            Ok(r)
        }
        Err(e) if e.is_not_found() => Ok(Removed::default()),
        Err(e) => {
            tracing::error!(sandbox, "removing {}: {e}", dir.display());
            Err(e.to_string())
        }
    }
}

/// Removes everything inside `dir` (created if missing) but the entries
/// named in `keep` (those of re-adopted sandboxes), entry by entry: one
/// entry that cannot go does not keep the others, and each failure is
/// logged and reported.
pub fn clean_dir(dir: &Path, keep: &HashSet<String>) -> Result<CleanReport, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut report = CleanReport::default();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                tracing::error!("listing {}: {err}", dir.display());
                report.failed.push((dir.to_path_buf(), err.to_string()));
                break;
            }
        };
        if keep.contains(e.file_name().to_string_lossy().as_ref()) {
            continue;
        }
        let path = e.path();
        match remove_tree(&path) {
            Ok(r) => {
                report.removed += 1;
                report.entries += r.entries;
            }
            Err(err) if err.is_not_found() => {}
            Err(err) => {
                tracing::error!("start-up cleanup: cannot remove {}: {err}", path.display());
                report.failed.push((path, err.to_string()));
            }
        }
    }
    if report.removed > 0 || !report.failed.is_empty() {
        tracing::info!(
            dir = %dir.display(),
            removed = report.removed,
            entries = report.entries,
            failed = report.failed.len(),
            "start-up cleanup of a previous run's leftovers"
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// `levels` nested `d` directories under `top`, made fd-relative.
    fn deep(top: &Path, levels: usize) {
        use nix::fcntl::{open, openat, OFlag};
        use nix::sys::stat::{mkdirat, Mode};
        std::fs::create_dir_all(top).expect("mkdir");
        let raw = open(top, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).expect("open");
        // SAFETY: open just returned this fd and nothing else owns it.
        let mut fd = unsafe { OwnedFd::from_raw_fd(raw) };
        for _ in 0..levels {
            mkdirat(Some(fd.as_raw_fd()), c"d", Mode::from_bits_truncate(0o755)).expect("mkdirat");
            let raw = openat(Some(fd.as_raw_fd()), c"d", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
                .expect("openat");
            // SAFETY: openat just returned this fd and nothing else owns it.
            fd = unsafe { OwnedFd::from_raw_fd(raw) };
        }
    }

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("tempdir")
    }

    #[test]
    fn leftovers_go_deep_trees_included_and_failures_are_reported() {
        let d = scratch();
        let dir = d.path().join("sandboxes");
        deep(&dir.join("sbx-deep/upper"), 30_000);
        std::fs::write(dir.join("stray-file"), "x").expect("write");
        std::os::unix::fs::symlink("/etc", dir.join("link-out")).expect("symlink");
        let report = clean_dir(&dir, &HashSet::new()).expect("clean");
        assert_eq!(report.removed, 3);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(std::fs::read_dir(&dir).expect("ls").count(), 0);
        assert!(Path::new("/etc/passwd").exists(), "the symlink's target untouched");
    }

    #[test]
    fn a_failure_is_reported_and_the_rest_still_goes() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (it mounts a tmpfs)");
        let d = scratch();
        let dir = d.path().join("sandboxes");
        let mnt = dir.join("stuck/mnt");
        std::fs::create_dir_all(&mnt).expect("mkdir");
        deep(&dir.join("other"), 100);
        nix::mount::mount(Some("tmpfs"), &mnt, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
            .expect("mount");
        let report = clean_dir(&dir, &HashSet::new());
        let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
        let report = report.expect("clean");
        assert_eq!(report.removed, 1, "the other entry went");
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].1.contains("mount point"), "{:?}", report.failed);
        assert!(!dir.join("other").exists());
    }

    #[test]
    fn a_missing_state_dir_is_fine() {
        let d = scratch();
        assert_eq!(remove_state_dir("s", &d.path().join("gone")).expect("ok"), Removed::default());
    }
}

//! Kernel same-page merging (KSM) of a sandbox's processes (issue 13).
//!
//! With `NsConfig.memory_merge` the sandbox's init opts its address space
//! into KSM with `prctl(PR_SET_MEMORY_MERGE, 1)` just before it execs the
//! agent. The kernel keeps that flag on the process (`MMF_VM_MERGE_ANY`)
//! across `execve` and copies it at `fork`, so every process the sandbox ever
//! starts is mergeable without any cooperation from the image; ksmd then
//! merges their anonymous pages with identical pages of any other mergeable
//! process on the host (other sandboxes of the same image, mostly). Whether
//! ksmd runs is the host's setting (`/sys/kernel/mm/ksm/run`), which the
//! broker turns on where it may (`broker/src/sandbox/ksm.rs`).
//!
//! What a sandbox gains is read here from the host's `/proc/<pid>/` of
//! every process of its cgroup group, not from anything inside the
//! sandbox: `ksm_merging_pages` (its pages currently backed by a merged
//! page) and `ksm_process_profit` in `ksm_stat` (bytes saved minus the
//! bookkeeping KSM spends on the process).
use std::path::Path;

/// A group's KSM counters, summed over its processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KsmCounts {
    /// Pages of the group backed by a page KSM merged.
    pub merging_pages: u64,
    /// Bytes saved minus KSM's own per-page bookkeeping (may be negative).
    pub profit_bytes: i64,
}

/// Opts the calling process (and, by inheritance, everything it execs and
/// forks) into KSM. Fails where the kernel lacks `PR_SET_MEMORY_MERGE` (< 6.4).
pub fn merge_this_process() -> std::io::Result<()> {
    // SAFETY: PR_SET_MEMORY_MERGE takes an integer flag and no pointers; it
    // only sets a flag on this process's mm and marks its existing VMAs.
    let r = unsafe { libc::prctl(libc::PR_SET_MEMORY_MERGE, 1 as libc::c_ulong, 0, 0, 0) };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// One process's counters from its `/proc/<pid>` directory; a process that
/// has exited meanwhile (or a kernel without KSM) counts as zero.
fn process_counts(proc_dir: &Path) -> KsmCounts {
    let merging_pages = std::fs::read_to_string(proc_dir.join("ksm_merging_pages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let profit_bytes =
        std::fs::read_to_string(proc_dir.join("ksm_stat")).ok().and_then(|s| parse_profit(&s)).unwrap_or(0);
    KsmCounts { merging_pages, profit_bytes }
}

/// `ksm_process_profit N` from a `ksm_stat` text.
fn parse_profit(stat: &str) -> Option<i64> {
    stat.lines().find_map(|l| l.strip_prefix("ksm_process_profit ").and_then(|v| v.trim().parse().ok()))
}

/// The counters of `pids` (host pids), summed.
pub fn counts(pids: &[i32]) -> KsmCounts {
    pids.iter().fold(KsmCounts::default(), |acc, pid| {
        let c = process_counts(&Path::new("/proc").join(pid.to_string()));
        KsmCounts {
            merging_pages: acc.merging_pages + c.merging_pages,
            profit_bytes: acc.profit_bytes.saturating_add(c.profit_bytes),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profit_is_read_from_ksm_stat() {
        let stat =
            "ksm_rmap_items 3\nksm_zero_pages 0\nksm_merging_pages 2\nksm_process_profit -120\nksm_merge_any: yes\n";
        assert_eq!(parse_profit(stat), Some(-120));
        assert_eq!(parse_profit("ksm_rmap_items 3\n"), None);
    }

    #[test]
    fn the_flag_shows_in_ksm_stat() {
        // Only this test process becomes mergeable (harmless: ksmd may or may not run).
        if let Err(e) = merge_this_process() {
            return pvisor_testkit::skip(format!("PR_SET_MEMORY_MERGE: {e}"));
        }
        let stat = std::fs::read_to_string("/proc/self/ksm_stat").unwrap_or_default();
        assert!(stat.contains("ksm_merge_any: yes"), "{stat}");
    }

    #[test]
    fn gone_processes_count_as_zero() {
        assert_eq!(counts(&[i32::MAX]), KsmCounts::default());
    }
}

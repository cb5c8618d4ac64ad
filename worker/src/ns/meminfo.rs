//! The sandbox's live `/proc/meminfo`: its memory limit as `MemTotal`, and
//! free, available, cached, anonymous ... memory as its cgroup group
//! charges them now (`memory.usage_in_bytes`/`memory.current` and
//! `memory.stat`), so `free`, `top` and runtimes that size heaps from
//! `MemAvailable` see the sandbox, not the host.
//!
//! The file the sandbox reads is a regular file of the state dir that the
//! init bind-mounts read-only over `/proc/meminfo` (super::procfs); the
//! bind pins its inode, so it cannot be replaced by a rename. The worker
//! keeps the write end it created the file with and rewrites it in place
//! about once a second ([`Live::refresh`]), under these rules:
//!
//! * **one `pwrite` of the whole file at offset 0, always the same length.**
//!   Every value is right-aligned in a field as wide as `MemTotal` needs (at
//!   least 8 digits, as the kernel prints) and clamped to `MemTotal`, so
//!   every rewrite has exactly the length and the line layout of the first:
//!   the file never shrinks or grows, no reader sees it truncated or with a
//!   line cut short, and `read` returns the same byte count every time.
//! * The page cache does not serialise a buffered `read` against a
//!   concurrent `write` of the same page, so a read that overlaps the one
//!   ~1 KiB copy of a rewrite (a window of well under a microsecond once a
//!   second) can return the digits of some fields from before and others
//!   from after it; each field is then one of the two values or, within a
//!   single field, a mix of their digits. The layout stays valid either way.
//!   A view that can never mix would need a file the worker serves itself
//!   (FUSE, as LXCFS does): a process per sandbox and a round trip per read,
//!   for a number that is a sample anyway.
//!
//! Without a memory cgroup the file stays what [`render`] makes of an empty
//! group (the whole limit free). `sysinfo(2)` is a system call, not a file:
//! it still reports the host's RAM, so tools that take totals from it
//! (busybox `free`) show the host's total and free memory (and only
//! `available` and `buff/cache` from this file), as under LXCFS.
use crate::cgroup::GroupPaths;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// What the group's counters say, in bytes (zero where a key is missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub charged: u64,
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
    pub mapped: u64,
    pub active_anon: u64,
    pub inactive_anon: u64,
    pub active_file: u64,
    pub inactive_file: u64,
    pub unevictable: u64,
    pub dirty: u64,
    pub writeback: u64,
    pub slab_reclaimable: u64,
    pub slab_unreclaimable: u64,
}

impl Usage {
    /// From the charged total and a `memory.stat` (v2 names, or v1's with
    /// `total_` stripped; see [`GroupPaths::memory_stat`]).
    pub fn from_stat(charged: u64, stat: &BTreeMap<String, u64>) -> Usage {
        let get = |keys: &[&str]| keys.iter().find_map(|k| stat.get(*k).copied()).unwrap_or(0);
        Usage {
            charged,
            anon: get(&["anon", "rss"]),
            file: get(&["file", "cache"]),
            shmem: get(&["shmem"]),
            mapped: get(&["file_mapped", "mapped_file"]),
            active_anon: get(&["active_anon"]),
            inactive_anon: get(&["inactive_anon"]),
            active_file: get(&["active_file"]),
            inactive_file: get(&["inactive_file"]),
            unevictable: get(&["unevictable"]),
            dirty: get(&["file_dirty", "dirty"]),
            writeback: get(&["file_writeback", "writeback"]),
            slab_reclaimable: get(&["slab_reclaimable"]),
            slab_unreclaimable: get(&["slab_unreclaimable"]),
        }
    }
}

/// `/proc/meminfo` for a sandbox with `total` bytes of memory of which the
/// group charges `u`. Same length for any `u` (see the module doc).
pub fn render(total: u64, u: &Usage) -> String {
    let total_kib = total / 1024;
    let width = total_kib.to_string().len().max(8);
    let kib = |b: u64| (b / 1024).min(total_kib);
    let free = total.saturating_sub(u.charged);
    let reclaimable = u.active_file + u.inactive_file + u.slab_reclaimable;
    let rows = [
        ("MemTotal", total_kib),
        ("MemFree", kib(free)),
        ("MemAvailable", kib(free.saturating_add(reclaimable))),
        ("Buffers", 0),
        ("Cached", kib(u.file)),
        ("SwapCached", 0),
        ("Active", kib(u.active_anon + u.active_file)),
        ("Inactive", kib(u.inactive_anon + u.inactive_file)),
        ("Unevictable", kib(u.unevictable)),
        ("Mlocked", kib(u.unevictable)),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Dirty", kib(u.dirty)),
        ("Writeback", kib(u.writeback)),
        ("AnonPages", kib(u.anon)),
        ("Mapped", kib(u.mapped)),
        ("Shmem", kib(u.shmem)),
        ("Slab", kib(u.slab_reclaimable + u.slab_unreclaimable)),
        ("SReclaimable", kib(u.slab_reclaimable)),
        ("SUnreclaim", kib(u.slab_unreclaimable)),
        ("CommitLimit", total_kib),
        ("Committed_AS", kib(u.anon + u.shmem)),
    ];
    let mut out = String::with_capacity(rows.len() * (width + 20));
    for (k, v) in rows {
        out.push_str(&format!("{:<16}{v:>width$} kB\n", format!("{k}:")));
    }
    out
}

/// The write end of a sandbox's meminfo file.
pub struct Live {
    file: File,
    total: u64,
    group: Option<GroupPaths>,
    len: usize,
}

impl Live {
    /// `file` holds [`render`]`(total, empty)` already (its length is kept).
    pub fn new(file: File, total: u64, group: Option<GroupPaths>) -> Live {
        let len = render(total, &Usage::default()).len();
        Live { file, total, group, len }
    }

    /// Rewrites the file from the group's counters now (nothing without a
    /// memory cgroup). Errors are the caller's to log.
    pub fn refresh(&self) -> std::io::Result<()> {
        let Some(g) = &self.group else { return Ok(()) };
        let Some(charged) = g.memory_usage() else { return Ok(()) };
        let usage = Usage::from_stat(charged, &g.memory_stat().unwrap_or_default());
        let text = render(self.total, &usage);
        if text.len() != self.len {
            return Err(std::io::Error::other(format!("meminfo length {} != {}", text.len(), self.len)));
        }
        match self.file.write_at(text.as_bytes(), 0)? {
            n if n == text.len() => Ok(()),
            n => Err(std::io::Error::other(format!("short meminfo write: {n} of {}", text.len()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_group_shows_the_limit_free() {
        let m = render(512 << 20, &Usage::default());
        assert!(m.starts_with("MemTotal:         524288 kB\n"), "{m}");
        assert!(m.contains("\nMemFree:          524288 kB\n"), "{m}");
        assert!(m.contains("\nMemAvailable:     524288 kB\n"), "{m}");
        assert!(m.contains("\nSwapTotal:             0 kB\n"), "{m}");
    }

    #[test]
    fn usage_moves_free_and_keeps_the_length() {
        let total = 512u64 << 20;
        let stat: BTreeMap<String, u64> =
            [("rss", 100u64 << 20), ("cache", 30 << 20), ("inactive_file", 20 << 20), ("shmem", 5 << 20)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        let u = Usage::from_stat(140 << 20, &stat);
        let m = render(total, &u);
        assert!(m.contains("\nMemFree:          380928 kB\n"), "{m}");
        assert!(m.contains("\nMemAvailable:     401408 kB\n"), "{m}");
        assert!(m.contains("\nAnonPages:        102400 kB\n"), "{m}");
        assert!(m.contains("\nCached:            30720 kB\n"), "{m}");
        assert_eq!(m.len(), render(total, &Usage::default()).len());
        // Over the limit (the worker's own pages, a racing sample): clamped, same length.
        let over = Usage { charged: 2 * total, anon: 3 * total, ..Usage::default() };
        let o = render(total, &over);
        assert!(o.contains("\nMemFree:               0 kB\n"), "{o}");
        assert_eq!(o.len(), m.len());
    }

    #[test]
    fn wide_limits_widen_every_field() {
        let total = 256u64 << 30; // 268435456 kB: 9 digits
        let m = render(total, &Usage::default());
        assert!(m.starts_with("MemTotal:       268435456 kB\n"), "{m}");
        assert!(m.contains("\nBuffers:                0 kB\n"), "{m}");
        let busy = Usage { charged: 1 << 20, ..Usage::default() };
        assert_eq!(render(total, &busy).len(), m.len());
    }
}

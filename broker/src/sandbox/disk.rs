//! The disk bound of ns sandboxes: one empty ext4 image per bound size,
//! made once and cached, which each sandbox's worker copies (sparsely) and
//! loop-mounts as the file system of its writable layer
//! (`pvisor_worker::ns::disk`).
//!
//! Why a file system per sandbox rather than project quotas on one shared
//! XFS (or ext4) file system: quotas would cost nothing per create, but the
//! kernels these hosts run have neither `CONFIG_XFS_QUOTA` nor
//! `CONFIG_QFMT_V2` (ext4's quota), so no project quota can be enforced;
//! and ext4 project quotas answer EDQUOT, not ENOSPC. A tmpfs upper would
//! bound the layer by memory, not disk. A per-sandbox ext4 answers ENOSPC,
//! `df` reports its size, it is never shared, and the kernel drops it with
//! the last process of the sandbox (it is mounted only in the worker's and
//! the sandbox's mount namespaces). Per create it costs a copy of the
//! template's metadata (~230 KiB for 10 GiB) and a loop attach and mount
//! (~10 ms here).
//!
//! Only a root broker can do this (loop devices, mounting ext4). An
//! unprivileged one bounds `/tmp` and `/dev/shm` (tmpfs sized from the
//! sandbox's limits) and nothing else: the writable layer is then limited
//! by the host file system's free space, and a create that asks for
//! `ephemeral-storage` is refused.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// `--disk-limit`'s default: room for package installs and build trees.
pub const DEFAULT_LIMIT: &str = "10Gi";
/// Largest bound a create may ask for.
pub const MAX_LIMIT: u64 = 1 << 40;

/// The server's disk bounding.
pub struct Disks {
    /// A sandbox's bound when its create names none (0: none).
    pub default_bytes: u64,
    /// Where templates are made, or why this server cannot bound disks.
    templates: Result<Templates, String>,
}

struct Templates {
    dir: PathBuf,
    /// Held while a template is made, so two creates do not both make it.
    making: Mutex<()>,
    /// Largest bound: the host file system's size (and [`MAX_LIMIT`]).
    max_bytes: u64,
}

/// Why this host cannot give ns sandboxes their own disk, if it cannot.
fn unsupported() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("an unprivileged broker cannot attach loop devices or mount ext4".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control (loop devices)".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.split_whitespace().last() == Some("ext4")) {
        return Some("the kernel has no ext4".into());
    }
    None
}

/// Total size of the file system holding `dir`.
fn fs_size(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks() as u64 * st.fragment_size() as u64)
}

impl Disks {
    /// A server without disk bounds, and why.
    pub fn disabled(why: impl Into<String>) -> Disks {
        Disks { default_bytes: 0, templates: Err(why.into()) }
    }

    /// Sets up templates in `dir` (`<data>/disk`) with `default_bytes` as
    /// the server's bound (0: disabled) and makes the default template now,
    /// so the first create does not pay for it and a host that cannot make
    /// one is known at start.
    pub fn new(dir: &Path, default_bytes: u64) -> Disks {
        if default_bytes == 0 {
            return Disks::disabled("disabled by --disk-limit 0");
        }
        if let Some(why) = unsupported() {
            return Disks::disabled(why);
        }
        if let Err(e) = crate::server::secure_dirs(&[dir]) {
            return Disks::disabled(e);
        }
        let max_bytes = fs_size(dir).unwrap_or(MAX_LIMIT).min(MAX_LIMIT);
        let t = Templates { dir: dir.to_path_buf(), making: Mutex::new(()), max_bytes };
        if default_bytes > max_bytes {
            return Disks::disabled(format!(
                "--disk-limit {default_bytes} is larger than the data dir's file system ({max_bytes} bytes)"
            ));
        }
        match t.template(default_bytes) {
            Ok(_) => Disks { default_bytes, templates: Ok(t) },
            Err(e) => Disks::disabled(e),
        }
    }

    /// The largest bound a create may ask for, or `None` where this server
    /// cannot bound a sandbox's disk.
    pub fn max_bytes(&self) -> Option<u64> {
        self.templates.as_ref().ok().map(|t| t.max_bytes)
    }

    /// Why disks are not bounded, if they are not.
    pub fn unavailable(&self) -> Option<&str> {
        self.templates.as_ref().err().map(String::as_str)
    }

    /// The template for a sandbox bound of `bytes` (made now if new), or
    /// `None` for no bound.
    pub fn template(&self, bytes: u64) -> Result<Option<PathBuf>, String> {
        match (&self.templates, bytes) {
            (_, 0) | (Err(_), _) => Ok(None),
            (Ok(t), b) => t.template(b).map(Some),
        }
    }
}

/// Bounds are rounded up to whole 4 KiB blocks.
fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(4096)
}

impl Templates {
    fn template(&self, bytes: u64) -> Result<PathBuf, String> {
        let n = blocks(bytes);
        let path = self.dir.join(format!("ext4-{n}.img"));
        if path.is_file() {
            return Ok(path);
        }
        let _g = self.making.lock().unwrap_or_else(|e| e.into_inner());
        if path.is_file() {
            return Ok(path);
        }
        let tmp = self.dir.join(format!("ext4-{n}.img.tmp"));
        let _ = std::fs::remove_file(&tmp);
        make_ext4(&tmp, n).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(bytes, template = %path.display(), "disk template made");
        Ok(path)
    }
}

/// An empty ext4 of `blocks` 4 KiB blocks in a new sparse file: no journal
/// (scratch data that does not outlive a host restart; no journal writes
/// doubling the sandbox's I/O), no reserved blocks (the sandbox gets its
/// whole bound), no blocks reserved for growing it (never resized), lazily
/// initialised inode tables: ~230 KiB of metadata for 10 GiB, which is what
/// each create copies.
fn make_ext4(path: &Path, blocks: u64) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(blocks * 4096).map_err(|e| format!("{}: {e}", path.display()))?;
    drop(f);
    let out = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-m",
            "0",
            "-O",
            "^has_journal,^resize_inode",
            "-E",
            "lazy_itable_init=1,nodiscard",
        ])
        .arg(path)
        .output()
        .map_err(|e| format!("mkfs.ext4 (install e2fsprogs): {e}"))?;
    if !out.status.success() {
        return Err(format!("mkfs.ext4 {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// The overlay upper of a sandbox, as the broker (in the host's mount
/// namespace) can read it: in the state dir, or, on the sandbox's own disk,
/// through its worker's mount namespace (`/proc/<worker>/root`; the worker
/// is the parent of the sandbox's init, found among `pids`).
pub fn upper_dir(state_dir: &Path, pids: &[i32]) -> Option<PathBuf> {
    use pvisor_worker::ns::disk::{IMAGE, MOUNT};
    if !state_dir.join(IMAGE).exists() {
        return Some(state_dir.join("upper"));
    }
    let abs = std::path::absolute(state_dir).ok()?;
    let worker = pids.iter().find_map(|pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let nspid = status.lines().find(|l| l.starts_with("NSpid:"))?;
        let fields: Vec<&str> = nspid.split_whitespace().skip(1).collect();
        if fields.len() < 2 || fields.last() != Some(&"1") {
            return None;
        }
        let ppid = status.lines().find(|l| l.starts_with("PPid:"))?;
        ppid.split_whitespace().nth(1)?.parse::<i32>().ok()
    })?;
    let rel = abs.strip_prefix("/").ok()?;
    Some(PathBuf::from(format!("/proc/{worker}/root")).join(rel).join(MOUNT).join("upper"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_servers_give_no_template() {
        let d = Disks::disabled("test");
        assert_eq!(d.max_bytes(), None);
        assert_eq!(d.template(1 << 30).unwrap(), None);
        assert_eq!(d.unavailable(), Some("test"));
    }

    #[test]
    fn state_dir_upper_without_a_disk() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(upper_dir(d.path(), &[]), Some(d.path().join("upper")));
    }

    /// Needs root, loop devices and mkfs.ext4, as every host of this project has.
    #[test]
    fn templates_are_made_once_per_size() {
        assert_eq!(unsupported(), None, "this test needs root, loop devices and ext4");
        let d = tempfile::tempdir().unwrap();
        let disks = Disks::new(d.path(), 64 << 20);
        assert_eq!(disks.unavailable(), None);
        let a = disks.template(64 << 20).unwrap().unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 64 << 20);
        let b = disks.template(32 << 20).unwrap().unwrap();
        assert_ne!(a, b);
        assert_eq!(disks.template(0).unwrap(), None);
    }
}

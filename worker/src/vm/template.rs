//! The template store of the own-VMM engine: one VM snapshot per (kernel, initramfs, image,
//! shape), taken once the guest's agent is ready, from which later creates restore.
//!
//! ```text
//! <data>/templates/<key>/state     the snapshot's state file (pvisor_vmm::snapshot::format)
//! <data>/templates/<key>/memory    its memory file, mapped MAP_PRIVATE by every clone
//! <data>/templates/<key>/scratch   the scratch disk as the template's guest left it (each
//!                                  clone starts from a copy: the guest's ext4 state refers to it)
//! <data>/templates/<key>/meta.json what the key was made of, and when the template was last used
//! <data>/templates/.staging-*      a template being written (renamed into place when complete)
//! ```
//!
//! **Invalidation.** The key ([`TemplateKey`]) is a SHA-256 over the identity of the kernel and
//! initramfs files (path, device, inode, size, modification time: a rebuilt file is another
//! file, without hashing 20 MB on every create), the image id (content-addressed by the pool)
//! and the shape (vCPUs, memory, network or not, the command line's extra part). Anything that
//! changes yields another key; the old template is never looked up again and [`TemplateStore::gc`]
//! removes it: an entry whose recorded kernel or initramfs no longer has the recorded identity,
//! one unused for longer than the caller's bound, or a staging directory left by a crash.
//!
//! **What is not wired yet** (why [`super::kvm`] does not use this store): the template's
//! per-sandbox identity (hostname, the agent's keys) is on the kernel command line today and must
//! instead be handed to the agent after restore; the agent must reseed and step its clock when the
//! clone-identity generation changes; and the vsock and net devices must support snapshots
//! (a transport-reset event and host reconnection). See ARCHITECTURE.md, "VM snapshots".

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Errors of the template store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kernel or initramfs could not be looked at.
    #[error("reading the identity of {path}: {source}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The store's directory could not be read or written.
    #[error("template store {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A template's metadata did not decode.
    #[error("template metadata {path}: {source}")]
    Meta {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { what, path, source }
}

/// What identifies a file for the key: a rebuilt or replaced file differs in one of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    /// The path it was opened by.
    pub path: PathBuf,
    /// Device and inode.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
}

impl FileIdentity {
    /// The identity of the file at `path` now.
    pub fn of(path: &Path) -> Result<Self, Error> {
        let m = fs::metadata(path).map_err(|source| Error::Identity { path: path.to_owned(), source })?;
        Ok(FileIdentity {
            path: path.to_owned(),
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }

    /// Whether the file at the recorded path is still this one.
    pub fn is_current(&self) -> bool {
        FileIdentity::of(&self.path).is_ok_and(|now| now == *self)
    }
}

/// The sandbox shape a template is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Whether the guest has a network device.
    pub net: bool,
    /// The command line's extra part (tests), which the guest booted with.
    pub cmdline_extra: String,
    /// The scratch disk's size (the sandbox's disk bound).
    #[serde(default)]
    pub disk_bytes: u64,
}

/// Everything a template depends on; its [`key`](Self::key) names its directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateKey {
    /// The guest kernel.
    pub kernel: FileIdentity,
    /// The agent's initramfs.
    pub initramfs: FileIdentity,
    /// The engine that took it (`kvm`, `qemu-tcg`): one engine's snapshot is not another's.
    #[serde(default)]
    pub engine: String,
    /// The image's id in the pool.
    pub image_id: String,
    /// The shape.
    pub shape: Shape,
}

impl TemplateKey {
    /// The key of a template for these inputs.
    pub fn new(kernel: &Path, initramfs: &Path, engine: &str, image_id: &str, shape: Shape) -> Result<Self, Error> {
        Ok(TemplateKey {
            kernel: FileIdentity::of(kernel)?,
            initramfs: FileIdentity::of(initramfs)?,
            engine: engine.to_owned(),
            image_id: image_id.to_owned(),
            shape,
        })
    }

    /// The directory name: hex SHA-256 of the key's JSON (field order is fixed by the struct).
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&json).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether the kernel and initramfs are still the files the template was made from.
    pub fn is_current(&self) -> bool {
        self.kernel.is_current() && self.initramfs.is_current()
    }
}

/// A template's `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    key: TemplateKey,
    created_unix_s: u64,
    last_used_unix_s: u64,
    /// Guest RAM is a file of its own (the own VMM's `memory`); the QEMU engine's is inside
    /// `state`.
    #[serde(default = "yes")]
    memory_file: bool,
    /// The guest kernel command line the template booted with (a clone boots its engine with it).
    #[serde(default)]
    cmdline: String,
}

fn yes() -> bool {
    true
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A template found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Its directory.
    pub dir: PathBuf,
    /// Its snapshot (`state`, `memory`).
    pub snapshot: pvisor_vmm::snapshot::SnapshotPaths,
    /// The scratch disk to copy for a clone.
    pub scratch: PathBuf,
    /// The guest kernel command line it booted with.
    pub cmdline: String,
}

impl Template {
    fn at(dir: PathBuf, cmdline: String) -> Self {
        Template {
            snapshot: pvisor_vmm::snapshot::SnapshotPaths::in_dir(&dir),
            scratch: dir.join("scratch"),
            dir,
            cmdline,
        }
    }
}

/// What [`TemplateStore::gc`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Templates whose kernel or initramfs changed.
    pub stale: usize,
    /// Templates unused for longer than the bound.
    pub unused: usize,
    /// Staging directories and entries without readable metadata.
    pub broken: usize,
}

/// The template directory.
pub struct TemplateStore {
    root: PathBuf,
}

impl TemplateStore {
    /// The store at `root` (created if missing).
    pub fn open(root: &Path) -> Result<Self, Error> {
        fs::create_dir_all(root).map_err(io("creating", root))?;
        Ok(TemplateStore { root: root.to_owned() })
    }

    fn read_meta(dir: &Path) -> Result<Meta, Error> {
        let path = dir.join("meta.json");
        let bytes = fs::read(&path).map_err(io("reading", &path))?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Meta { path, source })
    }

    fn write_meta(dir: &Path, meta: &Meta) -> Result<(), Error> {
        let path = dir.join("meta.json");
        let tmp = dir.join("meta.json.tmp");
        let bytes = serde_json::to_vec_pretty(meta).map_err(|source| Error::Meta { path: path.clone(), source })?;
        fs::write(&tmp, bytes).map_err(io("writing", &tmp))?;
        fs::rename(&tmp, &path).map_err(io("renaming", &path))
    }

    /// The complete template for `key`, if there is one made from the same files; marks it used.
    pub fn get(&self, key: &TemplateKey) -> Result<Option<Template>, Error> {
        let dir = self.root.join(key.key());
        let Ok(mut meta) = Self::read_meta(&dir) else { return Ok(None) };
        if meta.key != *key || !key.is_current() {
            return Ok(None);
        }
        let template = Template::at(dir.clone(), meta.cmdline.clone());
        let memory_ok = !meta.memory_file || template.snapshot.memory.is_file();
        if !template.snapshot.state.is_file() || !memory_ok || !template.scratch.is_file() {
            return Ok(None);
        }
        meta.last_used_unix_s = now_s();
        Self::write_meta(&dir, &meta)?;
        Ok(Some(template))
    }

    /// Makes the template for `key`: `fill` writes `state`, `scratch` and (with
    /// `memory_file`) `memory` into the staging directory it is given (e.g.
    /// `Snapshotter::snapshot` and a copy of the scratch disk, or files a capture wrote,
    /// moved in); the directory is then renamed into place, so a lookup never sees half a
    /// template. If another creator won the race, its template is kept and returned.
    pub fn put<E>(
        &self,
        key: &TemplateKey,
        memory_file: bool,
        cmdline: &str,
        fill: impl FnOnce(&Template) -> Result<(), E>,
    ) -> Result<Result<Template, E>, Error> {
        let staging = self.root.join(format!(".staging-{}-{}", key.key(), std::process::id()));
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir(&staging).map_err(io("creating", &staging))?;
        if let Err(e) = fill(&Template::at(staging.clone(), cmdline.to_owned())) {
            let _ = fs::remove_dir_all(&staging);
            return Ok(Err(e));
        }
        let now = now_s();
        let meta = Meta {
            key: key.clone(),
            created_unix_s: now,
            last_used_unix_s: now,
            memory_file,
            cmdline: cmdline.to_owned(),
        };
        Self::write_meta(&staging, &meta)?;
        let dir = self.root.join(key.key());
        if let Err(e) = fs::rename(&staging, &dir) {
            let _ = fs::remove_dir_all(&staging);
            // A complete template of the same key already there is as good as ours.
            if dir.join("meta.json").is_file() {
                return Ok(Ok(Template::at(dir, cmdline.to_owned())));
            }
            return Err(io("renaming into place", &dir)(e));
        }
        Ok(Ok(Template::at(dir, cmdline.to_owned())))
    }

    /// Removes the template of `key` (one a clone could not be made from).
    pub fn remove(&self, key: &TemplateKey) {
        let _ = fs::remove_dir_all(self.root.join(key.key()));
    }

    /// Removes stale, long-unused and broken templates. Templates named in `in_use` (keys of
    /// sandboxes being created from them right now) are kept whatever their age.
    pub fn gc(&self, unused_for: Duration, in_use: &HashSet<String>) -> Result<GcReport, Error> {
        self.gc_at(now_s(), unused_for, in_use)
    }

    /// [`gc`](Self::gc) as if it were `now` (seconds since the epoch).
    fn gc_at(&self, now: u64, unused_for: Duration, in_use: &HashSet<String>) -> Result<GcReport, Error> {
        let mut report = GcReport::default();
        let entries = fs::read_dir(&self.root).map_err(io("listing", &self.root))?;
        for entry in entries {
            let entry = entry.map_err(io("listing", &self.root))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            if in_use.contains(&name) {
                continue;
            }
            let remove = if name.starts_with(".staging-") {
                // A staging directory of a live creator is its own; one whose pid is gone is not.
                let pid = name.rsplit('-').next().and_then(|p| p.parse::<i32>().ok());
                let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
                (!alive).then_some(&mut report.broken)
            } else {
                match Self::read_meta(&dir) {
                    Err(_) => Some(&mut report.broken),
                    Ok(meta) if !meta.key.is_current() => Some(&mut report.stale),
                    Ok(meta) if now.saturating_sub(meta.last_used_unix_s) > unused_for.as_secs() => {
                        Some(&mut report.unused)
                    }
                    Ok(_) => None,
                }
            };
            if let Some(count) = remove {
                fs::remove_dir_all(&dir).map_err(io("removing", &dir))?;
                *count += 1;
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        dir: tempfile::TempDir,
        store: TemplateStore,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("vmlinux"), b"kernel v1").unwrap();
        fs::write(dir.path().join("initramfs"), b"agent v1").unwrap();
        let store = TemplateStore::open(&dir.path().join("templates")).unwrap();
        Fixture { dir, store }
    }

    fn shape() -> Shape {
        Shape { vcpus: 1, memory_mib: 256, net: true, cmdline_extra: String::new(), disk_bytes: 4 << 30 }
    }

    impl Fixture {
        fn key(&self, image: &str, shape: Shape) -> TemplateKey {
            let p = self.dir.path();
            TemplateKey::new(&p.join("vmlinux"), &p.join("initramfs"), "kvm", image, shape).unwrap()
        }

        fn make(&self, key: &TemplateKey) -> Template {
            let made = self.store.put(key, true, "console=ttyS0", |t: &Template| {
                for f in [&t.snapshot.state, &t.snapshot.memory, &t.scratch] {
                    fs::write(f, b"x")?;
                }
                Ok::<(), std::io::Error>(())
            });
            made.unwrap().unwrap()
        }
    }

    #[test]
    fn a_template_is_found_by_its_key_and_only_by_it() {
        let f = fixture();
        let key = f.key("sha256:aaa", shape());
        assert_eq!(f.store.get(&key).unwrap(), None);
        let made = f.make(&key);
        assert_eq!(f.store.get(&key).unwrap(), Some(made));
        assert_eq!(f.store.get(&f.key("sha256:bbb", shape())).unwrap(), None, "another image");
        let bigger = Shape { memory_mib: 512, ..shape() };
        assert_eq!(f.store.get(&f.key("sha256:aaa", bigger)).unwrap(), None, "another shape");
        assert_ne!(key.key(), f.key("sha256:aaa", Shape { net: false, ..shape() }).key());
        let p = f.dir.path();
        let other_engine =
            TemplateKey::new(&p.join("vmlinux"), &p.join("initramfs"), "qemu-tcg", "sha256:aaa", shape()).unwrap();
        assert_eq!(f.store.get(&other_engine).unwrap(), None, "another engine's snapshot is not this one's");
    }

    #[test]
    fn a_rebuilt_kernel_or_initramfs_invalidates_and_gc_removes_it() {
        let f = fixture();
        let key = f.key("sha256:aaa", shape());
        f.make(&key);
        // Rebuilt: another size (and mtime).
        fs::write(f.dir.path().join("initramfs"), b"agent v2, longer").unwrap();
        assert_eq!(f.store.get(&key).unwrap(), None, "the old key no longer matches its files");
        let fresh = f.key("sha256:aaa", shape());
        assert_ne!(fresh.key(), key.key());
        f.make(&fresh);
        let report = f.store.gc(Duration::from_secs(3600), &HashSet::new()).unwrap();
        assert_eq!(report, GcReport { stale: 1, unused: 0, broken: 0 });
        assert!(f.store.get(&fresh).unwrap().is_some(), "the current template stays");
    }

    #[test]
    fn gc_removes_unused_and_broken_entries_but_not_those_in_use() {
        let f = fixture();
        let a = f.key("sha256:aaa", shape());
        let b = f.key("sha256:bbb", shape());
        f.make(&a);
        f.make(&b);
        fs::create_dir(f.store.root.join(".staging-dead-999999999")).unwrap();
        fs::create_dir(f.store.root.join("no-meta")).unwrap();
        let in_use = HashSet::from([b.key()]);
        let hour = Duration::from_secs(3600);
        assert_eq!(f.store.gc(hour, &in_use).unwrap(), GcReport { stale: 0, unused: 0, broken: 2 });
        assert!(!f.store.root.join("no-meta").exists());
        // Two hours on, `a` has been unused for longer than an hour; `b` is in use.
        let later = now_s() + 2 * 3600;
        assert_eq!(f.store.gc_at(later, hour, &in_use).unwrap(), GcReport { stale: 0, unused: 1, broken: 0 });
        assert_eq!(f.store.get(&a).unwrap(), None);
        assert!(f.store.get(&b).unwrap().is_some(), "a template in use is kept");
    }

    #[test]
    fn a_failed_fill_leaves_nothing_behind() {
        let f = fixture();
        let key = f.key("sha256:aaa", shape());
        let made = f.store.put(&key, true, "", |_| Err::<(), _>("snapshot failed")).unwrap();
        assert_eq!(made, Err("snapshot failed"));
        assert_eq!(fs::read_dir(&f.store.root).unwrap().count(), 0);
        assert_eq!(f.store.get(&key).unwrap(), None);
    }
}

//! vm templates (`pvisor serve --vm-templates`): the first create of an image and shape boots
//! its guest and, once the agent first answers and before it is configured, the worker saves
//! the machine (`VmConfig.template_capture`, `pvisor_worker::vm::capture`); the broker turns
//! those files into a template of the store (`pvisor_worker::vm::template`: keyed by the
//! kernel's and initramfs's file identity, the image and the shape; invalidated by a new key,
//! gc'd when stale or unused). Every later create of that key restores from it
//! (`VmConfig.restore`, a copy of the template's scratch disk) and then configures its own
//! agent, with its own environment, entrypoint and (through `Agent.Refresh`) hostname, clock
//! and entropy. One capture per key at a time; creates meanwhile boot.
//!
//! Both engines take machine snapshots. The project's own VMM writes guest RAM as a file of
//! its own (`memory`) and its clones map it privately, so every clone shares the template's
//! untouched pages through the page cache; the QEMU TCG engine's state holds the RAM and its
//! clones load it into memory of their own. The key names the engine.
use super::vm::{VmAssets, VmRestoreFiles};
use pvisor_proto::worker::TemplateCapture;
use pvisor_worker::vm::template::{Shape, TemplateKey, TemplateStore};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// Templates unused this long are removed (at start and after each new one).
pub const UNUSED_FOR: Duration = Duration::from_secs(24 * 3600);

pub struct Templates {
    store: TemplateStore,
    root: PathBuf,
    /// Keys being captured now.
    capturing: Mutex<HashSet<String>>,
}

/// What a create does about templates.
pub enum Plan {
    /// Nothing (no template, and another create is capturing one).
    None,
    /// Restore from this template.
    Clone { key: TemplateKey, files: VmRestoreFiles },
    /// Boot, and capture the template on the way.
    Capture(Capture),
}

/// A capture in progress: where the worker writes.
pub struct Capture {
    key: TemplateKey,
    dir: PathBuf,
    pub request: TemplateCapture,
}

impl Templates {
    /// The store under `<data>/templates`, gc'd.
    pub fn open(data_dir: &Path) -> Result<Templates, String> {
        let root = data_dir.join("templates");
        let store = TemplateStore::open(&root).map_err(|e| e.to_string())?;
        let t = Templates { store, root, capturing: Mutex::new(HashSet::new()) };
        t.gc();
        Ok(t)
    }

    fn gc(&self) {
        match self.store.gc(UNUSED_FOR, &HashSet::new()) {
            Ok(r) if r.stale + r.unused + r.broken > 0 => {
                tracing::info!(stale = r.stale, unused = r.unused, broken = r.broken, "vm templates removed")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("vm templates gc: {e}"),
        }
    }

    /// The plan of a create of `image_id` in `shape` by sandbox `sandbox_id`.
    pub fn plan(&self, assets: &VmAssets, image_id: &str, shape: Shape, sandbox_id: &str) -> Plan {
        let engine = super::vm::engine_name(assets.engine);
        let key = match TemplateKey::new(&assets.kernel, &assets.initramfs, engine, image_id, shape) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!("vm templates: {e}");
                return Plan::None;
            }
        };
        match self.store.get(&key) {
            Ok(Some(t)) => {
                let memory = t.snapshot.memory.is_file().then(|| t.snapshot.memory.clone());
                let files = VmRestoreFiles {
                    state: t.snapshot.state.clone(),
                    memory,
                    scratch: t.scratch.clone(),
                    cmdline: t.cmdline,
                };
                return Plan::Clone { key, files };
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("vm templates: {e}"),
        }
        if !self.capturing.lock().unwrap_or_else(|e| e.into_inner()).insert(key.key()) {
            return Plan::None;
        }
        // A staging name with this broker's pid: the store's gc keeps it while the broker lives.
        let dir = self.root.join(format!(".staging-capture-{sandbox_id}-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!("vm templates: {}: {e}", dir.display());
            self.done(&key);
            return Plan::None;
        }
        let request = TemplateCapture {
            state_file: dir.join("state").to_string_lossy().into_owned(),
            scratch_file: dir.join("scratch").to_string_lossy().into_owned(),
            memory_file: dir.join("memory").to_string_lossy().into_owned(),
        };
        Plan::Capture(Capture { key, dir, request })
    }

    fn done(&self, key: &TemplateKey) {
        self.capturing.lock().unwrap_or_else(|e| e.into_inner()).remove(&key.key());
    }

    /// The create finished: a non-empty `cmdline` means the worker captured the template
    /// (keeping the guest stopped `capture_us`).
    pub fn finish(&self, cap: Capture, cmdline: &str, capture_us: u64) {
        if !cmdline.is_empty() {
            let (state, scratch, memory) = (cap.dir.join("state"), cap.dir.join("scratch"), cap.dir.join("memory"));
            // The project's VMM writes guest RAM apart; QEMU's state holds it.
            let memory_file = memory.is_file();
            let made = self.store.put(&cap.key, memory_file, cmdline, |t| {
                std::fs::rename(&state, &t.snapshot.state)?;
                if memory_file {
                    std::fs::rename(&memory, &t.snapshot.memory)?;
                }
                std::fs::rename(&scratch, &t.scratch)
            });
            match made {
                Ok(Ok(t)) => {
                    tracing::info!(template = %t.dir.display(), stopped_ms = capture_us / 1000, "vm template made")
                }
                Ok(Err(e)) => tracing::warn!("vm template: moving the capture in: {e}"),
                Err(e) => tracing::warn!("vm template: {e}"),
            }
        }
        let _ = std::fs::remove_dir_all(&cap.dir);
        self.done(&cap.key);
        self.gc();
    }

    /// A clone of `key` could not be made: drop the template (the next create captures anew).
    pub fn broken(&self, key: &TemplateKey) {
        tracing::warn!(key = %key.key(), "vm template removed: a restore from it failed");
        self.store.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::worker::VmEngine;
    use pvisor_worker::vm::template::Shape;

    fn shape() -> Shape {
        Shape { vcpus: 1, memory_mib: 256, net: false, cmdline_extra: String::new(), disk_bytes: 0 }
    }

    /// The worker's part of a capture: its files where the request says (`memory`: the own
    /// VMM writes guest RAM apart, QEMU does not).
    fn captured(cap: &Capture, memory: bool) {
        let r = &cap.request;
        for f in [&r.state_file, &r.scratch_file] {
            std::fs::write(f, b"x").unwrap();
        }
        if memory {
            std::fs::write(&r.memory_file, b"ram").unwrap();
        }
    }

    #[test]
    fn an_own_vmm_capture_becomes_a_template_whose_clones_get_its_memory_file() {
        let dir = tempfile::tempdir().unwrap();
        let kvm = VmAssets::for_tests(dir.path(), VmEngine::Kvm);
        let t = Templates::open(dir.path()).unwrap();
        let Plan::Capture(cap) = t.plan(&kvm, "sha256:aaa", shape(), "sb1") else {
            panic!("the first create captures")
        };
        assert!(matches!(t.plan(&kvm, "sha256:aaa", shape(), "sb2"), Plan::None), "one capture per key at a time");
        captured(&cap, true);
        t.finish(cap, "console=ttyS0", 1_000);
        let Plan::Clone { files, .. } = t.plan(&kvm, "sha256:aaa", shape(), "sb3") else {
            panic!("later creates clone")
        };
        assert_eq!(files.cmdline, "console=ttyS0");
        let memory = files.memory.expect("the template keeps the memory file");
        assert_eq!(std::fs::read(memory).unwrap(), b"ram");
        assert!(files.state.is_file() && files.scratch.is_file());
        // A server under the other engine does not take this engine's template.
        let qemu = VmAssets::for_tests(dir.path(), VmEngine::QemuTcg);
        assert!(matches!(t.plan(&qemu, "sha256:aaa", shape(), "sb4"), Plan::Capture(_)));
    }

    #[test]
    fn a_qemu_capture_has_no_memory_file_and_a_failed_one_makes_no_template() {
        let dir = tempfile::tempdir().unwrap();
        let qemu = VmAssets::for_tests(dir.path(), VmEngine::QemuTcg);
        let t = Templates::open(dir.path()).unwrap();
        let Plan::Capture(cap) = t.plan(&qemu, "sha256:aaa", shape(), "sb1") else { panic!("captures") };
        let capture_dir = cap.dir.clone();
        // The worker captured nothing (an empty command line): no template, the next create tries again.
        t.finish(cap, "", 0);
        assert!(!capture_dir.exists(), "the capture's directory is removed");
        let Plan::Capture(cap) = t.plan(&qemu, "sha256:aaa", shape(), "sb2") else { panic!("captures again") };
        captured(&cap, false);
        t.finish(cap, "console=ttyS0", 1_000);
        let Plan::Clone { files, .. } = t.plan(&qemu, "sha256:aaa", shape(), "sb3") else { panic!("clones") };
        assert_eq!(files.memory, None, "QEMU's state holds guest RAM");
    }
}

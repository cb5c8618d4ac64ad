//! What the broker prepares for vm sandboxes: the guest kernel, the
//! initramfs holding the agent as `/init`, and the scratch disk templates
//! (an empty ext4 per size, made once; each sandbox gets a sparse copy as its
//! writable disk, so its size is the sandbox's disk bound: the guest's
//! writes past it fail with ENOSPC inside the guest).
use pvisor_proto::worker::{ImageDisk, VmConfig, VmEngine, VmRestore};
use pvisor_worker::config::Limits;
use pvisor_worker::vm::host::{HostSupport, Virtualization};
use std::path::{Path, PathBuf};

/// Apparent size of a sandbox's scratch disk when its limits name no disk
/// bound (sparse: only what the sandbox writes takes space).
pub const SCRATCH_BYTES: u64 = 4 << 30;

/// The guest's vsock CID. Every VM has a vsock device of its own whose host
/// side is its worker, so the CID need not be unique across sandboxes.
pub const GUEST_CID: u32 = 3;

pub struct VmAssets {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// Names this kernel and initramfs ([`VmAssets::identity`]).
    identity: String,
    /// Where the scratch templates are (`scratch-<blocks>.ext4`).
    dir: PathBuf,
    pub engine: VmEngine,
    /// More guest kernel arguments ([`CMDLINE_ENV`]), for diagnosis.
    pub cmdline_extra: String,
}

/// Appended to every guest's kernel command line, for diagnosis (e.g. `ignore_loglevel`: the
/// kernel's messages reach the sandbox's console log, and a failed boot's report).
pub const CMDLINE_ENV: &str = "PVISOR_GUEST_CMDLINE_EXTRA";

/// The test engine's environment switch (`PVISOR_VM_ENGINE=qemu-tcg`).
pub const ENGINE_ENV: &str = "PVISOR_VM_ENGINE";
/// The test engine's QEMU (a path; default `qemu-system-x86_64` on `PATH`),
/// read by the worker too. Snapshots of vm sandboxes need one whose
/// vhost-user-vsock device migrates (QEMU 8 and later).
pub const QEMU_ENV: &str = "PVISOR_QEMU";

/// The engine this server runs guests with, or why none can.
pub fn engine(host: &HostSupport) -> Result<VmEngine, String> {
    let hardware = || match (host.virtualization, &host.kvm_access) {
        (Virtualization::Hardware, Ok(())) => Ok(()),
        (Virtualization::Hardware, Err(e)) => Err(e.clone()),
        (v, _) => Err(format!(
            "{}; a Linux guest needs hardware virtualization ({ENGINE_ENV}=qemu-tcg selects the test engine)",
            v.describe()
        )),
    };
    match std::env::var(ENGINE_ENV).as_deref() {
        Ok("qemu-tcg") => qemu("qemu-tcg").map(|()| VmEngine::QemuTcg),
        Ok("qemu-kvm") => hardware().and_then(|()| qemu("qemu-kvm")).map(|()| VmEngine::QemuKvm),
        Ok("kvm" | "") | Err(_) => hardware().map(|()| VmEngine::Kvm),
        Ok(other) => Err(format!("{ENGINE_ENV}={other:?}: expected kvm, qemu-tcg or qemu-kvm")),
    }
}

/// Whether the QEMU engines' binary is there ([`QEMU_ENV`], else `qemu-system-x86_64` on `PATH`).
fn qemu(engine: &str) -> Result<(), String> {
    match std::env::var_os(QEMU_ENV) {
        Some(q) if Path::new(&q).is_file() => Ok(()),
        Some(q) => Err(format!("{ENGINE_ENV}={engine}, but {QEMU_ENV}={} is not a file", Path::new(&q).display())),
        None => match which("qemu-system-x86_64") {
            Some(_) => Ok(()),
            None => Err(format!("{ENGINE_ENV}={engine}, but qemu-system-x86_64 is not installed")),
        },
    }
}

/// The engine's name as [`ENGINE_ENV`] takes it.
pub fn engine_name(engine: VmEngine) -> &'static str {
    match engine {
        VmEngine::Kvm => "kvm",
        VmEngine::QemuTcg => "qemu-tcg",
        VmEngine::QemuKvm => "qemu-kvm",
    }
}

/// `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

impl VmAssets {
    /// Checks the engine and the kernel and makes the initramfs and the
    /// scratch template under `dir` (once; later starts reuse them).
    pub fn prepare(dir: &Path, kernel: Option<&Path>, agent: &Path, host: &HostSupport) -> Result<VmAssets, String> {
        let engine = engine(host)?;
        let kernel = kernel
            .ok_or("no guest kernel (--guest-kernel or PVISOR_GUEST_KERNEL; scripts/guest-kernel.sh builds one)")?;
        if !kernel.is_file() {
            return Err(format!("guest kernel {} not found", kernel.display()));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let initramfs = dir.join("initramfs.cpio");
        let cpio = pvisor_vmm::initramfs::agent_initramfs(agent).map_err(|e| format!("initramfs: {e}"))?;
        // Rewritten only when the agent changed: the file's identity keys vm templates.
        if std::fs::read(&initramfs).ok().as_deref() != Some(&cpio[..]) {
            write_atomically(&initramfs, &cpio)?;
        }
        let identity = identity_of(kernel, &cpio, engine)?;
        let cmdline_extra = std::env::var(CMDLINE_ENV).unwrap_or_default();
        let assets = VmAssets {
            kernel: kernel.to_path_buf(),
            initramfs,
            identity,
            dir: dir.to_path_buf(),
            engine,
            cmdline_extra,
        };
        assets.scratch_template(0)?;
        Ok(assets)
    }

    /// Assets over a stand-in kernel and initramfs in `dir` (made if missing), for tests.
    #[cfg(test)]
    pub fn for_tests(dir: &Path, engine: VmEngine) -> VmAssets {
        let (kernel, initramfs) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
        for f in [&kernel, &initramfs] {
            if !f.exists() {
                std::fs::write(f, b"stand-in").unwrap();
            }
        }
        VmAssets {
            kernel,
            initramfs,
            identity: "test".into(),
            dir: dir.to_path_buf(),
            engine,
            cmdline_extra: String::new(),
        }
    }

    /// The empty ext4 of a scratch disk of `bytes` ([`SCRATCH_BYTES`] for
    /// 0), made now if no earlier create made it.
    fn scratch_template(&self, bytes: u64) -> Result<PathBuf, String> {
        let bytes = if bytes == 0 { SCRATCH_BYTES } else { bytes };
        let path = self.dir.join(format!("scratch-{}.ext4", bytes.div_ceil(4096)));
        if !path.is_file() {
            make_scratch_template(&path, bytes)?;
        }
        Ok(path)
    }

    /// Memory the engine needs beside guest RAM: the worker and its VMM
    /// (measured at about 8 MiB), or QEMU with its TCG translation cache
    /// (64 MiB, `tb-size`) under the test engine.
    pub fn overhead_bytes(&self) -> u64 {
        match self.engine {
            VmEngine::Kvm => 48 << 20,
            VmEngine::QemuTcg => 192 << 20,
            VmEngine::QemuKvm => 128 << 20,
        }
    }

    /// What the guest runs: a SHA-256 over the initramfs (the agent), the
    /// kernel file's path, size and modification time, and the engine. A vm
    /// snapshot restores only where this is what it was taken with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The machine `limits` give: vCPUs (whole cores, rounded up) and memory (MiB, at least 128).
    pub fn shape(limits: &Limits) -> (u32, u64) {
        (limits.cpu_millis.div_ceil(1000).clamp(1, 64) as u32, (limits.memory_bytes >> 20).max(128))
    }

    /// The worker configuration's vm part for a sandbox in `state_dir`; a
    /// restore's scratch disk is a copy of its snapshot's.
    pub fn config(
        &self,
        disk: ImageDisk,
        limits: &Limits,
        state_dir: &Path,
        restore: Option<&VmRestoreFiles>,
    ) -> Result<VmConfig, String> {
        let scratch = state_dir.join("scratch.img");
        match restore {
            Some(r) => copy_sparse(&r.scratch, &scratch)?,
            None => copy_sparse(&self.scratch_template(limits.disk_bytes)?, &scratch)?,
        }
        let (vcpus, memory_mib) = Self::shape(limits);
        Ok(VmConfig {
            kernel: self.kernel.to_string_lossy().into_owned(),
            initramfs: self.initramfs.to_string_lossy().into_owned(),
            root_disk: Some(disk),
            scratch_disk: scratch.to_string_lossy().into_owned(),
            vcpus,
            memory_mib,
            guest_cid: GUEST_CID,
            console_log: state_dir.join("console.log").to_string_lossy().into_owned(),
            engine: self.engine as i32,
            cmdline_extra: self.cmdline_extra.clone(),
            // Set by the launch from the server's `--memory-merge`.
            memory_merge: false,
            // Set by the launch (a template capture).
            template_capture: None,
            restore: restore.map(|r| VmRestore {
                state_file: r.state.to_string_lossy().into_owned(),
                cmdline: r.cmdline.clone(),
                memory_file: r.memory.as_ref().map(|m| m.to_string_lossy().into_owned()).unwrap_or_default(),
            }),
        })
    }
}

/// A vm snapshot's files, for a restore.
#[derive(Clone, Debug)]
pub struct VmRestoreFiles {
    /// The machine's state (loaded by the engine in place: never written).
    pub state: PathBuf,
    /// Guest RAM, where the engine keeps it apart (the project's VMM maps it privately: never
    /// written).
    pub memory: Option<PathBuf>,
    /// The scratch disk (copied for the restore).
    pub scratch: PathBuf,
    pub cmdline: String,
}

fn identity_of(kernel: &Path, initramfs: &[u8], engine: VmEngine) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(kernel).map_err(|e| format!("{}: {e}", kernel.display()))?;
    let mut h = Sha256::new();
    h.update(initramfs);
    h.update(format!("\0{}\0{}\0{}.{}", kernel.display(), m.len(), m.mtime(), m.mtime_nsec()).as_bytes());
    // One engine's machine state is not another's.
    h.update(format!("\0{}", engine_name(engine)).as_bytes());
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn write_atomically(path: &Path, data: &[u8]) -> Result<(), String> {
    use pvisor_fstree::replace::{replace_file, Durability};
    replace_file(path, data, Durability::Deferred).map_err(|e| format!("{}: {e}", path.display()))
}

/// An empty ext4 of `bytes` (whole 4 KiB blocks), sparse (lazy inode table
/// and journal initialization: only metadata is written). Made under a name
/// of this call's own and renamed into place, so two creates making the same
/// template at once each get a whole one.
fn make_scratch_template(path: &Path, bytes: u64) -> Result<(), String> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    let f = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.set_len(bytes.div_ceil(4096) * 4096).map_err(|e| format!("{}: {e}", tmp.display()))?;
    drop(f);
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-L", "pvisor-scratch"])
        .arg(&tmp)
        .output()
        .map_err(|e| format!("mkfs.ext4 (package e2fsprogs): {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Copies `from` to a new file `to` keeping holes (SEEK_DATA/SEEK_HOLE), so a 4 GiB
/// template with a few MiB of ext4 metadata costs a few MiB (the worker's copy, which an ns
/// sandbox's disk uses too).
pub fn copy_sparse(from: &Path, to: &Path) -> Result<(), String> {
    pvisor_worker::ns::disk::copy_sparse(from, to).map_err(|e| e.to_string())
}

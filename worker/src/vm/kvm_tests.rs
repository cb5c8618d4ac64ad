//! The own-VMM engine's snapshots and restores on this host's KVM, with a PVH test guest that
//! counts (`vmm/tests/guests/pvhcount.S`) in place of Linux (which does not boot on these PVM
//! hosts): the sandbox has the worker's whole device set (image and scratch disks, vsock, net);
//! its snapshot writes state, memory and a copy of the scratch disk; two clones restored from it
//! on links of their own continue the count from the snapshot point; a restore whose devices do
//! not match the snapshot's is refused.
use super::*;
use crate::backend::{Sandbox, SnapshotFiles};
use pvisor_proto::worker::VmRestore;
use pvisor_vmm::devices::virtio::block::ReadOnlyBackend;
use std::path::Path;
use std::process::Command;

/// Assembles and links the counting guest into `dir`.
fn guest(dir: &Path) -> PathBuf {
    let src = pvisor_testkit::manifest_dir(env!("CARGO_MANIFEST_DIR")).join("../vmm/tests/guests");
    let (obj, elf) = (dir.join("pvhcount.o"), dir.join("pvhcount.elf"));
    let steps = [
        Command::new("as").arg("--64").arg("-I").arg(&src).arg("-o").arg(&obj).arg(src.join("pvhcount.S")).output(),
        Command::new("ld").arg("-T").arg(src.join("pvh.ld")).arg("-o").arg(&elf).arg(&obj).output(),
    ];
    for out in steps {
        let out = out.expect("binutils (as, ld) are installed");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    elf
}

/// A sandbox's vm part in `dir`, named `name` (its scratch disk and console are its own).
fn config(dir: &Path, kernel: &Path, name: &str, restore: Option<VmRestore>) -> VmConfig {
    let initramfs = dir.join("initramfs");
    if !initramfs.exists() {
        std::fs::write(&initramfs, b"").unwrap();
    }
    VmConfig {
        kernel: kernel.to_string_lossy().into_owned(),
        initramfs: initramfs.to_string_lossy().into_owned(),
        scratch_disk: dir.join(format!("{name}.scratch")).to_string_lossy().into_owned(),
        vcpus: 1,
        memory_mib: 64,
        guest_cid: 3,
        console_log: dir.join(format!("{name}.console")).to_string_lossy().into_owned(),
        restore,
        ..Default::default()
    }
}

fn root() -> Arc<dyn BlockBackend> {
    Arc::new(ReadOnlyBackend::new(1 << 20, |_, buf: &mut [u8]| {
        buf.fill(0);
        Ok(buf.len())
    }))
}

/// The counts of the complete `n XXXXXXXX` lines of `text` (a clone's first line may be the
/// rest of one its source began).
fn counts(text: &str) -> Vec<u32> {
    let complete = text.rsplit_once('\n').map_or("", |(done, _)| done);
    complete
        .lines()
        .filter_map(|l| l.strip_prefix("n ").filter(|h| h.len() == 8))
        .filter_map(|h| u32::from_str_radix(h, 16).ok())
        .collect()
}

/// What the guest of `cfg` printed so far (its console file).
fn console(cfg: &VmConfig) -> String {
    String::from_utf8_lossy(&std::fs::read(&cfg.console_log).unwrap_or_default()).into_owned()
}

/// Waits until the guest of `cfg` has printed a count of at least `at_least`; returns its counts.
fn wait_for_count(cfg: &VmConfig, at_least: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = counts(&console(cfg));
        if c.last().is_some_and(|&n| n >= at_least) {
            return c;
        }
        assert!(Instant::now() < deadline, "no count {at_least} within 20 s; console:\n{}", console(cfg));
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stop(sb: KvmSandbox) {
    sb.kill();
    assert!(matches!(sb.wait(), SandboxExit::Signaled(_)), "a killed VM ends as stopped");
}

#[test]
fn a_sandbox_snapshots_and_two_clones_continue_from_it_on_links_of_their_own() {
    assert!(Path::new("/dev/kvm").exists(), "/dev/kvm is missing: these hosts provide KVM (PVM)");
    let dir = tempfile::tempdir().unwrap();
    let kernel = guest(dir.path());
    let source_cfg = config(dir.path(), &kernel, "source", None);
    // A scratch disk with content to carry.
    let marker: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&source_cfg.scratch_disk, &marker).unwrap();
    let (end, _netd) = net::link().unwrap();
    let source = start_with_root(&source_cfg, root(), "box", Duration::from_secs(5), Some(end)).unwrap();
    let before = *wait_for_count(&source_cfg, 3).last().unwrap();

    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let files =
        SnapshotFiles { state: snap.join("state"), memory: snap.join("memory"), scratch: snap.join("scratch.img") };
    let taken = source.snapshot(&files).expect("an own-VMM sandbox snapshots");
    let after = *wait_for_count(&source_cfg, before + 1).last().unwrap();
    assert!(taken.state_bytes > 0 && taken.cmdline.contains("pvisor.net=1"), "{taken:?}");
    assert_eq!(std::fs::metadata(&files.memory).unwrap().len(), 64 << 20, "guest RAM, sparse");
    assert_eq!(std::fs::read(&files.scratch).unwrap(), marker, "the scratch disk as the guest left it");
    assert!(console(&source_cfg).starts_with("pvhcount\n"));
    stop(source);

    let restore = VmRestore {
        state_file: files.state.to_string_lossy().into_owned(),
        memory_file: files.memory.to_string_lossy().into_owned(),
        cmdline: taken.cmdline.clone(),
    };
    let mut clones = Vec::new();
    for name in ["clone-a", "clone-b"] {
        let cfg = config(dir.path(), &kernel, name, Some(restore.clone()));
        std::fs::copy(&files.scratch, &cfg.scratch_disk).unwrap();
        let (end, netd) = net::link().unwrap();
        let clone = start_with_root(&cfg, root(), "box", Duration::from_secs(5), Some(end)).unwrap();
        clones.push((clone, cfg, netd));
    }
    for (_, cfg, _) in &clones {
        let seen = wait_for_count(cfg, before + 3);
        let first = seen[0];
        // It ran on from the snapshot (no boot banner; the first whole count follows one the
        // source printed before or while the snapshot was taken).
        eprintln!("source counted {before} before the snapshot, {after} after it; the clone went on at {first}");
        assert!(!console(cfg).contains("pvhcount"), "a clone does not boot");
        assert!((before + 1..=after + 2).contains(&first), "first count {first}, source {before}..{after}");
        assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "counts step by one: {seen:?}");
    }
    for (clone, _, _) in clones {
        stop(clone);
    }

    // A restore with other devices than its snapshot's (no network) is refused, and says why.
    let cfg = config(dir.path(), &kernel, "mismatch", Some(restore));
    std::fs::copy(&files.scratch, &cfg.scratch_disk).unwrap();
    let err = start_with_root(&cfg, root(), "box", Duration::from_secs(5), None).err().expect("refused");
    assert!(err.to_string().contains("virtio devices"), "{err}");
}

#[test]
fn a_restore_without_a_memory_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    std::fs::write(&kernel, b"").unwrap();
    let restore =
        VmRestore { state_file: "/nonexistent/state".into(), memory_file: String::new(), cmdline: String::new() };
    let cfg = config(dir.path(), &kernel, "r", Some(restore));
    std::fs::write(&cfg.scratch_disk, b"").unwrap();
    let err = start_with_root(&cfg, root(), "box", Duration::from_secs(5), None).err().expect("refused");
    assert!(err.to_string().contains("memory file"), "{err}");
}

fn kinds(devices: &[Box<dyn VirtioDevice>]) -> Vec<u32> {
    devices.iter().map(|d| d.device_type()).collect()
}

#[test]
fn a_snapshot_from_before_the_balloon_is_restored_without_one() {
    let disk = || -> Box<dyn VirtioDevice> { Box::new(Block::new(root(), disks::ROOT_ID)) };
    let fresh = || -> Vec<Box<dyn VirtioDevice>> { vec![disk(), disk(), Box::new(Balloon::new())] };
    let mut d = fresh();
    fit_to_snapshot(&mut d, 2);
    assert_eq!(kinds(&d), vec![2, 2], "the older snapshot had no balloon");
    let mut d = fresh();
    fit_to_snapshot(&mut d, 3);
    assert_eq!(kinds(&d), vec![2, 2, balloon::DEVICE_TYPE], "a snapshot with one keeps it");
    // Anything else is left for the restore to refuse (device counts must match).
    let mut d = fresh();
    fit_to_snapshot(&mut d, 1);
    assert_eq!(d.len(), 3);
    let mut d: Vec<Box<dyn VirtioDevice>> = vec![disk(), disk()];
    fit_to_snapshot(&mut d, 1);
    assert_eq!(d.len(), 2, "only a balloon is ever dropped");
}

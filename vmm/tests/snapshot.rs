//! Snapshots and clones on this host's KVM (PVM), with the `snapcount` test guest
//! (`guests/snapcount.S`): it writes a known word into each page of 8 MiB, then prints a mixing sequence
//! step by step and, whenever the clone-identity generation changes, its generation, seed and
//! the sum of those words (reading every page of the 8 MiB).
//!
//! The test boots it, pauses it mid-run, snapshots it, and restores two clones from the one
//! snapshot. Each clone's output must continue the original's exactly from the snapshot point
//! (the original's console up to the pause followed by the clone's console is one correct
//! sequence), report generation 1 with a seed of its own (different from the other clone's and
//! from the boot seed) and the right sum (its memory came from the file), and keep its private
//! dirty memory small: the untouched pages stay shared through the file's page cache.

mod common;

use std::time::{Duration, Instant};

use common::{config, guest, Probe};
use pvisor_vmm::snapshot::{self, SnapshotPaths};
use pvisor_vmm::{Vm, VmConfig, VmExit, VmHandle};

/// Pages of the 8 MiB fill; the guest writes `(i + 1) * FILL_K` at the start of page `i`.
const FILL_PAGES: u64 = (0xc0_0000 - 0x40_0000) / 4096;
const FILL_K: u64 = 0x9e37_79b9_7f4a_7c15;
const MIX_A: u64 = 6_364_136_223_846_793_005;
const X0: u64 = 0x243f_6a88_85a3_08d3;
/// A bound on waiting for guest progress, so a broken restore fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// The expected sum the guest prints: the wrapping sum of `(i + 1) * FILL_K`.
fn fill_sum() -> u64 {
    (1..=FILL_PAGES).fold(0u64, |s, i| s.wrapping_add(i.wrapping_mul(FILL_K)))
}

/// A `gen` line's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GenLine {
    generation: u64,
    seed: String,
    sum: u64,
}

/// What a console shows: `gen` lines, and the last step after checking every step line.
#[derive(Debug, Default)]
struct Transcript {
    gens: Vec<GenLine>,
    last_step: u64,
}

/// Checks that `text` is the guest's output from boot: banner, fill, then step lines numbered
/// 1, 2, 3, ... with the right mixed value, `gen` lines anywhere between them. A final line
/// without its newline is ignored (the guest was caught mid-line).
fn check(text: &str) -> Transcript {
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    if lines.last().is_some_and(|l| !l.ends_with('\n')) {
        lines.pop();
    }
    assert!(
        lines.len() >= 2 && lines[0] == "snapcount\n" && lines[1] == "filled\n",
        "bad start: {:?}",
        &lines[..lines.len().min(3)]
    );
    let mut t = Transcript::default();
    let mut x = X0;
    for line in &lines[2..] {
        let words: Vec<&str> = line.trim_end().split(' ').collect();
        let hex = |w: &str| u64::from_str_radix(w, 16).unwrap_or_else(|_| panic!("bad number {w:?} in {line:?}"));
        match words.as_slice() {
            ["step", n, v] => {
                let n = hex(n);
                assert_eq!(n, t.last_step + 1, "step {n} follows step {} in {line:?}", t.last_step);
                x = x.wrapping_mul(MIX_A).wrapping_add(n);
                assert_eq!(hex(v), x, "step {n}: wrong value");
                t.last_step = n;
            }
            ["gen", g, "seed", seed, "sum", sum] => {
                assert_eq!(seed.len(), 64, "{line:?}");
                t.gens.push(GenLine { generation: hex(g), seed: seed.to_string(), sum: hex(sum) });
            }
            _ => panic!("unexpected console line {line:?}"),
        }
    }
    t
}

fn console_text(console: &pvisor_vmm::devices::console::SharedConsole) -> String {
    String::from_utf8_lossy(&console.lock().unwrap().contents()).into_owned()
}

/// Runs `vm` on a thread of its own; how it ended goes to the test's output unless another
/// thread stopped it (a clone that ended early says why, not only that it did).
fn run_in_thread(vm: Vm) -> std::thread::JoinHandle<VmExit> {
    std::thread::spawn(move || {
        let exit = vm.run();
        if exit != VmExit::Stopped {
            println!("the VM ended: {exit:?}");
        }
        exit
    })
}

/// Waits until `console` has step `n` complete.
fn wait_for_step(
    console: &pvisor_vmm::devices::console::SharedConsole,
    n: u64,
    running: &std::thread::JoinHandle<VmExit>,
) {
    let deadline = Instant::now() + PATIENCE;
    let needle = format!("step {n:016x} ");
    loop {
        let text = console_text(console);
        if text.contains(&needle) && text[text.find(&needle).unwrap()..].contains('\n') {
            return;
        }
        assert!(!running.is_finished(), "the VM ended before step {n}:\n{}", &text[text.len().saturating_sub(400)..]);
        assert!(Instant::now() < deadline, "no step {n} after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The `Private_Dirty`, `Shared_Clean` and `Rss` (bytes) of this process's mapping at `addr`.
fn smaps_of(addr: u64) -> (u64, u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_vma = false;
    let (mut dirty, mut shared, mut rss) = (None, None, None);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some(field) = first.strip_suffix(':') {
            if in_vma {
                let bytes = line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).map(|kb| kb * 1024);
                match field {
                    "Private_Dirty" => dirty = bytes,
                    "Shared_Clean" => shared = bytes,
                    "Rss" => rss = bytes,
                    _ => {}
                }
            }
        } else if let Some((start, _)) = first.split_once('-') {
            in_vma = u64::from_str_radix(start, 16) == Ok(addr);
        }
    }
    (dirty.expect("the mapping's Private_Dirty"), shared.expect("Shared_Clean"), rss.expect("Rss"))
}

fn ram_addr(vm: &Vm) -> u64 {
    vm.ram().regions()[0].2
}

struct Restored {
    handle: VmHandle,
    console: pvisor_vmm::devices::console::SharedConsole,
    runner: std::thread::JoinHandle<VmExit>,
    ram: u64,
    seed: [u8; 32],
    generation: u64,
}

fn start_clone(paths: &SnapshotPaths) -> Restored {
    let vm = snapshot::restore(paths, config()).expect("restoring a clone");
    assert!(vm.ram().fd().is_none(), "a restored VM's RAM is a private mapping with no fd to share");
    assert!(vm.refused_msrs().is_empty(), "KVM refused MSRs of the snapshot: {:x?}", vm.refused_msrs());
    let (generation, seed) = vm.clone_identity();
    let (handle, console, ram) = (vm.handle(), vm.console(), ram_addr(&vm));
    let runner = run_in_thread(vm);
    Restored { handle, console, runner, ram, seed, generation }
}

fn hex_seed(seed: &[u8; 32]) -> String {
    seed.chunks(8).map(|c| format!("{:016x}", u64::from_le_bytes(c.try_into().unwrap()))).collect()
}

#[test]
fn two_clones_continue_from_the_snapshot_with_fresh_seeds_and_shared_pages() {
    common::require_kvm();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let paths = SnapshotPaths::in_dir(dir.path());

    // Boot and run to some point mid-sequence.
    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.load_flat(&guest("snapcount")).unwrap();
    let vm = builder.build().unwrap();
    let snapshotter = vm.snapshotter().expect("the snapcount VM can be snapshotted");
    let (handle, console) = (vm.handle(), vm.console());
    let (_, boot_seed) = vm.clone_identity();
    let original = run_in_thread(vm);
    wait_for_step(&console, 300, &original);

    // Pause, note what it printed, snapshot it while paused; it stays paused.
    handle.pause().unwrap();
    let before = console_text(&console);
    let info = snapshotter.snapshot(&paths).expect("taking the snapshot");
    println!("snapshot: {info:?}");
    assert!(handle.is_paused(), "a snapshot of a paused VM leaves it paused");
    assert_eq!(console_text(&console), before, "the paused guest printed nothing");
    let at_snapshot = check(&before);
    assert!(at_snapshot.last_step >= 300);
    assert_eq!(at_snapshot.gens, vec![GenLine { generation: 0, seed: hex_seed(&boot_seed), sum: fill_sum() }]);
    assert!(info.memory_written >= 8 << 20, "the 8 MiB fill is in the memory file ({} bytes)", info.memory_written);
    assert!(info.memory_written < 16 << 20, "untouched RAM was not written ({} bytes)", info.memory_written);
    handle.stop();
    assert_eq!(original.join().unwrap(), VmExit::Stopped);
    let saved_clock = snapshot::format::read(&paths.state).unwrap().vm.clock;

    // Two clones of the one snapshot.
    let a = start_clone(&paths);
    let b = start_clone(&paths);
    assert_eq!((a.generation, b.generation), (1, 1));
    assert_ne!(a.seed, b.seed, "the clones got the same seed");
    assert_ne!(a.seed, boot_seed);
    let target = at_snapshot.last_step + 300;
    wait_for_step(&a.console, target, &a.runner);
    wait_for_step(&b.console, target, &b.runner);
    a.handle.pause().unwrap();
    b.handle.pause().unwrap();

    for (name, clone, other) in [("a", &a, &b), ("b", &b, &a)] {
        let t = check(&(before.clone() + &console_text(&clone.console)));
        assert!(t.last_step >= target, "clone {name} continued the sequence to step {}", t.last_step);
        let restored = &t.gens[1..];
        assert_eq!(restored.len(), 1, "clone {name} saw one restore: {:?}", t.gens);
        assert_eq!(restored[0], GenLine { generation: 1, seed: hex_seed(&clone.seed), sum: fill_sum() });
        assert_ne!(restored[0].seed, hex_seed(&other.seed), "clone {name} printed the other clone's seed");
    }

    // Memory: each clone read the whole 8 MiB fill (its sum is right) yet owns few pages.
    let ram = config().memory_bytes;
    for (name, clone) in [("a", &a), ("b", &b)] {
        let (dirty, shared, rss) = smaps_of(clone.ram);
        println!("clone {name}: Private_Dirty {dirty} B, Shared_Clean {shared} B, Rss {rss} B of {ram} B guest RAM");
        assert!(rss >= 8 << 20, "clone {name} maps the 8 MiB it read ({rss} B resident)");
        assert!(dirty <= 1 << 20, "clone {name} has {dirty} B of private dirty memory: untouched pages were copied");
        assert!(dirty * 16 <= ram, "private dirty memory is small next to guest RAM");
        assert!(shared >= 8 << 20, "the clones share the fill's pages through the page cache ({shared} B shared)");
    }

    // The clock: KVM advanced kvmclock by the wall time since the snapshot (between the wall
    // times before the restore and after the read; the upper bound has a second of slack for
    // the two clocks' drift).
    let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    match saved_clock {
        Some(saved) if saved.flags & kvm_bindings::KVM_CLOCK_REALTIME != 0 => {
            let before = wall();
            let vm = snapshot::restore(&paths, config()).unwrap();
            let now = vm.kvm_clock().expect("KVM_GET_CLOCK on the restored VM");
            let after = wall();
            let (low, high) = (saved.clock + (before - saved.realtime), saved.clock + (after - saved.realtime));
            println!("kvmclock: saved {} ns, restored {now} ns, expected {low}..={high} ns", saved.clock);
            assert!(now >= low, "kvmclock {now} did not advance by the wall time since the snapshot (>= {low})");
            assert!(now <= high + 1_000_000_000, "kvmclock {now} ran ahead of the wall time (<= {high})");
        }
        other => {
            pvisor_testkit::skip(format!("kvmclock not restored with KVM_CLOCK_REALTIME here: saved clock {other:?}"))
        }
    }

    for clone in [a, b] {
        clone.handle.stop();
        assert_eq!(clone.runner.join().unwrap(), VmExit::Stopped);
    }
}

#[test]
fn a_vm_with_a_device_the_vmm_cannot_save_refuses_a_snapshot() {
    common::require_kvm();
    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.add_pio_device(0x510, 0x10, Probe::new(0)).unwrap();
    builder.load_flat(&guest("hello")).unwrap();
    let vm = builder.build().unwrap();
    assert!(matches!(vm.snapshotter(), Err(snapshot::Error::Unsupported(_))));
}

#[test]
fn a_restore_refuses_a_memory_file_of_the_wrong_size() {
    common::require_kvm();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let paths = SnapshotPaths::in_dir(dir.path());
    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    builder.load_flat(&guest("count")).unwrap();
    let vm = builder.build().unwrap();
    // A VM not yet run snapshots too (its vCPUs are at the entry point).
    vm.snapshotter().unwrap().snapshot(&paths).unwrap();
    drop(vm);
    std::fs::OpenOptions::new().write(true).open(&paths.memory).unwrap().set_len(4096).unwrap();
    match snapshot::restore(&paths, VmConfig { ..config() }) {
        Err(snapshot::Error::MemorySize { file: 4096, .. }) => {}
        Err(e) => panic!("expected a memory size mismatch, got {e}"),
        Ok(_) => panic!("a truncated memory file was restored"),
    }
}

/// The first word of each of the disk's 64 sectors (`snapblk` prints it per read).
fn sector_word(sector: u64) -> u64 {
    (sector + 1).wrapping_mul(0x0123_4567_89ab_cdef)
}

fn blk_disk(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("disk");
    let mut disk = vec![0x77u8; 64 * 512];
    for s in 0..64u64 {
        disk[s as usize * 512..][..8].copy_from_slice(&sector_word(s).to_le_bytes());
    }
    std::fs::write(&path, disk).unwrap();
    path
}

/// A read-only virtio-blk device over the disk at `path` that counts its reads in `reads`.
fn blk_device(
    path: &std::path::Path,
    reads: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Box<dyn pvisor_vmm::devices::virtio::VirtioDevice> {
    use pvisor_vmm::devices::virtio::block::{Block, ReadOnlyBackend};
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let reads = reads.clone();
    let backend = ReadOnlyBackend::new(len, move |offset, buf: &mut [u8]| {
        reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        file.read_at(buf, offset)
    });
    Box::new(Block::new(std::sync::Arc::new(backend), "disk"))
}

/// Checks `snapblk` output from boot: "ready", then reads 0, 1, 2, ... with the right words.
/// Returns the last complete read.
fn check_blk(text: &str) -> u64 {
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    if lines.last().is_some_and(|l| !l.ends_with('\n')) {
        lines.pop();
    }
    assert_eq!(lines.first(), Some(&"ready\n"), "{text}");
    let mut next = 0;
    for line in &lines[1..] {
        let words: Vec<&str> = line.trim_end().split(' ').collect();
        let ["read", k, v] = words.as_slice() else { panic!("unexpected console line {line:?}") };
        let (k, v) = (u64::from_str_radix(k, 16).unwrap(), u64::from_str_radix(v, 16).unwrap());
        assert_eq!(k, next, "read {k} follows read {}", next.wrapping_sub(1));
        assert_eq!(v, sector_word(k % 64), "read {k}: sector {} has another word", k % 64);
        next += 1;
    }
    next.saturating_sub(1)
}

/// Waits until `console` shows a complete read `k`.
fn wait_for_read(
    console: &pvisor_vmm::devices::console::SharedConsole,
    k: u64,
    running: &std::thread::JoinHandle<VmExit>,
) {
    let deadline = Instant::now() + PATIENCE;
    let needle = format!("read {k:016x} ");
    loop {
        let text = console_text(console);
        if let Some(at) = text.find(&needle) {
            if text[at..].contains('\n') {
                return;
            }
        }
        assert!(!running.is_finished(), "the VM ended before read {k}:\n{}", &text[text.len().saturating_sub(400)..]);
        assert!(
            Instant::now() < deadline,
            "no read {k} after {PATIENCE:?}:\n{}",
            &text[text.len().saturating_sub(400)..]
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_clone_continues_a_virtio_blk_queue_from_the_snapshot() {
    use pvisor_vmm::devices::virtio::event_loop::EventLoop;
    use pvisor_vmm::devices::virtio::mmio::MmioTransport;
    use vm_memory::GuestMemoryAtomic;
    common::require_kvm();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let disk = blk_disk(dir.path());
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let paths = SnapshotPaths::in_dir(&snap);

    let mut builder = pvisor_vmm::VmBuilder::new(config()).unwrap();
    let mut events = EventLoop::new().unwrap();
    let reads = std::sync::Arc::default();
    let transport =
        MmioTransport::new(blk_device(&disk, &reads), GuestMemoryAtomic::new(builder.memory().clone())).unwrap();
    events.add(&transport).unwrap();
    let (slot, _) = builder.add_virtio_transport(transport).unwrap();
    assert_eq!(slot.addr, 0xd000_0000, "snapblk drives the first virtio window");
    builder.load_flat(&guest("snapblk")).unwrap();
    let vm = builder.build().unwrap();
    let snapshotter = vm.snapshotter().expect("a VM with a virtio-blk transport can be snapshotted");
    let (handle, console) = (vm.handle(), vm.console());
    let devices = events.spawn("virtio-dev").unwrap();
    let original = run_in_thread(vm);
    wait_for_read(&console, 40, &original);
    handle.pause().unwrap();
    let before = console_text(&console);
    snapshotter.snapshot(&paths).expect("taking the snapshot");
    handle.stop();
    assert_eq!(original.join().unwrap(), VmExit::Stopped);
    drop(devices.stop().expect("the device thread ended cleanly"));
    let at_snapshot = check_blk(&before);

    // A clone over the same disk: its requests continue in the rings where the original's were.
    let clone_reads = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (vm, transports) = snapshot::restore_with_devices(&paths, config(), vec![blk_device(&disk, &clone_reads)])
        .expect("restoring with virtio-blk");
    let mut events = EventLoop::new().unwrap();
    for t in &transports {
        events.add(&t.lock().unwrap()).unwrap();
    }
    let (handle, console) = (vm.handle(), vm.console());
    let devices = events.spawn("virtio-dev").unwrap();
    let clone = run_in_thread(vm);
    let target = at_snapshot + 40;
    wait_for_read(&console, target, &clone);
    handle.stop();
    assert_eq!(clone.join().unwrap(), VmExit::Stopped);
    drop(devices.stop().expect("the clone's device thread ended cleanly"));
    let last = check_blk(&(before + &console_text(&console)));
    assert!(last >= target, "the clone read on to {last}");
    // The device took up the ring where it was: one disk read per request the clone printed
    // (plus, at most, the request in flight at the snapshot and the one in flight at the
    // stop). A queue restored at position 0 would re-serve every earlier request.
    let served = clone_reads.load(std::sync::atomic::Ordering::SeqCst);
    let printed = last - at_snapshot;
    assert!(
        (printed..=printed + 2).contains(&served),
        "the clone's disk served {served} reads for {printed} new requests"
    );
    // A restore given the wrong devices is refused.
    assert!(matches!(snapshot::restore(&paths, config()), Err(snapshot::Error::VirtioCount { snapshot: 1, given: 0 })));
}

/// Reads `count.S`'s counter from a VM's memory.
fn counter(memory: &vm_memory::GuestMemoryMmap) -> u64 {
    use vm_memory::{Bytes, GuestAddress};
    memory.load::<u64>(GuestAddress(0x20_0000), std::sync::atomic::Ordering::SeqCst).unwrap()
}

/// Waits until the counter passes `than`.
fn wait_counter_above(memory: &vm_memory::GuestMemoryMmap, than: u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = counter(memory);
        if now > than {
            return now;
        }
        assert!(Instant::now() < deadline, "the counter stayed at {now}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_two_vcpu_vm_and_a_clone_of_a_clone_keep_counting() {
    // vCPU 1 waits for a startup IPI inside KVM_RUN; its state (MP state included) goes into
    // the snapshot too. A clone is snapshotted again (its RAM is a private file mapping): the
    // second-generation clone sees generation 2 and counts on from its parent's count.
    common::require_kvm();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    std::fs::create_dir(&first).unwrap();
    std::fs::create_dir(&second).unwrap();
    let cfg = VmConfig { vcpus: 2, ..config() };
    let mut builder = pvisor_vmm::VmBuilder::new(cfg).unwrap();
    builder.load_flat(&guest("count")).unwrap();
    let vm = builder.build().unwrap();
    let snapshotter = vm.snapshotter().unwrap();
    let (handle, memory) = (vm.handle(), vm.memory().clone());
    let runner = run_in_thread(vm);
    wait_counter_above(&memory, 1000);
    handle.pause().unwrap();
    let at_first = counter(&memory);
    snapshotter.snapshot(&SnapshotPaths::in_dir(&first)).unwrap();
    handle.stop();
    assert_eq!(runner.join().unwrap(), VmExit::Stopped);

    let clone = snapshot::restore(&SnapshotPaths::in_dir(&first), config()).unwrap();
    assert_eq!(clone.clone_identity().0, 1);
    let snapshotter = clone.snapshotter().unwrap();
    let (handle, memory) = (clone.handle(), clone.memory().clone());
    assert_eq!(counter(&memory), at_first, "the clone starts at the snapshot's count");
    let runner = std::thread::spawn(move || clone.run());
    wait_counter_above(&memory, at_first + 1000);
    handle.pause().unwrap();
    let at_second = counter(&memory);
    snapshotter.snapshot(&SnapshotPaths::in_dir(&second)).unwrap();
    handle.stop();
    assert_eq!(runner.join().unwrap(), VmExit::Stopped);

    let grandchild = snapshot::restore(&SnapshotPaths::in_dir(&second), config()).unwrap();
    assert_eq!(grandchild.clone_identity().0, 2);
    let (handle, memory) = (grandchild.handle(), grandchild.memory().clone());
    assert_eq!(counter(&memory), at_second);
    let runner = std::thread::spawn(move || grandchild.run());
    wait_counter_above(&memory, at_second);
    handle.stop();
    assert_eq!(runner.join().unwrap(), VmExit::Stopped);
}

/// The `VmFlags` of this process's mapping at `addr`.
fn vm_flags_of(addr: u64) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let header = format!("{addr:x}-");
    smaps
        .lines()
        .skip_while(|l| !l.starts_with(&header))
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .expect("the mapping's VmFlags")
        .to_string()
}

#[test]
fn a_vm_with_mergeable_ram_snapshots_and_its_clone_continues() {
    common::require_kvm();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let paths = SnapshotPaths::in_dir(dir.path());
    let mergeable = || VmConfig { mergeable: true, ..config() };

    let mut builder = pvisor_vmm::VmBuilder::new(mergeable()).unwrap();
    builder.load_flat(&guest("snapcount")).unwrap();
    let vm = builder.build().unwrap();
    assert_eq!(vm.ram().backing(), pvisor_vmm::memory::Backing::Anonymous);
    assert!(vm.ram().fd().is_none(), "anonymous RAM has no fd to share");
    assert!(vm_flags_of(ram_addr(&vm)).split_whitespace().any(|f| f == "mg"), "booted RAM is MADV_MERGEABLE");
    let snapshotter = vm.snapshotter().expect("a VM with anonymous RAM can be snapshotted");
    let (handle, console) = (vm.handle(), vm.console());
    let original = run_in_thread(vm);
    wait_for_step(&console, 300, &original);
    handle.pause().unwrap();
    let before = console_text(&console);
    let info = snapshotter.snapshot(&paths).expect("taking the snapshot");
    println!("snapshot of anonymous RAM: {info:?}");
    handle.stop();
    assert_eq!(original.join().unwrap(), VmExit::Stopped);
    let at_snapshot = check(&before);
    assert_eq!(info.memory_scanned, config().memory_bytes, "anonymous RAM is scanned whole");
    assert!(info.memory_written >= 8 << 20, "the 8 MiB fill is in the memory file ({} bytes)", info.memory_written);
    assert!(info.memory_written < 16 << 20, "zero pages were not written ({} bytes)", info.memory_written);

    // A clone restored with `mergeable`: its private mapping is marked, and it continues.
    let vm = snapshot::restore(&paths, mergeable()).expect("restoring the snapshot of anonymous RAM");
    assert_eq!(vm.ram().backing(), pvisor_vmm::memory::Backing::PrivateFile);
    assert!(vm_flags_of(ram_addr(&vm)).split_whitespace().any(|f| f == "mg"), "restored RAM marked mergeable");
    let (handle, console) = (vm.handle(), vm.console());
    let (_, seed) = vm.clone_identity();
    let runner = run_in_thread(vm);
    let target = at_snapshot.last_step + 300;
    wait_for_step(&console, target, &runner);
    handle.pause().unwrap();
    let t = check(&(before + &console_text(&console)));
    assert!(t.last_step >= target, "the clone continued the sequence to step {}", t.last_step);
    assert_eq!(t.gens[1..], [GenLine { generation: 1, seed: hex_seed(&seed), sum: fill_sum() }]);
    handle.stop();
    assert_eq!(runner.join().unwrap(), VmExit::Stopped);
}

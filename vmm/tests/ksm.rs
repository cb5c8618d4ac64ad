//! KSM merges mergeable guest RAM (`VmConfig::mergeable`) across VMs, and not the memfd.
//!
//! Four VMs in this one process run the `ksmfill` guest (`guests/ksmfill.S`: 8 MiB of one
//! non-zero pattern, then a halt): two with mergeable (private anonymous, `MADV_MERGEABLE`) RAM,
//! two with the default memfd. With the host's ksmd turned on for the test (root; the settings
//! are restored afterwards, also on failure), the mergeable pair's fill must end up merged (the
//! `KSM:` line of its mapping in `/proc/self/smaps`, and `/proc/self/ksm_merging_pages`) while
//! the memfd pair's mappings hold no KSM page. Then the test writes a unique word into every
//! page of every VM's fill through the host mapping (breaking the merged pages'
//! copy-on-write) and checks each page holds its own word and the pattern, nothing else.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{config, guest};
use pvisor_vmm::devices::console::SharedConsole;
use pvisor_vmm::{VmConfig, VmExit, VmHandle};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const FILL: u64 = 0x40_0000;
const FILL_PAGES: u64 = (0xc0_0000 - FILL) / 4096;
const PATTERN: u64 = 0x6b73_6d2d_6669_6c6c;
/// A bound on the wait for the guests and for ksmd, so a broken setup fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);
const KSM: &str = "/sys/kernel/mm/ksm";

/// Turns ksmd on (fast) and puts its previous settings back when dropped.
struct KsmOn {
    saved: Vec<(&'static str, String)>,
}

impl KsmOn {
    fn new() -> KsmOn {
        let mut guard = KsmOn { saved: Vec::new() };
        for (knob, value) in [("pages_to_scan", "1000"), ("sleep_millisecs", "20"), ("run", "1")] {
            let path = Path::new(KSM).join(knob);
            let old = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if old.trim() != value {
                std::fs::write(&path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                guard.saved.push((knob, old.trim().to_string()));
            }
        }
        guard
    }
}

impl Drop for KsmOn {
    fn drop(&mut self) {
        // `run` last in, first out: ksmd stops before its pace is put back.
        for (knob, old) in self.saved.iter().rev() {
            let _ = std::fs::write(Path::new(KSM).join(knob), old);
        }
    }
}

/// A running `ksmfill` VM.
struct Filled {
    name: &'static str,
    handle: VmHandle,
    console: SharedConsole,
    runner: std::thread::JoinHandle<VmExit>,
    memory: GuestMemoryMmap,
    /// Host address of the fill's first page.
    fill_host: u64,
}

fn start(name: &'static str, mergeable: bool) -> Filled {
    let mut builder = pvisor_vmm::VmBuilder::new(VmConfig { mergeable, ..config() }).unwrap();
    builder.load_flat(&guest("ksmfill")).unwrap();
    let vm = builder.build().unwrap();
    let (host_start, host_len) = (vm.ram().regions()[0].2, vm.ram().regions()[0].1);
    assert!(host_len >= 0xc0_0000, "the fill lies in the first RAM region");
    let (handle, console, memory) = (vm.handle(), vm.console(), vm.memory().clone());
    let runner = std::thread::spawn(move || vm.run());
    Filled { name, handle, console, runner, memory, fill_host: host_start + FILL }
}

fn wait_filled(vm: &Filled) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = String::from_utf8_lossy(&vm.console.lock().unwrap().contents()).into_owned();
        if text == "ksmfill\nfilled\n" {
            return;
        }
        assert!(!vm.runner.is_finished(), "VM {} ended before its fill: {text:?}", vm.name);
        assert!(Instant::now() < deadline, "VM {} did not fill in {PATIENCE:?}: {text:?}", vm.name);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `KSM:` bytes of this process's mapping that contains `addr`.
fn ksm_bytes_of(addr: u64) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_vma = false;
    let mut found = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.ends_with(':') {
            if in_vma && first == "KSM:" {
                found = line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).map(|kb| kb * 1024);
            }
        } else if let Some((start, end)) = first.split_once('-') {
            let range = u64::from_str_radix(start, 16).ok().zip(u64::from_str_radix(end, 16).ok());
            in_vma = range.is_some_and(|(s, e)| (s..e).contains(&addr));
        }
    }
    found.expect("the mapping's KSM: line in smaps (kernel 6.6+)")
}

fn merging_pages() -> u64 {
    std::fs::read_to_string("/proc/self/ksm_merging_pages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .expect("/proc/self/ksm_merging_pages")
}

#[test]
fn ksm_merges_mergeable_guest_ram_across_vms_and_not_the_memfd() {
    common::require_kvm();
    if !pvisor_testkit::require_root("turning the host's ksmd on") {
        return;
    }
    if pvisor_testkit::require(Path::new(KSM).join("run").exists().then_some(()), "no KSM (CONFIG_KSM) in this kernel")
        .is_none()
    {
        return;
    }
    let _ksm = KsmOn::new();
    let vms = [start("merge-a", true), start("merge-b", true), start("memfd-a", false), start("memfd-b", false)];
    for vm in &vms {
        wait_filled(vm);
    }
    let fill_bytes = FILL_PAGES * 4096;

    // The mergeable pair's fill merges (>= 90% of its pages); the memfd pair's does not.
    let deadline = Instant::now() + PATIENCE;
    let started = Instant::now();
    let ksm = loop {
        let ksm: Vec<u64> = vms.iter().map(|vm| ksm_bytes_of(vm.fill_host)).collect();
        if ksm[..2].iter().all(|&b| b * 10 >= fill_bytes * 9) {
            break ksm;
        }
        assert!(Instant::now() < deadline, "the mergeable fill not merged after {PATIENCE:?}: KSM bytes {ksm:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "merged after {:?}: KSM bytes per VM {ksm:?} (fill {fill_bytes} B each), ksm_merging_pages {}",
        started.elapsed(),
        merging_pages()
    );
    assert_eq!(ksm[2..], [0, 0], "memfd (shmem) guest RAM is never merged");
    assert!(merging_pages() * 10 >= 2 * FILL_PAGES * 9, "the process's merged pages cover both fills");

    // Unique words through the host mapping: every merged page gets its own copy again.
    let word = |vm: usize, page: u64| ((vm as u64) << 32 | page).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for (i, vm) in vms.iter().enumerate() {
        for page in 0..FILL_PAGES {
            vm.memory.write_obj(word(i, page), GuestAddress(FILL + page * 4096 + 8 * (page % 512))).unwrap();
        }
    }
    let mut buf = vec![0u8; 4096];
    for (i, vm) in vms.iter().enumerate() {
        for page in 0..FILL_PAGES {
            vm.memory.read_slice(&mut buf, GuestAddress(FILL + page * 4096)).unwrap();
            for (k, chunk) in buf.chunks_exact(8).enumerate() {
                let got = u64::from_le_bytes(chunk.try_into().unwrap());
                let want = if k as u64 == page % 512 { word(i, page) } else { PATTERN };
                assert_eq!(got, want, "VM {} page {page} word {k}", vm.name);
            }
        }
    }
    println!(
        "after the unique writes: KSM bytes per VM {:?}",
        vms.iter().map(|vm| ksm_bytes_of(vm.fill_host)).collect::<Vec<_>>()
    );

    for vm in vms {
        vm.handle.stop();
        assert_eq!(vm.runner.join().unwrap(), VmExit::Stopped, "VM {}", vm.name);
    }
}

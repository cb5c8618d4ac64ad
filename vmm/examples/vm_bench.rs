//! The VMM's side of `bench/run vm`: machine-readable samples for the harness.
//!
//! ```text
//! vm_bench first-exit [--runs N] [--memory-mib M]
//!     N samples of open /dev/kvm -> first exit (pvisor_vmm::bench::time_to_first_exit),
//!     printed as one JSON line: {"mode":"first_exit","runs":N,"memory_mib":M,"samples_us":[..]}.
//! vm_bench hold [--memory-mib M] [--touch-mib T]
//!     Builds one VM whose guest writes one byte into every page of T MiB (from 2 MiB up),
//!     signals the harness through a port write and halts. Prints one JSON line with this
//!     process's pid once the guest is halted, then keeps the guest halted until stdin closes,
//!     so the harness can read /proc/PID/smaps while a guest runs. The guest-RAM mapping is the
//!     memfd named "pvisor-guest-ram"; the harness subtracts it.
//!
//! vm_bench snapshot [--runs N] [--memory-mib M] [--touch-mib T] [--clones C] [--dir DIR]
//!     Boots a guest that touches T MiB of its M MiB and prints on the serial port, snapshots
//!     it into DIR (default: a fresh directory under the temp dir, removed afterwards), then
//!     times N restores to the clone's first serial byte (the memory file warm in the page
//!     cache, as for a template; teardown excluded). Then snapshots an idle variant (prints
//!     once and halts) and keeps C clones of it restored at once, reporting each clone's
//!     guest-RAM mapping (Rss, private) and this process's Rss/Pss growth per clone. One JSON
//!     line: {"mode":"snapshot",...,"restore_first_byte_us":[..],"idle_clones":{..}}.
//! ```
//!
//! Statistics are the harness's job: this prints raw samples only.

use std::io::Read;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use pvisor_vmm::bus::BusDevice;
use pvisor_vmm::{VmBuilder, VmConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The port the hold guest writes once it has touched its pages.
const READY_PORT: u16 = 0x502;
/// Where the hold guest starts touching (above the flat image at 1 MiB).
const TOUCH_START: u64 = 2 << 20;

/// The hold guest, for `pages` pages (patched into the `mov ecx` immediate):
/// ```text
///   mov edi, 0x200000        bf 00 00 20 00
///   mov ecx, PAGES           b9 xx xx xx xx
/// 1:mov byte [rdi], 1        c6 07 01
///   add rdi, 0x1000          48 81 c7 00 10 00 00
///   dec ecx                  ff c9
///   jnz 1b                   75 f2
///   mov dx, 0x502            66 ba 02 05
///   out dx, al               ee
/// 2:hlt                      f4
///   jmp 2b                   eb fd
/// ```
fn hold_guest(pages: u32) -> Vec<u8> {
    let mut code = vec![0xbf, 0x00, 0x00, 0x20, 0x00, 0xb9];
    code.extend_from_slice(&pages.to_le_bytes());
    code.extend_from_slice(&[
        0xc6, 0x07, 0x01, 0x48, 0x81, 0xc7, 0x00, 0x10, 0x00, 0x00, 0xff, 0xc9, 0x75, 0xf2, 0x66, 0xba, 0x02, 0x05,
        0xee, 0xf4, 0xeb, 0xfd,
    ]);
    code
}

/// Set once the guest writes [`READY_PORT`]. A condvar, not a channel: the write is handled
/// on the vCPU thread under its seccomp filter, where only futex waits and wakes are allowed.
#[derive(Default)]
struct Ready {
    done: Mutex<bool>,
    cond: Condvar,
}

struct ReadyPort(Arc<Ready>);

impl BusDevice for ReadyPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {
        *self.0.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.cond.notify_all();
    }
}

/// `--name VALUE` options after the mode, with defaults.
fn option(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            let value = args.get(i + 1).ok_or_else(|| format!("{name} needs a value"))?;
            Ok(value.parse().map_err(|e| format!("{name} {value}: {e}"))?)
        }
    }
}

fn first_exit(args: &[String]) -> Result<()> {
    let runs = option(args, "--runs", 100)?;
    let memory_mib = option(args, "--memory-mib", 32)?;
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let mut samples = Vec::new();
    for _ in 0..runs {
        let elapsed = pvisor_vmm::bench::time_to_first_exit(None, memory_mib << 20)?;
        samples.push(format!("{:.1}", elapsed.as_secs_f64() * 1e6));
    }
    println!(
        "{{\"mode\":\"first_exit\",\"runs\":{runs},\"memory_mib\":{memory_mib},\"samples_us\":[{}]}}",
        samples.join(",")
    );
    Ok(())
}

fn hold(args: &[String]) -> Result<()> {
    let memory_mib = option(args, "--memory-mib", 128)?;
    let touch_mib = option(args, "--touch-mib", 64)?;
    // The touched range starts at 2 MiB and must end below both RAM's end and the 3 GiB MMIO gap.
    let max_touch = memory_mib.min(3 << 10).saturating_sub(TOUCH_START >> 20);
    if touch_mib == 0 || touch_mib > max_touch {
        return Err(format!("--touch-mib must be 1..={max_touch} for --memory-mib {memory_mib}").into());
    }
    let pages = u32::try_from((touch_mib << 20) / 4096)?;

    let start = Instant::now();
    let ready = Arc::new(Ready::default());
    let mut builder = VmBuilder::new(VmConfig { memory_bytes: memory_mib << 20, ..VmConfig::default() })?;
    builder.add_pio_device(READY_PORT, 1, Arc::new(Mutex::new(ReadyPort(ready.clone()))))?;
    builder.load_flat(&hold_guest(pages))?;
    let vm = builder.build()?;
    let handle = vm.handle();
    let runner = std::thread::spawn(move || vm.run());

    let mut done = ready.done.lock().unwrap_or_else(|p| p.into_inner());
    while !*done && !runner.is_finished() {
        done =
            ready.cond.wait_timeout(done, std::time::Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
    }
    let is_ready = *done;
    drop(done);
    if !is_ready {
        let exit = runner.join().map_err(|_| "the VM thread panicked")?;
        return Err(format!("the hold guest ended before it was ready: {exit:?}").into());
    }
    println!(
        "{{\"mode\":\"hold\",\"pid\":{},\"memory_mib\":{memory_mib},\"touch_mib\":{touch_mib},\
         \"guest_ram_name\":\"pvisor-guest-ram\",\"ready_ms\":{:.2}}}",
        std::process::id(),
        start.elapsed().as_secs_f64() * 1e3
    );
    // Hold until the harness has read what it needs and closes stdin.
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    handle.stop();
    let exit = runner.join().map_err(|_| "the VM thread panicked")?;
    let exit = format!("{exit:?}").replace('\\', "\\\\").replace('"', "\\\"");
    println!("{{\"mode\":\"hold_end\",\"exit\":\"{exit}\"}}");
    Ok(())
}

/// `(Rss, Private_Clean + Private_Dirty)` in KiB of this process's mapping starting at `addr`.
fn mapping_kib(addr: u64) -> Result<(u64, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let (mut inside, mut rss, mut private) = (false, 0, 0);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        let kib = || line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first.strip_suffix(':') {
            Some("Rss") if inside => rss = kib(),
            Some("Private_Clean") | Some("Private_Dirty") if inside => private += kib(),
            Some(_) => {}
            None => {
                if let Some((start, _)) = first.split_once('-') {
                    inside = u64::from_str_radix(start, 16) == Ok(addr);
                }
            }
        }
    }
    Ok((rss, private))
}

/// `(Rss, Pss)` of this process in KiB.
fn rollup_kib() -> Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup")?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((field("Rss:"), field("Pss:")))
}

fn snapshot(args: &[String]) -> Result<()> {
    use pvisor_vmm::bench;
    use pvisor_vmm::snapshot::SnapshotPaths;
    let runs = option(args, "--runs", 100)?;
    let memory_mib = option(args, "--memory-mib", 128)?;
    let touch_mib = option(args, "--touch-mib", 64)?;
    let clones = option(args, "--clones", 10)?;
    if runs == 0 || touch_mib == 0 || touch_mib + 2 > memory_mib {
        return Err("--runs must be >= 1 and --touch-mib 1..=(--memory-mib - 2)".into());
    }
    let dir = match args.iter().position(|a| a == "--dir") {
        Some(i) => std::path::PathBuf::from(args.get(i + 1).ok_or("--dir needs a value")?),
        None => std::env::temp_dir().join(format!("pvisor-vm-bench-{}", std::process::id())),
    };
    let pages = u32::try_from((touch_mib << 20) / 4096)?;
    let (busy, idle) = (dir.join("busy"), dir.join("idle"));
    std::fs::create_dir_all(&busy)?;
    std::fs::create_dir_all(&idle)?;

    let busy_paths = SnapshotPaths::in_dir(&busy);
    let start = Instant::now();
    let info = bench::snapshot_serial_loop(&busy_paths, memory_mib << 20, pages, false)?;
    let snapshot_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut samples = Vec::new();
    for _ in 0..runs {
        let clone = bench::restore_to_first_byte(&busy_paths)?;
        samples.push(format!("{:.1}", clone.first_byte.as_secs_f64() * 1e6));
        clone.handle.stop();
        clone.runner.join().map_err(|_| "a clone's VM thread panicked")?;
    }

    let idle_paths = SnapshotPaths::in_dir(&idle);
    bench::snapshot_serial_loop(&idle_paths, memory_mib << 20, pages, true)?;
    let (rss_before, pss_before) = rollup_kib()?;
    let mut live = Vec::new();
    for _ in 0..clones {
        live.push(bench::restore_clone(&idle_paths, false)?);
    }
    // Let every clone reach its halt (it has at most a few instructions to run).
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (rss_after, pss_after) = rollup_kib()?;
    let mut per_clone = Vec::new();
    for clone in &live {
        let (rss, private) = mapping_kib(clone.ram_host_addr)?;
        per_clone.push(format!("{{\"guest_rss_kib\":{rss},\"guest_private_kib\":{private}}}"));
    }
    for clone in live {
        clone.handle.stop();
        clone.runner.join().map_err(|_| "a clone's VM thread panicked")?;
    }
    if !args.iter().any(|a| a == "--dir") {
        std::fs::remove_dir_all(&dir)?;
    }
    println!(
        "{{\"mode\":\"snapshot\",\"runs\":{runs},\"memory_mib\":{memory_mib},\"touch_mib\":{touch_mib},\
         \"snapshot\":{{\"ms\":{snapshot_ms:.2},\"state_bytes\":{},\"memory_written\":{},\"memory_scanned\":{},\"missing\":{}}},\
         \"restore_first_byte_us\":[{}],\
         \"idle_clones\":{{\"count\":{clones},\"process_rss_kib\":[{rss_before},{rss_after}],\"process_pss_kib\":[{pss_before},{pss_after}],\"per_clone\":[{}]}}}}",
        info.state_bytes,
        info.memory_written,
        info.memory_scanned,
        info.missing.len(),
        samples.join(","),
        per_clone.join(",")
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("first-exit") => first_exit(&args[1..]),
        Some("hold") => hold(&args[1..]),
        Some("snapshot") => snapshot(&args[1..]),
        _ => Err("usage: vm_bench first-exit [--runs N] [--memory-mib M] | hold [--memory-mib M] [--touch-mib T] \
                  | snapshot [--runs N] [--memory-mib M] [--touch-mib T] [--clones C] [--dir DIR]"
            .into()),
    }
}

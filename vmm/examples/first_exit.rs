//! Time from opening `/dev/kvm` to the first exit of a test guest, over many runs.
//!
//! `cargo run --release -p pvisor-vmm --example first_exit [RUNS [MEMORY_MIB]]` prints P50, P90, min and
//! max in milliseconds. Each run builds a fresh VM (32 MiB of memfd RAM by default, irqchip, PIT, serial),
//! loads [`pvisor_vmm::bench::FIRST_EXIT_GUEST`] and runs it to its first exit, with the vCPU
//! seccomp filter on; see [`pvisor_vmm::bench::time_to_first_exit`].

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 100,
    };
    if runs == 0 {
        return Err("RUNS must be at least 1".into());
    }
    let memory: u64 = match std::env::args().nth(2) {
        Some(arg) => arg.parse::<u64>()? << 20,
        None => 32 << 20,
    };
    let mut samples: Vec<Duration> = Vec::with_capacity(runs);
    for _ in 0..runs {
        samples.push(pvisor_vmm::bench::time_to_first_exit(None, memory)?);
    }
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pct = |p: usize| samples[(samples.len() - 1) * p / 100];
    println!(
        "open /dev/kvm -> first exit over {runs} runs ({} MiB): p50 {:.2} ms, p90 {:.2} ms, min {:.2} ms, max {:.2} ms",
        memory >> 20,
        ms(pct(50)),
        ms(pct(90)),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
    Ok(())
}

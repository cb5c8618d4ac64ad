//! Ending the guest: the VMM treats the guest's reset as the end of the
//! sandbox (`reboot=t` on the command line makes `reboot(RB_AUTOBOOT)` a
//! triple fault; QEMU's `-no-reboot` and pvisor's VMM then exit), so a
//! failed boot powers off with its reason on the console instead of
//! panicking the kernel.
use super::console;
use super::error::GuestError;

/// Kills every other process, syncs the disks and resets the machine.
///
/// Outside PID 1 (tests, the ns backend) it only exits the process: nothing
/// here may reboot the host.
pub fn poweroff() -> ! {
    if nix::unistd::getpid().as_raw() != 1 {
        console::line("power off asked outside PID 1: exiting instead");
        std::process::exit(1);
    }
    // Signal -1 from init reaches every process but init itself.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
    nix::unistd::sync();
    let e = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT).unwrap_err();
    // Init exiting panics the kernel; `panic=-1` then resets the machine too.
    console::line(&format!("reboot: {e}; exiting init"));
    std::process::exit(1);
}

/// Reports `err` on the console and powers off.
pub fn fatal(err: &GuestError) -> ! {
    console::line(&format!("boot failed: {err}"));
    poweroff()
}

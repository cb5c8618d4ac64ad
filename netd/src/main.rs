//! pvisor-netd (see the library's documentation for the process contract).
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use pvisor_netd::control::{self, Control};
use pvisor_netd::judge::PolicyJudges;
use pvisor_netd::{jail, CONTROL_FD};

/// The host's resolvers, read before the jail hides the file: the upstream
/// when NetConfig names none.
fn host_resolvers() -> Vec<SocketAddr> {
    let Ok(text) = std::fs::read_to_string("/etc/resolv.conf") else { return Vec::new() };
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn main() -> ExitCode {
    // SAFETY: fcntl F_GETFD only asks whether the fd is open.
    if unsafe { libc::fcntl(CONTROL_FD, libc::F_GETFD) } < 0 {
        eprintln!("pvisor-netd: no control socket on fd {CONTROL_FD} (netd is started by pvisor-worker)");
        return ExitCode::from(2);
    }
    // SAFETY: fd 3 is open (checked above) and handed to netd by its parent for
    // netd alone; nothing else in this process owns it.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    let fallback = host_resolvers();
    if let Err(e) = jail::jail() {
        eprintln!("pvisor-netd: {e}");
        return ExitCode::FAILURE;
    }
    match control::serve(Control::new(control), &PolicyJudges, &fallback) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvisor-netd: {e}");
            ExitCode::FAILURE
        }
    }
}

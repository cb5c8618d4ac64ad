//! The guest's network interfaces. `lo` comes up down in a fresh kernel, and
//! sandbox processes (and the agent's tunnels to 127.0.0.1) need it. With
//! `pvisor.net=1` the virtio-net device is `eth0`, wired to the sandbox's
//! network process (netd): it gets the sandbox's address, the MTU the device
//! offers, and the default route through netd's gateway, all from
//! `pvisor_net::plan`, set up with `pvisor_net::iface` as the ns backend's
//! init does.
use super::error::GuestError;
use pvisor_net::plan;
use std::path::Path;
use std::time::{Duration, Instant};

pub use pvisor_net::iface::loopback_up;

/// The MTU when the device offers none (it always does: VIRTIO_NET_F_MTU).
const FALLBACK_MTU: u32 = 1500;
/// How long eth0 may take to appear: virtio-net probes before init runs, so
/// this only matters on a loaded host.
const IFACE_WAIT: Duration = Duration::from_secs(10);

/// True when `lo` is up, read from sysfs (for the self-test).
pub fn loopback_is_up() -> bool {
    is_up("lo")
}

/// True when interface `name` is up, read from sysfs.
pub fn is_up(name: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{name}/flags"))
        .ok()
        .and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|flags| flags & libc::IFF_UP as u32 != 0)
}

/// The MTU of interface `name` as the kernel has it (for virtio-net: what
/// the device offered).
pub fn mtu_of(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?.trim().parse().ok()
}

/// Waits for `eth0`, gives it the sandbox's address and its device's MTU,
/// sets it up and adds the default route through netd.
pub fn configure_eth0() -> Result<u32, GuestError> {
    let sys = format!("/sys/class/net/{}", plan::IFACE);
    let start = Instant::now();
    while !Path::new(&sys).exists() {
        if start.elapsed() >= IFACE_WAIT {
            return Err(GuestError::NoDevice {
                device: format!("{} (pvisor.net=1)", plan::IFACE),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mtu = mtu_of(plan::IFACE).unwrap_or(FALLBACK_MTU);
    pvisor_net::iface::configure(plan::IFACE, plan::SANDBOX_IP, plan::PREFIX_LEN, mtu)
        .map_err(|e| GuestError::io(format!("configure {}", plan::IFACE), e))?;
    pvisor_net::iface::default_route(plan::GATEWAY_IP)
        .map_err(|e| GuestError::io(format!("default route via {}", plan::GATEWAY_IP), e))?;
    Ok(mtu)
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_loopback_reads_up() {
        // Every host running these tests has lo up in its own namespace.
        assert!(super::loopback_is_up());
        assert!(super::mtu_of("lo").is_some_and(|m| m >= 1500));
        assert!(!super::is_up("pvisor-no-such-if"));
    }
}

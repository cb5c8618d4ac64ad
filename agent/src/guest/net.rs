//! The guest's network interfaces: `lo` comes up down in a fresh kernel, and
//! sandbox processes (and the agent's tunnels to 127.0.0.1) need it. Set up
//! with `pvisor_net::iface`, as the ns backend's init does.

pub use pvisor_net::iface::loopback_up;

/// True when `lo` is up, read from sysfs (for the self-test).
pub fn loopback_is_up() -> bool {
    std::fs::read_to_string("/sys/class/net/lo/flags")
        .ok()
        .and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|flags| flags & libc::IFF_UP as u32 != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_loopback_reads_up() {
        // Every host running these tests has lo up in its own namespace.
        assert!(super::loopback_is_up());
    }
}

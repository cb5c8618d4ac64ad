//! What one sandbox may make its netd hold (NetConfig.limits; zero fields
//! take these defaults). Past a limit new flows are refused; nothing grows
//! without bound, so a flooding sandbox only burns its own netd.
use pvisor_proto::net::NetLimits;

/// Concurrent flows (TCP connections, pending connects and UDP flows).
pub const DEFAULT_MAX_FLOWS: usize = 1024;
/// Per direction, per TCP flow (smoltcp's window; ≥ 64 KiB uses window scaling).
pub const DEFAULT_TCP_BUFFER_BYTES: usize = 256 * 1024;
/// TCP flow buffers (both directions) netd hands out at full size in all;
/// flows opened past it get [`SMALL_TCP_BUFFER_BYTES`] per direction, so many
/// concurrent connections still work, slower, and the worst case stays at
/// this plus max_flows × 2 × the small size (64 + 32 MiB by default) instead of
/// max_flows × 2 × the full size (512 MiB).
pub const TCP_MEMORY_BUDGET: usize = 64 << 20;
/// The buffer of a flow opened past [`TCP_MEMORY_BUDGET`].
pub const SMALL_TCP_BUFFER_BYTES: usize = 16 << 10;
/// UDP datagrams per second the sandbox may send (DNS included); excess dropped.
pub const DEFAULT_UDP_PACKETS_PER_SEC: u32 = 20_000;
/// DNS questions forwarded upstream and not answered yet.
pub const MAX_PENDING_DNS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_flows: usize,
    pub tcp_buffer_bytes: usize,
    pub udp_packets_per_sec: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_flows: DEFAULT_MAX_FLOWS,
            tcp_buffer_bytes: DEFAULT_TCP_BUFFER_BYTES,
            udp_packets_per_sec: DEFAULT_UDP_PACKETS_PER_SEC,
        }
    }
}

impl Limits {
    pub fn from_proto(l: Option<&NetLimits>) -> Limits {
        let d = Limits::default();
        let Some(l) = l else { return d };
        let or = |v: u32, d: usize| if v == 0 { d } else { v as usize };
        Limits {
            max_flows: or(l.max_flows, d.max_flows),
            // At least one full frame's worth, so a flow can always make progress.
            tcp_buffer_bytes: or(l.tcp_buffer_bytes, d.tcp_buffer_bytes).max(4096),
            udp_packets_per_sec: if l.udp_packets_per_sec == 0 { d.udp_packets_per_sec } else { l.udp_packets_per_sec },
        }
    }
}

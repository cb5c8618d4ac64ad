//! pvisor-netd: one per sandbox, between the sandbox's link (a tap for ns, a
//! SOCK_SEQPACKET socket to the worker's virtio-net device for vm) and
//! ordinary host sockets, enforcing the sandbox's egress policy.
//!
//! SKELETON: to be written (netd helper).
//!
//! Process contract (pvisor.net.v1.NetdControl): exec'd by the worker as
//! `pvisor-netd` with its control socket (SOCK_SEQPACKET) on fd 3 and
//! nothing else; it waits for `NetdStart` (the link's fd in SCM_RIGHTS),
//! answers every control message with one `NetdReply`, and exits when the
//! control socket closes.

/// netd's control socket, inherited from the worker.
pub const CONTROL_FD: i32 = 3;

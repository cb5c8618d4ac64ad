//! pvisor-netd: one per sandbox, between the sandbox's link (a tap for ns, a
//! SOCK_SEQPACKET socket to the worker's virtio-net device for vm) and
//! ordinary host sockets, enforcing the sandbox's egress policy.
//!
//! Process contract (pvisor.net.v1.NetdControl): exec'd by the worker as
//! `pvisor-netd` with its control socket (SOCK_SEQPACKET) on fd 3 and
//! nothing else; it jails itself ([`jail`]), waits for `NetdStart` (the
//! link's fd in SCM_RIGHTS), answers every control message with one
//! `NetdReply`, and exits when the control socket closes ([`control`]).
//!
//! The data path ([`stack`]): every frame from the link is classified by hand
//! ([`frames`]): ARP for the gateway and resolver and TCP go to smoltcp
//! ([`device`]); DNS ([`dns_proxy`], over TCP [`dns_tcp`], a truncated answer asked again upstream over TCP [`dns_retry`]) and other UDP ([`udp`]) are answered
//! from host sockets without smoltcp, ICMP echo through a ping socket where
//! the host allows one ([`ping`]); a TCP SYN is judged and, if allowed,
//! held until the host connect succeeds ([`tcp`]). Every decision goes
//! through a [`judge::Judge`] so tests can permit what the real policy
//! forbids (loopback servers).
pub mod control;
pub mod device;
pub mod dns_proxy;
pub mod dns_retry;
pub mod dns_tcp;
pub mod error;
pub mod frames;
pub mod hostaddr;
pub mod jail;
pub mod judge;
pub mod limits;
pub mod link;
pub mod names;
pub mod ping;
pub mod slots;
pub mod stack;
pub mod tcp;
pub mod udp;

pub use error::Error;
pub use judge::{Judge, Verdict};
pub use limits::Limits;
pub use stack::Stack;

/// netd's control socket, inherited from the worker.
pub const CONTROL_FD: i32 = 3;

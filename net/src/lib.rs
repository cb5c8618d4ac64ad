//! A pvisor sandbox's network, the parts more than one process needs.
//!
//! * [`plan`]: the addressing plan every sandbox gets (its address, the
//!   gateway and resolver netd plays, the MTU, `/etc/resolv.conf` and
//!   `/etc/hosts`).
//! * [`iface`]: bringing an interface up from inside its network namespace
//!   (ns init, the vm guest's agent): loopback, `eth0`'s address and route.
//! * [`policy`]: the OpenSandbox egress policy: parsing and normalising the
//!   API's JSON (errors name the rule), the `/policy` edits (replace, PATCH
//!   merge, DELETE), `mode`, conversion to and from the proto, and the
//!   decision for one destination ([`policy::judge`]), hard-deny table included.
//! * [`dns`]: the DNS wire format netd needs: queries, NXDOMAIN and empty
//!   answers, the A records (and TTLs) of upstream answers.
//!
//! The broker validates and owns a sandbox's policy; the worker hands it to
//! the sandbox's `pvisor-netd`, which applies [`policy::judge`] to every new
//! flow and every DNS question.
pub mod dns;
pub mod iface;
pub mod plan;
pub mod policy;

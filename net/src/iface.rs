//! Configuring interfaces from inside their network namespace with ioctls
//! (no netlink, no `ip` binary in the image needed).
//!
//! SKELETON: to be written (ns-link helper). Intended API:
//! `loopback_up()`, `configure(name, addr, prefix_len, mtu)` (address,
//! netmask, MTU, up), `default_route(gateway)`.

//! The DNS wire format netd needs (RFC 1035), on byte slices.
//!
//! SKELETON: to be written (netd helper).

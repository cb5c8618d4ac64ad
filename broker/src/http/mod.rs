//! The broker's HTTP front end and what bounds its clients (issue 12's
//! request limits, and the half-open connection flood of its hostile-tenant
//! item 5): [`limits`] (the flags), [`conn`] (the accept loop and hyper's
//! connection settings), [`guard`] (heads, bodies, open streams) and
//! [`admission`] (concurrent creates, sandboxes per server).
pub mod admission;
pub mod conn;
pub mod guard;
pub mod limits;

pub use limits::HttpLimits;

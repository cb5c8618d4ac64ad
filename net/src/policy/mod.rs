//! The OpenSandbox egress policy.
//!
//! SKELETON: to be written (policy helper). The API netd relies on:
//!
//! ```ignore
//! pub enum Action { Allow, Deny }
//! pub enum Target { Ip(IpAddr), Cidr(Cidr), Domain { name: String, wildcard: bool } }
//! pub struct Rule { pub action: Action, pub target: Target }
//! pub struct Policy { pub default_action: Action, pub egress: Vec<Rule> }
//! impl Policy {
//!     pub fn from_proto(p: &pvisor_proto::net::EgressPolicy) -> Result<Policy, PolicyError>;
//!     pub fn to_proto(&self) -> pvisor_proto::net::EgressPolicy;
//!     /// The action for a DNS question: the first domain rule matching `name`, else the default.
//!     pub fn decide_name(&self, name: &str) -> Action;
//! }
//! /// Whether a new flow to `dst` may go, given the names DNS bound to `dst`
//! /// (for this sandbox, unexpired) and whether `dst` is one of the host's own
//! /// addresses (netd finds out). Applies the hard-deny table, the private-range
//! /// rule (only an IP/CIDR rule unlocks them) and first match in list order.
//! pub fn judge(p: &Policy, extra_deny: &[Cidr], dst: IpAddr, names: &[&str], is_host: bool) -> Judgement;
//! pub struct Judgement { pub allow: bool, pub reason: &'static str }
//! ```

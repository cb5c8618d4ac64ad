//! The network part of a sandbox's configuration (`WorkerConfig.net`).
//!
//! `pvisor serve --default-egress allow|none` says what a create without a
//! `networkPolicy` gets: `allow` (the default, as OpenSandbox and E2B) is a
//! network with the allow-all policy, under netd's hard-deny table; `none` is
//! today's loopback-only sandbox, no netd at all. A create with a policy
//! always gets a network. Upstream resolvers come from `--net-dns`, else the
//! host's `/etc/resolv.conf` (netd lives in the host's network namespace, so
//! a 127.0.0.53 stub works). The deny list netd adds to its table holds the
//! broker's listen address and the operator's `--net-deny` entries.
use pvisor_net::policy::{Cidr, Policy};
use pvisor_proto::net::NetConfig;
use std::net::{IpAddr, SocketAddr};

const RESOLV_CONF: &str = "/etc/resolv.conf";
const DNS_PORT: u16 = 53;

/// What a sandbox created without a `networkPolicy` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultEgress {
    /// A network under the allow-all policy (hard-deny table still applies).
    Allow,
    /// No network: loopback only.
    None,
}

/// The server-wide network settings.
#[derive(Clone, Debug)]
pub struct NetSettings {
    pub default_egress: DefaultEgress,
    /// `ip:port` of each upstream resolver.
    pub upstream_dns: Vec<String>,
    /// Addresses and CIDRs no sandbox may reach besides netd's own table.
    pub deny: Vec<String>,
}

impl NetSettings {
    /// Checks the flags; `dns` empty means the host's resolvers.
    pub fn new(
        default_egress: DefaultEgress,
        dns: &[String],
        deny: &[String],
        listen: SocketAddr,
    ) -> Result<Self, String> {
        let upstream_dns = if dns.is_empty() {
            let text = std::fs::read_to_string(RESOLV_CONF).unwrap_or_default();
            let found = host_resolvers(&text);
            if found.is_empty() {
                tracing::warn!("no nameserver in {RESOLV_CONF}: sandboxes cannot resolve names (use --net-dns)");
            }
            found
        } else {
            dns.iter().map(|s| parse_dns(s).map(|a| a.to_string())).collect::<Result<_, _>>()?
        };
        let mut deny_list = Vec::new();
        if !listen.ip().is_unspecified() {
            // Unspecified: every host address, which netd refuses anyway.
            deny_list.push(listen.ip().to_string());
        }
        for d in deny {
            let c = Cidr::parse_ip_or_cidr(d).ok_or_else(|| format!("--net-deny {d:?}: not an address or CIDR"))?;
            deny_list.push(c.to_string());
        }
        Ok(NetSettings { default_egress, upstream_dns, deny: deny_list })
    }

    /// The policy a new sandbox starts with: the create's, else the
    /// default's; `None` means no network.
    pub fn initial_policy(&self, requested: Option<Policy>) -> Option<Policy> {
        match (requested, self.default_egress) {
            (Some(p), _) => Some(p),
            (None, DefaultEgress::Allow) => Some(Policy::allow_all()),
            (None, DefaultEgress::None) => None,
        }
    }

    /// `WorkerConfig.net` of a sandbox with `policy`.
    pub fn config(&self, policy: &Policy) -> NetConfig {
        NetConfig {
            policy: Some(policy.to_proto()),
            upstream_dns: self.upstream_dns.clone(),
            deny: self.deny.clone(),
            limits: None,
        }
    }
}

/// `ADDR` (port 53) or `ADDR:PORT` (`[v6]:PORT` for IPv6).
pub fn parse_dns(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, DNS_PORT)))
        .map_err(|_| format!("--net-dns {s:?}: not ADDR or ADDR:PORT"))
}

/// The `nameserver` entries of a resolv.conf, as `ip:53` (scoped IPv6 ones,
/// which cannot be dialled from elsewhere, are skipped).
pub fn host_resolvers(resolv_conf: &str) -> Vec<String> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next()).flatten()
        })
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, DNS_PORT).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers() {
        let text = "# comment\nsearch example\nnameserver 127.0.0.53\nnameserver  ::1\nnameserver fe80::1%eth0\noptions edns0\n";
        assert_eq!(host_resolvers(text), ["127.0.0.53:53", "[::1]:53"]);
        assert!(host_resolvers("").is_empty());
    }

    #[test]
    fn dns_flags() {
        assert_eq!(parse_dns("198.51.100.53").map(|a| a.to_string()), Ok("198.51.100.53:53".into()));
        assert_eq!(parse_dns("198.51.100.53:5353").map(|a| a.to_string()), Ok("198.51.100.53:5353".into()));
        assert_eq!(parse_dns("::1").map(|a| a.to_string()), Ok("[::1]:53".into()));
        assert_eq!(parse_dns("[::1]:54").map(|a| a.to_string()), Ok("[::1]:54".into()));
        assert!(parse_dns("dns.example").is_err());
    }

    #[test]
    fn deny_list_holds_the_listen_address_and_extras() {
        let listen: SocketAddr = "192.0.2.7:8080".parse().expect("addr");
        let s = NetSettings::new(
            DefaultEgress::Allow,
            &["192.0.2.53".into()],
            &["203.0.113.0/24".into(), "198.51.100.1".into()],
            listen,
        )
        .expect("valid");
        assert_eq!(s.deny, ["192.0.2.7", "203.0.113.0/24", "198.51.100.1/32"]);
        assert_eq!(s.upstream_dns, ["192.0.2.53:53"]);
        let any: SocketAddr = "0.0.0.0:8080".parse().expect("addr");
        assert!(NetSettings::new(DefaultEgress::Allow, &["192.0.2.53".into()], &[], any)
            .expect("valid")
            .deny
            .is_empty());
        assert!(NetSettings::new(DefaultEgress::Allow, &["192.0.2.53".into()], &["nope".into()], listen).is_err());
    }

    #[test]
    fn default_egress() {
        let listen: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let allow = NetSettings::new(DefaultEgress::Allow, &["192.0.2.53".into()], &[], listen).expect("valid");
        let none = NetSettings { default_egress: DefaultEgress::None, ..allow.clone() };
        assert_eq!(allow.initial_policy(None), Some(Policy::allow_all()));
        assert_eq!(none.initial_policy(None), None);
        assert_eq!(none.initial_policy(Some(Policy::deny_all())), Some(Policy::deny_all()));
        let cfg = allow.config(&Policy::deny_all());
        assert_eq!(cfg.upstream_dns, ["192.0.2.53:53"]);
        assert_eq!(cfg.deny, ["127.0.0.1"]);
        assert_eq!(cfg.policy.map(|p| Policy::from_proto(&p)), Some(Ok(Policy::deny_all())));
    }
}

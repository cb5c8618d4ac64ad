"""The private internet's addresses and DNS names: one table shared by the servers,
the checks, the e2e suite and the bench.

The host<->namespace link is 198.18.0.0/24 (RFC 2544 benchmarking space), not
192.0.2.0/24: on these hosts 192.0.2.0/24 is the host's own uplink (eth0 is
192.0.2.2 with its gateway at 192.0.2.1), so putting 192.0.2.1 on a veth would
cut the host off. PVISOR_NETWORLD_LINK overrides it (a /24 network address).
"""
from __future__ import annotations

import ipaddress
import os

NETNS = "pvisor-networld"
VETH_HOST = "nw-host"
VETH_INET = "nw-inet"
STATE_DIR = os.environ.get("PVISOR_NETWORLD_STATE", "/run/pvisor-networld")

_LINK = ipaddress.ip_network(os.environ.get("PVISOR_NETWORLD_LINK", "198.18.0.0/24"))
LINK_PREFIX = _LINK.prefixlen
LINK_HOST = str(_LINK.network_address + 1)   # the host's end: a host address sandboxes must not reach
LINK_INET = str(_LINK.network_address + 254)  # the namespace's end: the routes' next hop

# Web hosts: HTTP :80, TLS :443, TCP echo :5432, UDP echo :9999 on every one of them.
WEB_A = "203.0.113.10"      # allowed.test, cdn.test
WEB_B = "203.0.113.20"      # denied.test
WILD_APEX = "203.0.113.30"  # wild.test
WILD_A = "203.0.113.31"     # a.wild.test
WILD_BC = "203.0.113.32"    # b.c.wild.test
WEB_HOSTS = [WEB_A, WEB_B, WILD_APEX, WILD_A, WILD_BC]
DNS = "198.51.100.53"
# Routed from the host via LINK_INET: each address alone (/32), never the whole /24s. On
# these hosts the package registries' proxy itself sits at 203.0.113.80 (deb.debian.org,
# pypi.org, crates.io resolve to it), so routing 203.0.113.0/24 into the world would cut the
# host off from them; world.up() also refuses to start if a registry resolves to one of these.
ROUTED = [f"{a}/32" for a in [*WEB_HOSTS, DNS]]

HTTP_PORT = 80
TLS_PORT = 443
TCP_ECHO_PORT = 5432
UDP_ECHO_PORT = 9999
DNS_PORT = 53

TTL = 5
REBIND_TARGET = "10.0.0.5"       # a private address behind a public-looking name
METADATA = "169.254.169.254"     # cloud metadata

# A records the DNS server answers; any other name is NXDOMAIN.
RECORDS: dict[str, str] = {
    "allowed.test": WEB_A,
    "denied.test": WEB_B,
    "wild.test": WILD_APEX,
    "a.wild.test": WILD_A,
    "b.c.wild.test": WILD_BC,
    "rebind.test": REBIND_TARGET,
    "meta.test": METADATA,
    "cdn.test": WEB_A,
}

# The 100 MiB payload of the bench: GET /bytes/104857600 (or /100m) on any web host.
BIG = 100 << 20

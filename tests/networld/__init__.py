"""networld: a private test "internet" in a network namespace, for pvisor's network tests.

`world.py` builds and tears down the namespace, its veth link and the host's routes;
`servers.py` runs inside it (HTTP, TLS, TCP and UDP echo, DNS); `addresses.py` is the
one table of names and addresses that the servers, the checks, the e2e suite and the
bench share. See README.md.
"""

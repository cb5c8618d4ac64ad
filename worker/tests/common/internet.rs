//! A private "internet" for the network tests, without the real one: a
//! network namespace joined to the host's by a veth pair on a /30 of
//! 198.18.0.0/15 (the benchmarking range: public to the policy, routed
//! nowhere), holding a TCP server on port 8080 (it answers a line with
//! [`BODY`]) and a DNS server on port 53 of its address. The sandbox reaches it only through netd, which connects
//! from the host's namespace like any host process.
#![allow(dead_code)]
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// What the TCP server answers every line with.
pub const BODY: &str = "hello from the private internet\n";
/// The name the DNS server resolves to the server's address (others: NXDOMAIN).
pub const NAME: &str = "web.test";

pub struct Internet {
    netns: String,
    veth: String,
    /// The server's address (the host's end of the veth is `.1` of the /30).
    pub server: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Internet {
    pub fn new() -> Internet {
        // A /30 per Internet of this process, a second octet per process, so
        // parallel tests and test processes do not share a subnet.
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(n < 64, "too many private internets in one test process");
        let pid = std::process::id();
        let c = (pid % 256) as u8;
        let d = n * 4;
        let tag = format!("{:05x}{n:x}", pid & 0xfffff);
        let (netns, veth, peer) = (format!("pvt-{tag}"), format!("pvh{tag}"), format!("pvs{tag}"));
        let host = Ipv4Addr::new(198, 18 + (pid >> 8) as u8 % 2, c, d + 1);
        let server = Ipv4Addr::new(host.octets()[0], host.octets()[1], c, d + 2);
        ip(&["netns", "add", &netns]);
        let me = Internet { netns, veth, server };
        ip(&["link", "add", &me.veth, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &me.netns]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &me.veth]);
        ip(&["link", "set", &me.veth, "up"]);
        ip(&["-n", &me.netns, "addr", "add", &format!("{server}/30"), "dev", &peer]);
        ip(&["-n", &me.netns, "link", "set", &peer, "up"]);
        ip(&["-n", &me.netns, "link", "set", "lo", "up"]);
        me.serve();
        me
    }

    /// The sandbox's shell command that asks the TCP server at `host`
    /// (busybox nc: busybox wget crashes on these hosts).
    pub fn ask(host: &str) -> String {
        format!("echo hi | nc -w 10 {host} 8080")
    }

    /// The same, the server found by [`NAME`] through the sandbox's
    /// resolver (netd) with nslookup: the static busybox's nc cannot
    /// resolve names itself (no NSS in the image).
    pub fn ask_by_name() -> String {
        let lookup = format!("nslookup {NAME} | awk '$1 == \"Address:\" && $2 !~ /:53$/ {{print $2}}' | tail -1");
        Internet::ask(&format!("\"$({lookup})\""))
    }

    /// `ip:53` of the DNS server, for NetConfig.upstream_dns.
    pub fn dns(&self) -> String {
        format!("{}:53", self.server)
    }

    /// Binds the servers inside the namespace (from a thread that joined
    /// it: a socket stays in the namespace it was made in) and serves them
    /// from threads that live as long as the test process.
    fn serve(&self) {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.netns)).unwrap();
        let server = self.server;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a namespace fd we own.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            let web = TcpListener::bind((server, 8080)).unwrap();
            let dns = UdpSocket::bind((server, 53)).unwrap();
            super::frames::stand_in_upstream(dns, NAME, server);
            tx.send(()).unwrap();
            for conn in web.incoming() {
                let Ok(mut c) = conn else { continue };
                std::thread::spawn(move || {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.contains(&b'\n') {
                        match c.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = c.write_all(BODY.as_bytes());
                });
            }
        });
        rx.recv().expect("the servers of the private internet");
    }
}

impl Drop for Internet {
    /// Deleting the host's end deletes the pair; the namespace's name goes
    /// (the namespace itself lives on with the server threads, unreachable).
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.veth]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

//! The worker's side of netd's process contract ([`pvisor_worker::netd`])
//! against the real pvisor-netd, over a SOCK_SEQPACKET link (the vm
//! backend's kind): the process it starts (no capabilities, nothing but fds
//! 0-3, stdin and stdout /dev/null, a session of its own); a start netd
//! refuses (an invalid policy) and one it accepts; the configuration and a
//! policy change arriving (seen in DNS answers through the link, from a
//! stand-in upstream); stats; netd's death (SIGKILL) and a missing netd.
//!
//! Needs root (for the capability checks to mean something) and the real
//! netd (`$PVISOR_DIST/pvisor-netd` or `$PVISOR_NETD`).
use pvisor_proto::net::{Action, EgressPolicy, EgressRule, LinkKind, NetConfig};
use pvisor_worker::backend::NetLink;
use pvisor_worker::netd::{Netd, NetdError};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::frames;

fn status_field(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in status"));
    line[key.len()..].trim().to_owned()
}

fn rule(action: Action, target: &str) -> EgressRule {
    EgressRule { action: action as i32, target: target.into() }
}

fn policy(default: Action, rules: Vec<EgressRule>) -> EgressPolicy {
    EgressPolicy { default_action: default as i32, egress: rules }
}

fn seqpacket_link() -> (NetLink, OwnedFd) {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    (NetLink { fd: a, kind: LinkKind::LinkSeqpacket }, b)
}

/// Asks netd's resolver (10.0.2.3:53) for `name` over the link and returns
/// the answer's response code (netd's own, or the upstream's relayed).
fn ask(sandbox: &OwnedFd, id: u16, name: &str) -> u8 {
    let port = 40000 + id;
    let dst = SocketAddrV4::new(pvisor_net::plan::DNS_IP, 53);
    nix::unistd::write(sandbox, &frames::udp_frame(port, dst, &frames::dns_query(id, name))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = vec![0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no answer for {name} through the link");
        let mut p = libc::pollfd { fd: sandbox.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll reads and writes the one pollfd we own.
        if unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) } <= 0 {
            continue;
        }
        let n = nix::unistd::read(sandbox.as_raw_fd(), &mut buf).unwrap();
        if let Some(msg) = frames::udp_payload_to(&buf[..n], port) {
            assert_eq!(&msg[..2], id.to_be_bytes(), "the answer carries the sandbox's id");
            return frames::rcode(msg);
        }
    }
}

#[test]
fn the_real_netd_refuses_starts_answers_and_dies() {
    let Some(exe) = common::netd_exe() else { return };
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (it checks that netd gets no capabilities)");

    // Before a start, netd answers (it is jailed and serving) but refuses.
    let netd = Netd::spawn_at(&exe).unwrap();
    let pid = netd.pid();
    match netd.stats() {
        Err(NetdError::Refused(m)) => assert_eq!(m, "not started"),
        other => panic!("an unstarted netd answered {other:?}"),
    }
    // The process: no capabilities, no new privileges, a session of its
    // own, stdin and stdout /dev/null, nothing but fds 0-3, a child of ours.
    for key in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(pid, key), "0000000000000000", "{key} of netd");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "PPid:"), std::process::id().to_string());
    for fd in [0, 1] {
        assert_eq!(std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap(), Path::new("/dev/null"), "fd {fd}");
    }
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort();
    assert_eq!(fds, [0, 1, 2, 3], "fds 0-3 only");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    assert_eq!(fields[3], pid.to_string(), "netd leads a session of its own");

    // A start netd refuses is the sandbox's start error, with netd's reason;
    // the same netd then takes a valid one.
    let upstream = frames::stand_in_upstream(
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        "www.example.com",
        Ipv4Addr::new(203, 0, 113, 7),
    );
    let bad = NetConfig { policy: Some(policy(Action::Deny, vec![rule(Action::Allow, "")])), ..Default::default() };
    let (link, _peer) = seqpacket_link();
    match netd.start("sb-1", link, &bad) {
        Err(NetdError::Refused(m)) => assert!(m.contains("egress[0]: empty target"), "netd names the rule: {m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let cfg = NetConfig {
        policy: Some(policy(Action::Deny, vec![rule(Action::Allow, "*.example.com")])),
        upstream_dns: vec![upstream],
        ..Default::default()
    };
    let (link, sandbox) = seqpacket_link();
    netd.start("sb-1", link, &cfg).unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!(fds > 4, "netd holds the link and its host sockets now ({fds} fds)");

    // The configuration arrived: its policy and its upstream decide answers.
    assert_eq!(ask(&sandbox, 1, "www.example.com"), pvisor_net::dns::RCODE_NOERROR, "allowed: the upstream's answer");
    assert_eq!(ask(&sandbox, 2, "denied.test"), pvisor_net::dns::RCODE_NXDOMAIN, "denied by netd itself");
    // A new policy applies at once; an invalid one is refused and changes nothing.
    netd.set_policy(&policy(Action::Deny, vec![])).unwrap();
    assert_eq!(ask(&sandbox, 3, "www.example.com"), pvisor_net::dns::RCODE_NXDOMAIN, "deny-all");
    match netd.set_policy(&policy(Action::Allow, vec![rule(Action::Deny, "")])) {
        Err(NetdError::Refused(m)) => assert!(m.contains("egress[0]: empty target"), "{m}"),
        other => panic!("an invalid policy was taken: {other:?}"),
    }
    assert_eq!(ask(&sandbox, 4, "www.example.com"), pvisor_net::dns::RCODE_NXDOMAIN, "still deny-all");
    let stats = netd.stats().unwrap();
    assert_eq!(stats.dns_queries, 4, "{stats:?}");
    assert!(stats.rx_bytes > 0 && stats.tx_bytes > 0, "{stats:?}");

    // Death: requests fail as Gone (not a hang, not a bogus answer), and a
    // watched netd is reaped and says how it ended.
    let mut netd = netd;
    let (tx, rx) = std::sync::mpsc::channel();
    netd.watch(move |how| tx.send(how.to_owned()).unwrap());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match netd.stats() {
            Err(NetdError::Gone(how)) if how.contains("SIGKILL") => break,
            Err(NetdError::Gone(_)) => {}
            other => panic!("a dead netd answered {other:?}"),
        }
        assert!(Instant::now() < deadline, "the watcher did not reap netd");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "netd was reaped");
    assert_eq!(rx.recv().unwrap(), "was killed by SIGKILL", "the watcher reports how netd ended");

    // Dropping an unwatched netd kills and reaps it.
    let netd = Netd::spawn_at(&exe).unwrap();
    let pid = netd.pid();
    drop(netd);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "a dropped netd is reaped");

    // A netd that is not there.
    match Netd::spawn_at(Path::new("/nonexistent/pvisor-netd")) {
        Err(e @ NetdError::Spawn { .. }) => assert!(e.to_string().contains("/nonexistent/pvisor-netd"), "{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("spawned a nonexistent netd"),
    }
}

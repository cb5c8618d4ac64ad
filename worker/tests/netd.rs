//! The worker's side of netd's process contract ([`pvisor_worker::netd`]),
//! against `fake-netd.py`, a stand-in that speaks the contract of
//! netd/src/lib.rs and records what it received: the start message and its
//! link fd, policies, stats requests; the process it runs in (no
//! capabilities, nothing but fds 0–3, stdin /dev/null); netd's death.
//!
//! Needs python3 and root (for the capability checks to mean something).
use pvisor_proto::net::{netd_control, Action, EgressPolicy, EgressRule, LinkKind, NetConfig, NetdControl};
use pvisor_worker::backend::NetLink;
use pvisor_worker::netd::{Netd, NetdError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fake_netd() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-netd.py")
}

/// The fake's records, once it wrote at least `lines` of them.
fn records(log: &Path, lines: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got: Vec<String> = std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_owned).collect();
        if got.len() >= lines {
            return got;
        }
        assert!(Instant::now() < deadline, "fake netd wrote {got:?}, expected {lines} lines");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn decode(hex: &str) -> NetdControl {
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    prost::Message::decode(bytes.as_slice()).unwrap()
}

fn status_field(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in status"));
    line[key.len()..].trim().to_owned()
}

fn policy() -> EgressPolicy {
    EgressPolicy {
        default_action: Action::Deny as i32,
        egress: vec![EgressRule { action: Action::Allow as i32, target: "*.example.com".into() }],
    }
}

struct Fake {
    netd: Netd,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn spawn(refuse: Option<&str>) -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("netd.log");
    // The fake reads these from its environment, inherited from this test.
    std::env::set_var("PVISOR_FAKE_NETD_LOG", &log);
    match refuse {
        Some(r) => std::env::set_var("PVISOR_FAKE_NETD_REFUSE", r),
        None => std::env::remove_var("PVISOR_FAKE_NETD_REFUSE"),
    }
    let netd = Netd::spawn_at(&fake_netd()).unwrap();
    Fake { netd, log, _dir: dir }
}

fn seqpacket_link() -> (NetLink, std::os::fd::OwnedFd) {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    (NetLink { fd: a, kind: LinkKind::LinkSeqpacket }, b)
}

// One test: the fake takes its settings from this process's environment.
#[test]
fn the_contract_start_policy_stats_refusal_and_death() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (it checks that netd gets no capabilities)");

    // Start: the message and exactly one fd arrive; netd's reply is awaited.
    let f = spawn(None);
    let pid = f.netd.pid();
    let cfg = NetConfig { policy: Some(policy()), upstream_dns: vec!["192.0.2.53:53".into()], ..Default::default() };
    let (link, _peer) = seqpacket_link();
    f.netd.start("sb-1", link, &cfg).unwrap();
    let rec = records(&f.log, 2);
    assert_eq!(rec[0], format!("pid {pid}"));
    let start: Vec<&str> = rec[1].split(' ').collect();
    assert_eq!((start[0], start[2]), ("start", "1"), "{rec:?}");
    let Some(netd_control::Msg::Start(s)) = decode(start[1]).msg else { panic!("not a start: {rec:?}") };
    assert_eq!(s.sandbox_id, "sb-1");
    assert_eq!(s.link, LinkKind::LinkSeqpacket as i32);
    assert_eq!(s.config, Some(cfg));

    // The process: no capabilities, no new privileges, a session of its
    // own, stdin /dev/null, fds 0-3 and the link only, a child of ours.
    for key in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(pid, key), "0000000000000000", "{key} of netd");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "PPid:"), std::process::id().to_string());
    assert_eq!(std::fs::read_link(format!("/proc/{pid}/fd/0")).unwrap(), Path::new("/dev/null"));
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort();
    assert_eq!(fds.len(), 5, "fds 0-3 and the link: {fds:?}");
    assert_eq!(&fds[..4], &[0, 1, 2, 3]);
    let sid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = sid.rsplit(')').next().unwrap().split_whitespace().collect();
    assert_eq!(fields[3], pid.to_string(), "netd leads a session of its own");

    // Policy and stats.
    f.netd.set_policy(&policy()).unwrap();
    let rec = records(&f.log, 3);
    let Some(netd_control::Msg::Policy(p)) = decode(rec[2].strip_prefix("policy ").unwrap()).msg else {
        panic!("not a policy: {rec:?}")
    };
    assert_eq!(p, policy());
    let stats = f.netd.stats().unwrap();
    assert_eq!((stats.tx_bytes, stats.flows, stats.flows_denied), (5, 7, 3));

    // Death: requests fail as Gone (not a hang, not a bogus answer), and a
    // watched netd is reaped and says how it ended.
    let mut netd = f.netd;
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

    // A refusal is the sandbox's start error, with netd's reason.
    let f = spawn(Some("no room for another sandbox"));
    let (link, _peer) = seqpacket_link();
    match f.netd.start("sb-2", link, &NetConfig::default()) {
        Err(NetdError::Refused(m)) => assert_eq!(m, "no room for another sandbox"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Dropping an unwatched netd kills and reaps it.
    let pid = f.netd.pid();
    drop(f.netd);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "a dropped netd is reaped");

    // A netd that is not there.
    match Netd::spawn_at(Path::new("/nonexistent/pvisor-netd")) {
        Err(e @ NetdError::Spawn { .. }) => assert!(e.to_string().contains("/nonexistent/pvisor-netd"), "{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("spawned a nonexistent netd"),
    }
}

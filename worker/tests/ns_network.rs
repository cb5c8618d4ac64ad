//! An ns sandbox's network link, with a real worker and a real sandbox: with
//! `net`, the sandbox has `eth0` (10.0.2.100/24, MTU 65520, default route
//! via 10.0.2.2) and pvisor's resolv.conf and hosts, written without
//! following the image's symlinks; the tap reaches netd and nothing else;
//! netd runs without capabilities in the group's `worker` leaf, keeps
//! answering while the sandbox is paused, and dies with the worker. Without
//! `net`: loopback only and no netd. As root and as an unprivileged user.
//!
//! netd is `fake-netd.py` (PVISOR_NETD), a stand-in that speaks the contract
//! of netd/src/lib.rs and records what it got; the real pvisor-netd is tested
//! in its own crate. Needs what `common` says.
use pvisor_proto::net::{netd_control, Action, EgressPolicy, EgressRule, LinkKind, NetConfig, NetdControl};
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_proto::worker::Empty;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::{env, sh, start, Spec, Worker};

/// What the test image's /etc/hosts points at: a file on the host that must
/// never be written.
const HOST_FILE: &str = "host-file";

fn net_config() -> NetConfig {
    NetConfig {
        policy: Some(EgressPolicy {
            default_action: Action::Allow as i32,
            egress: vec![EgressRule { action: Action::Deny as i32, target: "denied.test".into() }],
        }),
        upstream_dns: vec!["198.51.100.53:53".into()],
        ..Default::default()
    }
}

/// An image whose /etc/resolv.conf is a symlink to its own /etc/passwd,
/// whose /etc/hosts is a symlink to an absolute path on the host (a file
/// anyone may write), and whose /etc/hostname reaches for the init's stderr
/// through /proc (on the host: the worker's log).
fn hostile_etc(root: &Path, test_dir: &Path) {
    let host = test_dir.join(HOST_FILE);
    std::fs::write(&host, "host content\n").unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("etc/resolv.conf")).unwrap();
    std::os::unix::fs::symlink(&host, root.join("etc/hosts")).unwrap();
    std::os::unix::fs::symlink("/proc/self/fd/2", root.join("etc/hostname")).unwrap();
}

/// Neither the host file nor the worker's log was written through the symlinks.
fn host_side_untouched(w: &Worker) {
    assert_eq!(std::fs::read_to_string(w.dir.path().join(HOST_FILE)).unwrap(), "host content\n", "host file");
    let log = std::fs::read_to_string(w.dir.path().join("worker.log")).unwrap();
    assert!(!log.lines().any(|l| l == "sandbox-test"), "/etc/hostname was written into the worker's log: {log}");
}

fn netd_env(log: &Path) -> Vec<(String, String)> {
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-netd.py");
    vec![
        ("PVISOR_NETD".into(), fake.to_string_lossy().into_owned()),
        ("PVISOR_FAKE_NETD_LOG".into(), log.to_string_lossy().into_owned()),
    ]
}

/// A log path every user may create: the test directory is made only
/// inside `start`, so the fake's log goes to a directory of its own.
fn log_dir(unprivileged: bool) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    if unprivileged {
        std::os::unix::fs::chown(d.path(), Some(common::USER), Some(common::USER)).unwrap();
    }
    d
}

fn records(log: &Path, want: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got: Vec<String> = std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_owned).collect();
        if got.iter().any(|l| l.starts_with(want)) {
            return got;
        }
        assert!(Instant::now() < deadline, "fake netd wrote {got:?}, no {want:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn decode(hex: &str) -> NetdControl {
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    prost::Message::decode(bytes.as_slice()).unwrap()
}

fn netd_pid(recs: &[String]) -> i32 {
    recs.iter().find_map(|l| l.strip_prefix("pid ")).expect("fake netd's pid").parse().unwrap()
}

fn status_field(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in status"));
    line[key.len()..].trim().to_owned()
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit(')').next().unwrap_or("").split_whitespace().next() == Some("Z"),
    }
}

fn ensure_tun_for_everyone() {
    let mode = std::fs::metadata("/dev/net/tun").expect("/dev/net/tun").permissions().mode();
    if mode & 0o006 != 0o006 {
        // Debian's own default; scripts/common.sh sets it for the test run.
        std::fs::set_permissions("/dev/net/tun", std::fs::Permissions::from_mode(0o666)).unwrap();
        eprintln!(
            "note: /dev/net/tun was {:o}, set to 0666 (Debian's default) for an unprivileged worker",
            mode & 0o777
        );
    }
}

/// The sandbox's view of its network and /etc, and the host's file untouched.
async fn check_sandbox_side(w: &Worker) {
    let (out, code) = sh(&w.channel, "ip -o link show | cut -d: -f2 | tr -d ' ' | sort | tr '\\n' ' '").await;
    assert_eq!((out.as_str(), code), ("eth0 lo \n", 0), "interfaces");
    let (out, _) = sh(&w.channel, "ip -o -4 addr show dev eth0 | awk '{print $4}'").await;
    assert_eq!(out, "10.0.2.100/24\n");
    let (out, _) = sh(&w.channel, "ip -o link show dev eth0").await;
    assert!(out.contains("mtu 65520"), "eth0's MTU: {out}");
    assert!(out.contains(",UP") || out.contains("<UP"), "eth0 is up: {out}");
    let (out, _) = sh(&w.channel, "ip route show default").await;
    assert_eq!(out.split_whitespace().take(5).collect::<Vec<_>>(), ["default", "via", "10.0.2.2", "dev", "eth0"]);

    let (out, _) = sh(&w.channel, "cat /etc/resolv.conf").await;
    assert_eq!(out, pvisor_net::plan::resolv_conf());
    let (out, _) = sh(&w.channel, "cat /etc/hosts").await;
    assert_eq!(out, pvisor_net::plan::hosts("sandbox-test"));
    let (out, _) = sh(&w.channel, "cat /etc/hostname").await;
    assert_eq!(out, "sandbox-test\n");
    // The symlinks were replaced, not written through.
    let (out, _) = sh(
        &w.channel,
        "for f in resolv.conf hosts hostname; do test -L /etc/$f && echo link; done; head -1 /etc/passwd",
    )
    .await;
    assert_eq!(out, "root:x:0:0:root:/root:/bin/sh\n", "the sandbox's own /etc/passwd stays");
    host_side_untouched(w);
}

/// netd's side: what it received, and the process it is.
async fn check_netd_side(w: &Worker, log: &Path, root_worker: bool) -> i32 {
    let recs = records(log, "start ");
    let pid = netd_pid(&recs);
    let start: Vec<&str> = recs.iter().find(|l| l.starts_with("start ")).unwrap().split(' ').collect();
    assert_eq!((start[2], start[3]), ("1", "eth0"), "one fd, the tap eth0: {recs:?}");
    let Some(netd_control::Msg::Start(s)) = decode(start[1]).msg else { panic!("not a start: {recs:?}") };
    assert_eq!((s.sandbox_id.as_str(), s.link), ("test", LinkKind::LinkTap as i32));
    assert_eq!(s.config, Some(net_config()));

    assert_eq!(status_field(pid, "PPid:"), w.child.id().to_string(), "netd is the worker's child");
    for key in ["CapPrm:", "CapEff:", "CapAmb:"] {
        assert_eq!(status_field(pid, key), "0000000000000000", "{key} of netd");
    }
    if root_worker {
        // A root worker also empties the bounding set (an unprivileged one
        // cannot, and with no_new_privs has nothing to gain from it).
        assert_eq!(status_field(pid, "CapBnd:"), "0000000000000000", "CapBnd: of netd");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    if let Some(g) = &w.cgroup {
        // Where the freezer acts (v2, or v1's freezer hierarchy): netd is in
        // the worker leaf, out of the sandbox's.
        let scope = g.v2.clone().or_else(|| g.v1.get("freezer").cloned()).expect("a freezer");
        let procs = |leaf: &str| -> Vec<i32> {
            let list = std::fs::read_to_string(scope.join(leaf).join("cgroup.procs")).unwrap();
            list.lines().map(|l| l.parse().unwrap()).collect()
        };
        assert!(procs("worker").contains(&pid), "netd is in the worker leaf");
        assert!(!procs("sandbox").contains(&pid), "netd is not in the sandbox leaf");
        for dir in g.dirs() {
            let in_leaf = |leaf: &str| {
                let list = std::fs::read_to_string(dir.join(leaf).join("cgroup.procs")).unwrap();
                list.lines().any(|l| l == pid.to_string())
            };
            assert!(in_leaf("worker") || in_leaf("sandbox"), "netd is in the sandbox's group in {}", dir.display());
        }
    }
    // The sandbox holds no fd of the tap: only netd does.
    let tap_holders: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_dir(format!("/proc/{p}/fd")).into_iter().flatten().flatten().any(|fd| {
                std::fs::read_to_string(format!("/proc/{p}/fdinfo/{}", fd.file_name().to_string_lossy()))
                    .is_ok_and(|i| i.lines().any(|l| l == "iff:\teth0"))
            })
        })
        .map(|p| p.to_string())
        .collect();
    assert!(tap_holders.contains(&pid.to_string()), "netd holds the tap: {tap_holders:?}");
    let sandbox_init =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", w.child.id(), w.child.id())).unwrap_or_default();
    for p in sandbox_init.split_whitespace().filter(|p| *p != pid.to_string()) {
        assert!(!tap_holders.contains(&p.to_string()), "the sandbox's init {p} holds no tap fd");
    }
    pid
}

async fn networked_sandbox(unprivileged: bool) {
    let Some(env) = env() else { return };
    if unprivileged {
        ensure_tun_for_everyone();
    }
    let logs = log_dir(unprivileged);
    let log = logs.path().join("netd.log");
    let spec = Spec {
        prepare: Some(hostile_etc),
        net: Some(net_config()),
        unprivileged,
        env: netd_env(&log),
        ..Spec::default()
    };
    let mut w = start(&env, spec).await;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    check_sandbox_side(&w).await;
    let pid = check_netd_side(&w, &log, !unprivileged).await;
    if unprivileged {
        assert_eq!(status_field(pid, "Uid:").split_whitespace().next(), Some(common::USER.to_string().as_str()));
    }

    // The tap netd holds is the sandbox's eth0: the sandbox's first packet
    // to its gateway shows up there as an ARP request from 10.0.2.100 for
    // 10.0.2.2.
    let (_, _) = sh(&w.channel, "nc -w 1 10.0.2.2 80 </dev/null >/dev/null 2>&1; true").await;
    let arp = |l: &String| l.strip_prefix("frame ").is_some_and(|f| f.len() >= 84 && &f[24..28] == "0806");
    let deadline = Instant::now() + Duration::from_secs(10);
    let frame = loop {
        let recs: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_owned).collect();
        if let Some(f) = recs.iter().find(|l| arp(l)) {
            break f.strip_prefix("frame ").unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no ARP request reached netd: {recs:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(&frame[0..12], "ffffffffffff", "broadcast: {frame}");
    assert_eq!(&frame[56..64], "0a000264", "sender 10.0.2.100: {frame}");
    assert_eq!(&frame[76..84], "0a000202", "target 10.0.2.2: {frame}");
    // IPv6 is off on eth0 from before it went up: not one IPv6 frame.
    let recs = std::fs::read_to_string(&log).unwrap();
    assert!(!recs.lines().any(|l| l.starts_with("frame ") && &l[6 + 24..6 + 28] == "86dd"), "IPv6 frames: {recs}");
    let (out, _) = sh(&w.channel, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6").await;
    assert_eq!(out, "1\n");

    // The worker's API reaches netd.
    let p = EgressPolicy { default_action: Action::Deny as i32, egress: vec![] };
    wc.set_egress_policy(p.clone()).await.unwrap();
    let recs = records(&log, "policy ");
    let Some(netd_control::Msg::Policy(got)) = decode(recs.iter().find_map(|l| l.strip_prefix("policy ")).unwrap()).msg
    else {
        panic!("not a policy")
    };
    assert_eq!(got, p);
    let stats = wc.net_stats(Empty {}).await.unwrap().into_inner();
    assert_eq!((stats.tx_bytes, stats.flows, stats.flows_denied), (5, 7, 3));

    // A paused sandbox's netd still answers (it is not in the frozen leaf).
    if w.cgroup.is_some() {
        wc.pause(Empty {}).await.unwrap();
        let stats = tokio::time::timeout(Duration::from_secs(5), wc.net_stats(Empty {})).await;
        assert!(matches!(stats, Ok(Ok(_))), "netd answers while the sandbox is paused: {stats:?}");
        wc.resume(Empty {}).await.unwrap();
        let (out, _) = sh(&w.channel, "echo resumed").await;
        assert_eq!(out, "resumed\n");
    }

    // netd dies with the worker.
    w.child.kill().unwrap();
    w.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(Instant::now() < deadline, "netd {pid} outlived its worker");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn a_networked_sandbox_has_eth0_its_etc_files_and_a_netd() {
    networked_sandbox(false).await;
}

#[tokio::test]
async fn an_unprivileged_worker_gives_its_sandbox_the_same_network() {
    networked_sandbox(true).await;
}

#[tokio::test]
async fn without_net_a_sandbox_has_loopback_only_and_no_netd() {
    let Some(env) = env() else { return };
    let logs = log_dir(false);
    let log = logs.path().join("netd.log");
    let w = start(&env, Spec { prepare: Some(hostile_etc), env: netd_env(&log), ..Spec::default() }).await;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    let (out, _) = sh(&w.channel, "ip -o link show | cut -d: -f2 | tr -d ' '").await;
    assert_eq!(out, "lo\n");
    let (out, _) = sh(&w.channel, "readlink /etc/resolv.conf; cat /etc/hosts").await;
    assert_eq!(out, "/etc/passwd\n127.0.0.1\tlocalhost sandbox-test\n::1\tlocalhost ip6-localhost sandbox-test\n");
    host_side_untouched(&w);
    // The warm worker's idle netd was killed and reaped: the worker's only
    // child is the sandbox's init.
    let ready = wc.ready(Empty {}).await.unwrap().into_inner();
    let id = w.child.id();
    let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).unwrap();
    assert_eq!(children.split_whitespace().collect::<Vec<_>>(), [ready.agent_pid.to_string()]);
    let e = wc.set_egress_policy(EgressPolicy::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let e = wc.net_stats(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
}

#[tokio::test]
async fn a_netd_that_dies_takes_the_network_only() {
    let Some(env) = env() else { return };
    let logs = log_dir(false);
    let log = logs.path().join("netd.log");
    let w = start(&env, Spec { net: Some(net_config()), env: netd_env(&log), ..Spec::default() }).await;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    let pid = netd_pid(&records(&log, "start "));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let e = wc.set_egress_policy(EgressPolicy::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let e = wc.net_stats(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // The sandbox itself goes on.
    let (out, code) = sh(&w.channel, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    // ... and the worker reaped netd and said so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(w.dir.path().join("worker.log")).unwrap();
        if log.contains("network process was killed by SIGKILL") {
            break;
        }
        assert!(Instant::now() < deadline, "no report of netd's death in the worker's log: {log}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "netd {pid} was reaped");
}

#[tokio::test]
async fn a_netd_that_refuses_dies_or_is_missing_fails_the_start_with_its_reason() {
    let Some(env) = env() else { return };
    let logs = log_dir(false);
    let mut with_refusal = netd_env(&logs.path().join("netd.log"));
    with_refusal.push(("PVISOR_FAKE_NETD_REFUSE".into(), "no room for this sandbox".into()));
    let w = start(&env, Spec { net: Some(net_config()), env: with_refusal, ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("no room for this sandbox"), "netd's reason: {}", e.message());

    let mut dying = netd_env(&logs.path().join("netd2.log"));
    dying.push(("PVISOR_FAKE_NETD_DIE_ON_START".into(), "1".into()));
    let w = start(&env, Spec { net: Some(net_config()), env: dying, ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("network process is gone"), "netd's death: {}", e.message());

    let missing = vec![("PVISOR_NETD".to_string(), "/nonexistent/pvisor-netd".to_string())];
    let w = start(&env, Spec { net: Some(net_config()), env: missing, ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("/nonexistent/pvisor-netd"), "names the missing netd: {}", e.message());
}

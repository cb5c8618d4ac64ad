//! An ns sandbox's network link, with a real worker and a real sandbox: with
//! `net`, the sandbox has `eth0` (10.0.2.100/24, MTU 65520, default route
//! via 10.0.2.2) and pvisor's resolv.conf and hosts, written without
//! following the image's symlinks; the tap reaches netd and nothing else;
//! netd runs without capabilities in the group's `worker` leaf, keeps
//! answering while the sandbox is paused, and dies with the worker. Without
//! `net`: loopback only and no netd. As root and as an unprivileged user.
//!
//! netd is the real pvisor-netd, and the sandbox reaches a private internet
//! through it (`common::internet`: a TCP and a DNS server in a network
//! namespace of the test's own): by name and by IP, a denied name, a live
//! policy change refusing and reopening connections. Needs what `common`
//! says, and iproute2 on the host.
use pvisor_proto::net::{Action, EgressPolicy, EgressRule, NetConfig};
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_proto::worker::Empty;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::internet::{self, Internet};
use common::{env, sh, start, Spec, Worker};

/// What the test image's /etc/hosts points at: a file on the host that must
/// never be written.
const HOST_FILE: &str = "host-file";

fn net_config(upstream: String) -> NetConfig {
    NetConfig {
        policy: Some(EgressPolicy {
            default_action: Action::Allow as i32,
            egress: vec![EgressRule { action: Action::Deny as i32, target: "denied.test".into() }],
        }),
        upstream_dns: vec![upstream],
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

/// The worker's pvisor-netd child (its only child but the sandbox's init).
fn netd_pid(w: &Worker) -> i32 {
    let id = w.child.id();
    let tasks = std::fs::read_dir(format!("/proc/{id}/task")).unwrap();
    let children: Vec<i32> = tasks
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect::<Vec<i32>>()
        })
        .collect();
    let netd: Vec<i32> = children
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c == "pvisor-netd\n"))
        .collect();
    assert_eq!(netd.len(), 1, "one pvisor-netd child of the worker: {netd:?}");
    netd[0]
}

/// A shell command's output and exit code in the sandbox, nc's errors included.
async fn run(w: &Worker, cmd: &str) -> (String, i32) {
    sh(&w.channel, &format!("{cmd} 2>&1")).await
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

/// netd's side: the process it is, and the tap it alone holds.
async fn check_netd_side(w: &Worker, root_worker: bool) -> i32 {
    let pid = netd_pid(w);
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
    let net = Internet::new();
    let spec = Spec { prepare: Some(hostile_etc), net: Some(net_config(net.dns())), unprivileged, ..Spec::default() };
    let mut w = start(&env, spec).await;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    check_sandbox_side(&w).await;
    let pid = check_netd_side(&w, !unprivileged).await;
    if unprivileged {
        assert_eq!(status_field(pid, "Uid:").split_whitespace().next(), Some(common::USER.to_string().as_str()));
    }

    // The private internet through netd: by name (resolved by netd through
    // the upstream of the configuration, which binds the address to the
    // name) and by IP.
    let by_name = Internet::ask_by_name();
    let by_ip = Internet::ask(&net.server.to_string());
    assert_eq!(run(&w, &by_name).await, (internet::BODY.to_owned(), 0), "by name");
    assert_eq!(run(&w, &by_ip).await, (internet::BODY.to_owned(), 0), "by IP");
    // The configuration's policy: a denied name does not resolve (netd
    // answers NXDOMAIN itself).
    let (out, code) = run(&w, "nslookup denied.test").await;
    assert!(code != 0 && out.contains("NXDOMAIN"), "denied.test resolved: {out}");
    // The sandbox's gateway is netd's (its MAC answered ARP on the tap).
    let (out, _) = sh(&w.channel, "ip neigh show 10.0.2.2").await;
    assert!(out.contains("lladdr 02:70:76:00:00:02"), "the gateway's neighbour entry: {out}");
    // IPv6 is off on eth0 from before it went up.
    let (out, _) = sh(&w.channel, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6").await;
    assert_eq!(out, "1\n");

    // The worker's API reaches netd, and a new policy applies to new
    // connections at once: deny-all refuses (not a timeout) and resolves
    // nothing; a domain rule opens the server by its name; an IP rule by
    // its address.
    let set = |default: Action, rules: Vec<String>| EgressPolicy {
        default_action: default as i32,
        egress: rules.into_iter().map(|target| EgressRule { action: Action::Allow as i32, target }).collect(),
    };
    wc.set_egress_policy(set(Action::Deny, vec![])).await.unwrap();
    let (out, code) = run(&w, &by_ip).await;
    assert!(code != 0 && out.contains("refused"), "deny-all still connects: {code} {out}");
    let (out, code) = run(&w, &format!("nslookup {}", internet::NAME)).await;
    assert!(code != 0 && out.contains("NXDOMAIN"), "deny-all still resolves: {out}");
    wc.set_egress_policy(set(Action::Deny, vec![internet::NAME.into()])).await.unwrap();
    assert_eq!(run(&w, &by_name).await, (internet::BODY.to_owned(), 0), "opened by a domain rule");
    wc.set_egress_policy(set(Action::Deny, vec![format!("{}/32", net.server)])).await.unwrap();
    assert_eq!(run(&w, &by_ip).await, (internet::BODY.to_owned(), 0), "opened by its CIDR");
    let stats = wc.net_stats(Empty {}).await.unwrap().into_inner();
    assert!(stats.flows_denied >= 1, "the refused connection: {stats:?}");
    assert!(stats.dns_queries >= 3 && stats.tx_bytes > 0 && stats.rx_bytes > 0, "{stats:?}");
    let bad = EgressPolicy {
        default_action: Action::Allow as i32,
        egress: vec![EgressRule { action: Action::Deny as i32, target: String::new() }],
    };
    let e = wc.set_egress_policy(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("egress[0]: empty target"), "netd names the rule: {}", e.message());

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
    let w = start(&env, Spec { prepare: Some(hostile_etc), ..Spec::default() }).await;
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
    let net = Internet::new();
    let w = start(&env, Spec { net: Some(net_config(net.dns())), ..Spec::default() }).await;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    let by_ip = Internet::ask(&net.server.to_string());
    assert_eq!(run(&w, &by_ip).await, (internet::BODY.to_owned(), 0), "the network, before");
    let pid = netd_pid(&w);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let e = wc.set_egress_policy(EgressPolicy::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let e = wc.net_stats(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // The sandbox itself goes on.
    let (out, code) = sh(&w.channel, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
    let (_, code) = run(&w, &by_ip).await;
    assert_ne!(code, 0, "the network is gone with netd");
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
    // A start netd refuses: the configuration's policy is invalid.
    let mut invalid = net_config("198.51.100.53:53".into());
    invalid.policy = Some(EgressPolicy {
        default_action: Action::Deny as i32,
        egress: vec![EgressRule { action: Action::Allow as i32, target: String::new() }],
    });
    let w = start(&env, Spec { net: Some(invalid), ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("egress[0]: empty target"), "netd's reason: {}", e.message());

    // A "netd" that exits before it answers (the real one dying is
    // a_netd_that_dies_takes_the_network_only).
    let dying = vec![("PVISOR_NETD".to_string(), "/bin/true".to_string())];
    let w = start(&env, Spec { net: Some(net_config("198.51.100.53:53".into())), env: dying, ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("network process is gone"), "netd's death: {}", e.message());

    let missing = vec![("PVISOR_NETD".to_string(), "/nonexistent/pvisor-netd".to_string())];
    let w =
        start(&env, Spec { net: Some(net_config("198.51.100.53:53".into())), env: missing, ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("/nonexistent/pvisor-netd"), "names the missing netd: {}", e.message());
}

//! The real `pvisor-netd` binary: spawned as the worker does (control socket
//! on fd 3), started with a SOCK_SEQPACKET link, jailed (no capabilities,
//! seccomp), answering control messages, gone when the control socket closes.
mod common;

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::sys::socket::{recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use prost::Message;
use pvisor_proto::net::{netd_control, EgressPolicy, Empty, LinkKind, NetConfig, NetdControl, NetdReply, NetdStart};

fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("socketpair")
}

fn send(fd: &OwnedFd, msg: &NetdControl, pass: Option<&OwnedFd>) {
    let bytes = msg.encode_to_vec();
    let fds: Vec<i32> = pass.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage<'_>> =
        if fds.is_empty() { Vec::new() } else { vec![ControlMessage::ScmRights(&fds)] };
    sendmsg::<()>(fd.as_raw_fd(), &[IoSlice::new(&bytes)], &cmsgs, MsgFlags::empty(), None).expect("sendmsg");
}

fn reply(fd: &OwnedFd) -> NetdReply {
    let mut buf = vec![0u8; 65536];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let n = recvmsg::<()>(fd.as_raw_fd(), &mut iov, None, MsgFlags::empty()).expect("recvmsg").bytes;
    NetdReply::decode(&buf[..n]).expect("a NetdReply")
}

fn status_field(pid: u32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
}

/// A field of /proc/`pid`/smaps_rollup, in kB.
fn smaps_rollup(pid: u32) -> impl Fn(&str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("smaps_rollup");
    move |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{key} in smaps_rollup"))
    }
}

#[test]
fn netd_jails_itself_answers_and_exits_with_its_control_socket() {
    run_netd(false);
}

/// As the worker starts it: no capabilities at all, even as root
/// (bounding set empty, SECBIT_NOROOT locked), no_new_privs.
#[test]
fn netd_jails_itself_when_started_without_capabilities() {
    run_netd(true);
}

/// As an unprivileged broker's worker starts it: an ordinary user.
#[test]
fn netd_jails_itself_as_an_ordinary_user() {
    run_netd_as(true, Some(65534));
}

fn run_netd(without_caps: bool) {
    run_netd_as(without_caps, None);
}

fn run_netd_as(without_caps: bool, user: Option<u32>) {
    let (ours, theirs) = seqpacket_pair();
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor-netd"));
    cmd.stdin(Stdio::null());
    // SAFETY: between fork and exec only dup2 and prctl run (async-signal-safe
    // syscalls); dup2 puts the child's end of the control socketpair on fd 3
    // (without close-on-exec, which dup2 clears).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(id) = user {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(id) != 0 || libc::setuid(id) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if without_caps {
                for cap in 0..64 {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                }
                // SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
                libc::prctl(libc::PR_SET_SECUREBITS, 0x3, 0, 0, 0);
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn pvisor-netd");
    drop(theirs);

    // Before start, other messages are refused.
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Stats(Empty {})) }, None);
    assert_eq!(reply(&ours).error, "not started");

    let (guest, link) = seqpacket_pair();
    // A stand-in upstream resolver on loopback that answers every question NXDOMAIN.
    let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
    let up_addr = upstream.local_addr().unwrap();
    let resolver = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let (n, from) = upstream.recv_from(&mut buf).unwrap();
        let q = pvisor_net::dns::parse_query(&buf[..n]).unwrap();
        let mut r = Vec::new();
        pvisor_net::dns::reply(&buf[..n], &q, pvisor_net::dns::RCODE_NXDOMAIN, &mut r);
        upstream.send_to(&r, from).unwrap();
    });
    // Allow all (outside the hard-deny table): names are resolved.
    let policy = EgressPolicy { default_action: pvisor_proto::net::Action::Allow as i32, egress: vec![] };
    let config = NetConfig { policy: Some(policy), upstream_dns: vec![up_addr.to_string()], ..Default::default() };
    let start = NetdStart { sandbox_id: "t1".into(), link: LinkKind::LinkSeqpacket as i32, config: Some(config) };
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Start(start)) }, Some(&link));
    drop(link);
    let r = reply(&ours);
    assert_eq!(r.error, "", "start accepted");

    let pid = child.id();
    // What an idle netd costs. Rss and Pss depend on the build (file pages
    // of the binary and, when it is dynamic, of the shared libc; a release
    // netd is ~2.3 MiB Rss dynamic, ~1.5 MiB static) and are shared between
    // sandboxes; its own memory is its anonymous memory: ~0.2-0.3 MiB.
    let rollup = smaps_rollup(pid);
    eprintln!(
        "netd idle after start: Rss {} kB, Pss {} kB, Private_Dirty {} kB, Anonymous {} kB",
        rollup("Rss"),
        rollup("Pss"),
        rollup("Private_Dirty"),
        rollup("Anonymous")
    );
    // Anonymous, not Private_Dirty: right after a build the binary's own
    // page-cache pages are still dirty (not yet written back) and count there.
    assert!(rollup("Anonymous") < 1024, "an idle netd holds {} kB of anonymous memory", rollup("Anonymous"));
    assert_eq!(status_field(pid, "Seccomp:"), "2", "the netd filter is on");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd:"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    let root = std::fs::read_dir(format!("/proc/{pid}/root")).map(|d| d.count());
    if let Ok(entries) = root {
        assert_eq!(entries, 0, "netd's root is empty");
    }

    // The data path runs under the filter: ARP, DNS relayed upstream, a
    // refused connect (loopback: hard-denied), a refused UDP flow.
    let frames = common::Frames::new(guest);
    frames.send(&common::arp_request(pvisor_net::plan::GATEWAY_IP));
    frames.expect("ARP reply", common::arp_reply);
    let dns = SocketAddrV4::new(pvisor_net::plan::DNS_IP, 53);
    frames.send(&common::udp_frame(40000, dns, &common::query(7, "x.test", 1)));
    let (_, _, answer) = frames.expect("relayed answer", common::udp_to_guest);
    assert_eq!(pvisor_net::dns::parse_answer(&answer).unwrap().rcode, pvisor_net::dns::RCODE_NXDOMAIN);
    resolver.join().unwrap();
    frames.send(&common::syn_frame(50000, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 22), 1000));
    assert_eq!(frames.expect("RST", common::rst_to_guest), 1001);
    frames.send(&common::udp_frame(40001, SocketAddrV4::new(Ipv4Addr::new(169, 254, 169, 254), 80), b"x"));
    assert_eq!(frames.expect("port unreachable", common::icmp_unreachable), 3);

    let policy = EgressPolicy { default_action: 0, egress: vec![] };
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Policy(policy)) }, None);
    assert_eq!(reply(&ours).error, "");
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Stats(Empty {})) }, None);
    let stats = reply(&ours).stats.expect("stats");
    assert_eq!((stats.flows, stats.flows_denied, stats.dns_queries), (0, 2, 1));

    drop(ours);
    let status = child.wait().expect("wait");
    assert!(status.success(), "netd exits cleanly when its control socket closes: {status:?}");
    drop(frames);
}

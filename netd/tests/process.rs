//! The real `pvisor-netd` binary: spawned as the worker does (control socket
//! on fd 3), started with a SOCK_SEQPACKET link, jailed (no capabilities,
//! seccomp), answering control messages, gone when the control socket closes.
use std::io::{IoSlice, IoSliceMut};
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

#[test]
fn netd_jails_itself_answers_and_exits_with_its_control_socket() {
    let (ours, theirs) = seqpacket_pair();
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvisor-netd"));
    cmd.stdin(Stdio::null());
    // SAFETY: between fork and exec only dup2 runs (async-signal-safe); it
    // puts the child's end of the control socketpair on fd 3 (without
    // close-on-exec, which dup2 clears).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
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
    let start = NetdStart {
        sandbox_id: "t1".into(),
        link: LinkKind::LinkSeqpacket as i32,
        config: Some(NetConfig { upstream_dns: vec!["127.0.0.1:53".into()], ..Default::default() }),
    };
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Start(start)) }, Some(&link));
    drop(link);
    let r = reply(&ours);
    assert_eq!(r.error, "", "start accepted");

    let pid = child.id();
    assert_eq!(status_field(pid, "Seccomp:"), "2", "the netd filter is on");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd:"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    let root = std::fs::read_dir(format!("/proc/{pid}/root")).map(|d| d.count());
    if let Ok(entries) = root {
        assert_eq!(entries, 0, "netd's root is empty");
    }

    let policy = EgressPolicy { default_action: 0, egress: vec![] };
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Policy(policy)) }, None);
    assert_eq!(reply(&ours).error, "");
    send(&ours, &NetdControl { msg: Some(netd_control::Msg::Stats(Empty {})) }, None);
    let stats = reply(&ours).stats.expect("stats");
    assert_eq!(stats.flows, 0);

    drop(ours);
    let status = child.wait().expect("wait");
    assert!(status.success(), "netd exits cleanly when its control socket closes: {status:?}");
    drop(guest);
}

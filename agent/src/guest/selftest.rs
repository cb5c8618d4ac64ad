//! `pvisor.selftest=1`: after the boot, check the sandbox's root from inside
//! and report on the console, for tests that boot a guest without a vsock
//! device (QEMU here has no vhost-vsock).
//!
//! Each check prints `pvisor-selftest: NAME: ok|FAIL|SKIP DETAIL`, then one
//! line `pvisor-selftest: done, N failed`. The caller powers off afterwards.
use super::cmdline::GuestCmdline;
use super::{net, vsock};
use std::io::Write;
use std::process::Command;

/// The command whose output proves that the image's shell runs and that the
/// overlay's upper (the scratch disk) takes writes.
pub const SHELL_CHECK: &str = "echo ok > /x; cat /x";

enum Outcome {
    Ok(String),
    Fail(String),
    Skip(String),
}

fn report(name: &str, outcome: &Outcome) {
    let (word, detail) = match outcome {
        Outcome::Ok(d) => ("ok", d),
        Outcome::Fail(d) => ("FAIL", d),
        Outcome::Skip(d) => ("SKIP", d),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "pvisor-selftest: {name}: {word} {detail}");
    let _ = out.flush();
}

/// Runs every check and returns how many failed.
pub fn run_selftest(cfg: &GuestCmdline) -> usize {
    let outcomes = [
        ("shell", shell()),
        ("root", mount_type("/", "overlay")),
        ("mounts", sandbox_mounts()),
        ("hostname", hostname(&cfg.hostname)),
        ("loopback", loopback()),
        ("network", network(cfg.net)),
        ("vsock", with_runtime(|rt| vsock_check(rt, cfg.port))),
        ("grpc", with_runtime(|rt| grpc_check(rt, cfg.port))),
    ];
    let mut failed = 0;
    for (name, outcome) in &outcomes {
        failed += matches!(outcome, Outcome::Fail(_)) as usize;
        report(name, outcome);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "pvisor-selftest: done, {failed} failed");
    let _ = out.flush();
    failed
}

/// Runs `f` on a fresh single-threaded tokio runtime (dropped afterwards).
fn with_runtime(f: impl FnOnce(&tokio::runtime::Runtime) -> Outcome) -> Outcome {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => f(&rt),
        Err(e) => Outcome::Fail(format!("tokio runtime: {e}")),
    }
}

fn shell() -> Outcome {
    match Command::new("/bin/sh").arg("-c").arg(SHELL_CHECK).output() {
        Ok(o) if o.status.success() && o.stdout == b"ok\n" => Outcome::Ok("/x written and read back".into()),
        Ok(o) => Outcome::Fail(format!(
            "{}: stdout {:?} stderr {:?}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Outcome::Fail(format!("spawn /bin/sh: {e}")),
    }
}

/// The filesystem type mounted at `point`, from /proc/self/mounts (the last
/// entry for a point is the one on top).
fn fstype_of(mounts: &str, point: &str) -> Option<String> {
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let (_src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (target == point).then(|| fstype.to_string())
    })
}

fn mount_type(point: &str, want: &str) -> Outcome {
    let mounts = match std::fs::read_to_string("/proc/self/mounts") {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("read /proc/self/mounts: {e}")),
    };
    match fstype_of(&mounts, point) {
        Some(t) if t == want => Outcome::Ok(format!("{point} is {t}")),
        Some(t) => Outcome::Fail(format!("{point} is {t}, not {want}")),
        None => Outcome::Fail(format!("nothing mounted at {point}")),
    }
}

fn sandbox_mounts() -> Outcome {
    let want = [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/dev", "tmpfs"),
        ("/dev/pts", "devpts"),
        ("/dev/shm", "tmpfs"),
        ("/tmp", "tmpfs"),
    ];
    for (point, fstype) in want {
        if let Outcome::Fail(d) = mount_type(point, fstype) {
            return Outcome::Fail(d);
        }
    }
    if let Err(e) = std::fs::OpenOptions::new().write(true).open("/dev/null").and_then(|mut f| f.write_all(b"x")) {
        return Outcome::Fail(format!("write /dev/null: {e}"));
    }
    // The sandbox's /dev is not devtmpfs: the disks must not show there.
    if std::path::Path::new("/dev/vda").exists() {
        return Outcome::Fail("/dev/vda visible in the sandbox".into());
    }
    Outcome::Ok(want.map(|(p, _)| p).join(" "))
}

fn hostname(want: &str) -> Outcome {
    match nix::unistd::gethostname() {
        Ok(h) if h.to_str() == Some(want) => Outcome::Ok(want.into()),
        Ok(h) => Outcome::Fail(format!("{h:?}, not {want}")),
        Err(e) => Outcome::Fail(format!("gethostname: {e}")),
    }
}

fn loopback() -> Outcome {
    if net::loopback_is_up() {
        Outcome::Ok("lo up".into())
    } else {
        Outcome::Fail("lo down".into())
    }
}

/// With `pvisor.net=1`: eth0 up at the sandbox's address with the device's
/// MTU, the default route through netd, resolv.conf pointing at netd.
fn network(enabled: bool) -> Outcome {
    use pvisor_net::plan;
    if !enabled {
        return Outcome::Skip("no pvisor.net=1".into());
    }
    if !net::is_up(plan::IFACE) {
        return Outcome::Fail(format!("{} is not up", plan::IFACE));
    }
    let route = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    // /proc/net/route: Iface Destination Gateway ..., addresses in host-order hex.
    let gateway = format!("{:08X}", u32::from_le_bytes(plan::GATEWAY_IP.octets()));
    let default = route.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[0] == plan::IFACE && f[1] == "00000000" && f[2] == gateway
    });
    if !default {
        return Outcome::Fail(format!("no default route via {} in /proc/net/route:\n{route}", plan::GATEWAY_IP));
    }
    match std::fs::read_to_string("/etc/resolv.conf") {
        Ok(r) if r == plan::resolv_conf() => {}
        Ok(r) => return Outcome::Fail(format!("/etc/resolv.conf is {r:?}")),
        Err(e) => return Outcome::Fail(format!("read /etc/resolv.conf: {e}")),
    }
    let mtu = net::mtu_of(plan::IFACE).unwrap_or(0);
    Outcome::Ok(format!("{} up, mtu {mtu}, default via {}, resolv.conf written", plan::IFACE, plan::GATEWAY_IP))
}

/// How long a vsock check waits for a connection to itself: a transport
/// that sends CID 1 to a host that never answers must not hang the test.
const VSOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds the agent's port and, through the kernel's loopback transport
/// (CID 1), connects to itself twice and exchanges bytes each time.
fn vsock_check(rt: &tokio::runtime::Runtime, port: u32) -> Outcome {
    rt.block_on(async move {
        let listener = match vsock::VsockListener::bind(port) {
            Ok(l) => l,
            Err(e) => return Outcome::Fail(format!("bind port {port}: {e}")),
        };
        for round in 0..2 {
            let echoed = tokio::time::timeout(VSOCK_WAIT, async {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                // The kernel completes the handshake from the listen queue, before accept.
                let mut c = vsock::VsockStream::connect(vsock::CID_LOCAL, port).await?;
                let mut a = listener.accept().await?;
                c.write_all(b"ping").await?;
                let mut buf = [0u8; 4];
                a.read_exact(&mut buf).await?;
                a.write_all(&buf).await?;
                c.read_exact(&mut buf).await?;
                Ok::<_, std::io::Error>((buf, a.peer()))
            })
            .await;
            match echoed {
                Ok(Ok((b, Some(_)))) if &b == b"ping" => {}
                Ok(Ok((b, peer))) => return Outcome::Fail(format!("round {round}: echo {b:?} from peer {peer:?}")),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ENODEV) => {
                    return Outcome::Skip(format!("bound port {port}; no transport to connect to CID 1 ({e})"))
                }
                Ok(Err(e)) => return Outcome::Fail(format!("bound port {port}; round {round}: {e}")),
                Err(_) => return Outcome::Skip(format!("bound port {port}; CID 1 did not answer in {VSOCK_WAIT:?}")),
            }
        }
        Outcome::Ok(format!("bound port {port}, 2 connections to CID 1 echoed"))
    })
}

/// Serves the agent's gRPC service on the vsock listener (as the guest
/// agent does) and pings it from two clients in turn over CID 1: repeated
/// accepts, HTTP/2 over vsock.
fn grpc_check(rt: &tokio::runtime::Runtime, port: u32) -> Outcome {
    use pvisor_proto::agent::{agent_client::AgentClient, agent_server::AgentServer, Empty};
    rt.block_on(async move {
        let incoming = match vsock::VsockListener::bind(port).map(vsock::VsockListener::incoming) {
            Ok(i) => i,
            Err(e) => return Outcome::Fail(format!("bind port {port}: {e}")),
        };
        let svc = crate::service::AgentService::new();
        let server = tokio::spawn(
            tonic::transport::Server::builder().add_service(AgentServer::new(svc)).serve_with_incoming(incoming),
        );
        let mut outcome = Outcome::Ok(format!("2 clients in turn pinged the agent on vsock port {port}"));
        for round in 0..2 {
            let pinged = tokio::time::timeout(VSOCK_WAIT, async {
                let channel = tonic::transport::Endpoint::from_static("http://agent")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| async move {
                        let s = vsock::VsockStream::connect(vsock::CID_LOCAL, port).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                    }))
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let reply = AgentClient::new(channel).ping(Empty {}).await.map_err(|e| format!("ping: {e}"))?;
                Ok::<_, String>(reply.into_inner().pid)
            })
            .await;
            match pinged {
                Ok(Ok(1)) => {}
                Ok(Ok(pid)) => outcome = Outcome::Fail(format!("round {round}: agent pid {pid}, not 1")),
                Ok(Err(e)) => outcome = Outcome::Fail(format!("round {round}: {e}")),
                Err(_) => outcome = Outcome::Fail(format!("round {round}: no answer in {VSOCK_WAIT:?}")),
            }
            if matches!(outcome, Outcome::Fail(_)) {
                break;
            }
        }
        server.abort();
        outcome
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstype_of_takes_the_top_mount() {
        let m = "rootfs / rootfs rw 0 0\n/dev/vdb /mnt ext4 rw 0 0\noverlay / overlay rw,lowerdir=/mnt/lower 0 0\n";
        assert_eq!(fstype_of(m, "/").as_deref(), Some("overlay"));
        assert_eq!(fstype_of(m, "/mnt").as_deref(), Some("ext4"));
        assert_eq!(fstype_of(m, "/tmp"), None);
    }
}

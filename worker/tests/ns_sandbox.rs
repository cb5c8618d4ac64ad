//! A real worker running a real ns sandbox from a real image: readiness,
//! server reflection, commands through the worker's socket, isolation,
//! limits, pause, shutdown, and a failing start.
//!
//! Needs root, the static agent (`$PVISOR_DIST/pvisor-agent`) and the test
//! images (`$PVISOR_TEST_IMAGES`); `scripts/test.sh` provides both. Without
//! those variables the tests say so and pass vacuously; with them set, any
//! missing piece is a failure.
use pvisor_proto::agent::agent_client::AgentClient;
use pvisor_proto::agent::AgentConfig;
use pvisor_proto::agent::{exec_event, ExecRequest};
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_proto::worker::Empty;
use pvisor_worker::cgroup::{GroupPaths, Layout};
use pvisor_worker::config::{BackendConfig, IdMap, Limits, NsConfig, WorkerConfig};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::Channel;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

struct Env {
    agent: PathBuf,
}

fn env() -> Option<Env> {
    let Some(dist) = std::env::var_os("PVISOR_DIST") else {
        eprintln!("skipped: set PVISOR_DIST (scripts/test.sh does)");
        return None;
    };
    let agent = PathBuf::from(dist).join("pvisor-agent");
    assert!(agent.is_file(), "{} missing", agent.display());
    assert!(nix::unistd::geteuid().is_root(), "these tests need root");
    Some(Env { agent })
}

struct Worker {
    child: std::process::Child,
    channel: Channel,
    cgroup: Option<GroupPaths>,
    _lifeline: std::os::fd::OwnedFd,
    _dir: tempfile::TempDir,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self._dir.path().join("worker.log")).unwrap_or_default();
            eprintln!("--- worker log ---\n{log}--- end ---");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(g) = &self.cgroup {
            let _ = g.destroy();
        }
    }
}

async fn start(env: &Env, image_root: Option<PathBuf>, limits: Limits) -> Worker {
    let dir = tempfile::tempdir().unwrap();
    let root = match image_root {
        Some(r) => r,
        None => busybox_root(&dir.path().join("rootfs")),
    };
    let name = format!("pvisor-test-{}-{}", std::process::id(), rand_suffix());
    let cgroup = Layout::detect().ok().map(|l| l.create_group(&name, &limits).unwrap());
    let sock = dir.path().join("worker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (life_rd, life_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (cfg_rd, cfg_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let cfg = WorkerConfig {
        sandbox_id: "test".into(),
        cgroup: cgroup.as_ref().map(pvisor_proto::worker::CgroupPaths::from),
        limits: Some(limits.into()),
        hostname: "sandbox-test".into(),
        agent: Some(AgentConfig { entrypoint: vec!["sleep".into(), "1000".into()], ..Default::default() }),
        backend: Some(BackendConfig::Ns(NsConfig {
            image_root: root.to_string_lossy().into_owned(),
            state_dir: dir.path().join("state").to_string_lossy().into_owned(),
            ids: Some(IdMap::for_current_user(Some(100000)).into()),
            agent_path: env.agent.to_string_lossy().into_owned(),
        })),
    };
    let log = std::fs::File::create(dir.path().join("worker.log")).unwrap();
    let fds = [listener.as_raw_fd(), life_rd.as_raw_fd(), cfg_rd.as_raw_fd()];
    let mut cmd =
        pvisor_worker::launch::command(Path::new(env!("CARGO_BIN_EXE_pvisor-worker")), cgroup.as_ref(), fds, log)
            .unwrap();
    let child = cmd.spawn().unwrap();
    drop((listener, life_rd, cfg_rd));
    pvisor_worker::launch::send_config(cfg_wr, &cfg).unwrap();
    let channel = pvisor_worker::launch::connect_unix(&sock).await.unwrap();
    Worker { child, channel, cgroup, _lifeline: life_wr, _dir: dir }
}

/// A minimal root file system on the host: the static busybox and its
/// applets, owned by the sandbox's root (the worker only needs some
/// directory as the overlay's lower layer; how images get there is the image
/// server's business, tested in the images crate and end to end).
fn busybox_root(root: &Path) -> PathBuf {
    for d in ["bin", "etc", "tmp", "proc", "dev", "sys", "root"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("/bin/busybox (apt-get install busybox-static)");
    let list = std::process::Command::new("/bin/busybox").arg("--list").output().unwrap().stdout;
    for applet in String::from_utf8_lossy(&list).lines().filter(|a| *a != "busybox") {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
        .unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").unwrap();
    if nix::unistd::geteuid().is_root() {
        std::process::Command::new("chown").args(["-R", "-h", "100000:100000"]).arg(root).status().unwrap();
    }
    root.to_path_buf()
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}

async fn sh(ch: &Channel, cmd: &str) -> (String, i32) {
    let mut s = AgentClient::new(ch.clone())
        .exec(ExecRequest { command: cmd.into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let (mut out, mut code) = (String::new(), -1);
    while let Some(ev) = s.message().await.unwrap() {
        match ev.kind.unwrap() {
            exec_event::Kind::Stdout(l) => {
                out.push_str(&l);
                out.push('\n');
            }
            exec_event::Kind::Exit(x) => code = x.code,
            _ => {}
        }
    }
    (out, code)
}

#[tokio::test]
async fn reflection_lists_services_and_commands_run_through_the_worker() {
    let Some(env) = env() else { return };
    let w = start(&env, None, Limits::default()).await;
    let ready = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap().into_inner();
    assert_eq!(ready.backend, "ns");

    let mut refl = ServerReflectionClient::new(w.channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected reflection answer")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["pvisor.agent.v1.Agent", "pvisor.worker.v1.Worker", "grpc.reflection.v1.ServerReflection"] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }

    let (out, code) =
        sh(&w.channel, "cat /proc/1/comm; hostname; ls /proc | grep -c '^[0-9]'; cat /etc/hostname").await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "pvisor-agent", "the agent is PID 1");
    assert_eq!(lines[1], "sandbox-test");
    let pids: u32 = lines[2].parse().unwrap();
    assert!(pids < 10, "only sandbox processes are visible, saw {pids}");
    assert_eq!(lines[3], "sandbox-test");

    // The host's files are not reachable; writes land in the sandbox's upper layer.
    let marker = format!("/tmp/pvisor-host-marker-{}", std::process::id());
    std::fs::write(&marker, "host").unwrap();
    let (out, _) =
        sh(&w.channel, &format!("test -e {marker} && echo visible || echo absent; echo x > /root/new; cat /root/new"))
            .await;
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(out, "absent\nx\n");

    // Mounting and new user namespaces are refused inside.
    let (_, code) = sh(&w.channel, "unshare -U true").await;
    assert_ne!(code, 0);
    let (out, _) = sh(&w.channel, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status").await;
    assert_eq!(out, "NoNewPrivs:\t1\nSeccomp:\t2\n");
}

#[tokio::test]
async fn memory_limit_pause_and_shutdown() {
    let Some(env) = env() else { return };
    let limits = Limits { memory_bytes: 64 << 20, ..Limits::default() };
    let mut w = start(&env, None, limits).await;
    let _ = &mut w;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    if w.cgroup.is_some() {
        // 200 MiB held in a shell variable: the memory cgroup kills the shell.
        let (_, code) = sh(&w.channel, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}").await;
        assert_ne!(code, 0, "allocation beyond the limit must fail");
        let (out, code) = sh(&w.channel, "echo still-alive").await;
        assert_eq!((out.as_str(), code), ("still-alive\n", 0), "the sandbox survives the OOM kill");
        let m = wc.metrics(Empty {}).await.unwrap().into_inner();
        assert_eq!(m.mem_total_bytes, 64 << 20);
        assert!(m.mem_used_bytes > 0);

        wc.pause(Empty {}).await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(300), sh(&w.channel, "echo hi")).await;
        assert!(r.is_err(), "a paused sandbox runs nothing");
        wc.resume(Empty {}).await.unwrap();
        let (out, _) = sh(&w.channel, "echo resumed").await;
        assert_eq!(out, "resumed\n");
    }
    wc.shutdown(Empty {}).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "worker did not exit after Shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "worker exits cleanly after Shutdown: {status}");
}

#[tokio::test]
async fn a_sandbox_that_cannot_start_reports_why() {
    let Some(env) = env() else { return };
    let w = start(&env, Some(PathBuf::from("/nonexistent/image/root")), Limits::default()).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("/nonexistent/image/root"), "the reason names what failed: {}", e.message());
}

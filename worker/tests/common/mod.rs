//! What the worker's sandbox tests share: a real worker process started the
//! way the broker starts one, a busybox root file system, and a shell
//! command run through the worker's socket.
//!
//! Needs root, the static agent (`$PVISOR_DIST/pvisor-agent`), the real
//! `$PVISOR_DIST/pvisor-netd` (each worker gets it as PVISOR_NETD) and
//! busybox; `scripts/test.sh` provides them. Without `PVISOR_DIST` the tests say so
//! and pass vacuously; with it set, any missing piece is a failure.
#![allow(dead_code)]
use pvisor_proto::agent::agent_client::AgentClient;
use pvisor_proto::agent::AgentConfig;
use pvisor_proto::agent::{exec_event, ExecRequest};
use pvisor_proto::net::NetConfig;
use pvisor_worker::cgroup::{GroupPaths, Layout};
use pvisor_worker::config::{BackendConfig, IdMap, Limits, NsConfig, WorkerConfig};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use tonic::transport::Channel;

pub mod frames;
pub mod internet;

/// The unprivileged user the non-root tests run a worker as.
pub const USER: u32 = 1000;

pub struct Env {
    pub agent: PathBuf,
    pub netd: PathBuf,
}

/// The real pvisor-netd: `$PVISOR_NETD`, else `$PVISOR_DIST/pvisor-netd`;
/// None (and a SKIP line) when neither is set, a failure when the file is
/// missing.
pub fn netd_exe() -> Option<PathBuf> {
    let netd = match (std::env::var_os("PVISOR_NETD"), std::env::var_os("PVISOR_DIST")) {
        (Some(n), _) => PathBuf::from(n),
        (None, Some(d)) => PathBuf::from(d).join("pvisor-netd"),
        (None, None) => {
            pvisor_testkit::skip("set PVISOR_DIST or PVISOR_NETD to the real pvisor-netd (scripts/test.sh does)");
            return None;
        }
    };
    assert!(netd.is_file(), "{} missing (source scripts/common.sh && build)", netd.display());
    Some(netd)
}

pub fn env() -> Option<Env> {
    let Some(dist) = std::env::var_os("PVISOR_DIST") else {
        pvisor_testkit::skip("set PVISOR_DIST (scripts/test.sh does)");
        return None;
    };
    let agent = PathBuf::from(dist).join("pvisor-agent");
    assert!(agent.is_file(), "{} missing", agent.display());
    let netd = netd_exe()?;
    assert!(nix::unistd::geteuid().is_root(), "these tests need root");
    Some(Env { agent, netd })
}

/// How to start a worker.
#[derive(Default)]
pub struct Spec {
    /// The overlay's lower layer; None: a fresh busybox root.
    pub image_root: Option<PathBuf>,
    /// Run on the busybox root before it is chowned (image content).
    pub prepare: Option<fn(&Path, &Path)>,
    pub limits: Limits,
    pub net: Option<NetConfig>,
    /// Run the worker as [`USER`] (no cgroup), as an unprivileged broker does.
    pub unprivileged: bool,
    /// Extra environment of the worker (and so of its netd).
    pub env: Vec<(String, String)>,
}

pub struct Worker {
    pub child: std::process::Child,
    pub channel: Channel,
    pub cgroup: Option<GroupPaths>,
    _lifeline: std::os::fd::OwnedFd,
    pub dir: tempfile::TempDir,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default();
            eprintln!("--- worker log ---\n{log}--- end ---");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(g) = &self.cgroup {
            let _ = g.destroy();
        }
    }
}

pub async fn start(env: &Env, spec: Spec) -> Worker {
    let dir = tempfile::tempdir().unwrap();
    let owner = match spec.unprivileged {
        true => Some(USER),
        false => None,
    };
    if let Some(u) = owner {
        std::os::unix::fs::chown(dir.path(), Some(u), Some(u)).unwrap();
    }
    let root = match spec.image_root {
        Some(r) => r,
        None => busybox_root(&dir.path().join("rootfs"), spec.prepare, owner.unwrap_or(100000), dir.path()),
    };
    let name = format!("pvisor-test-{}-{}", std::process::id(), rand_suffix());
    let cgroup = match spec.unprivileged {
        true => None,
        false => Layout::detect().ok().map(|l| l.create_group(&name, &spec.limits).unwrap()),
    };
    let ids = match owner {
        Some(u) => IdMap { uid_base: u, gid_base: u, count: 1 },
        None => IdMap::for_current_user(Some(100000)),
    };
    let sock = dir.path().join("worker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (life_rd, life_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (cfg_rd, cfg_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let cfg = WorkerConfig {
        sandbox_id: "test".into(),
        cgroup: cgroup.as_ref().map(pvisor_proto::worker::CgroupPaths::from),
        limits: Some(spec.limits.into()),
        hostname: "sandbox-test".into(),
        agent: Some(AgentConfig { entrypoint: vec!["sleep".into(), "1000".into()], ..Default::default() }),
        backend: Some(BackendConfig::Ns(NsConfig {
            image_root: root.to_string_lossy().into_owned(),
            state_dir: dir.path().join("state").to_string_lossy().into_owned(),
            ids: Some(ids.into()),
            agent_path: env.agent.to_string_lossy().into_owned(),
            volumes: vec![],
            tmp_on_root: false,
            disk_template: String::new(),
            memory_merge: false,
        })),
        net: spec.net,
        ..Default::default()
    };
    let log = std::fs::File::create(dir.path().join("worker.log")).unwrap();
    let fds = [listener.as_raw_fd(), life_rd.as_raw_fd(), cfg_rd.as_raw_fd()];
    let mut cmd =
        pvisor_worker::launch::command(Path::new(env!("CARGO_BIN_EXE_pvisor-worker")), cgroup.as_ref(), fds, log)
            .unwrap();
    cmd.env(pvisor_worker::netd::NETD_ENV, &env.netd);
    cmd.envs(spec.env);
    if let Some(u) = owner {
        cmd.uid(u).gid(u);
    }
    let child = cmd.spawn().unwrap();
    drop((listener, life_rd, cfg_rd));
    pvisor_worker::launch::send_config(cfg_wr, &cfg).unwrap();
    let channel = pvisor_worker::launch::connect_unix(&sock).await.unwrap();
    Worker { child, channel, cgroup, _lifeline: life_wr, dir }
}

/// A minimal root file system on the host: the static busybox and its
/// applets, owned by the sandbox's root (`owner` on the host; the worker
/// only needs some directory as the overlay's lower layer; how images get
/// there is the image server's business, tested in the images crate and end
/// to end). `prepare` gets the root and the test's directory.
pub fn busybox_root(root: &Path, prepare: Option<fn(&Path, &Path)>, owner: u32, test_dir: &Path) -> PathBuf {
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
    if let Some(p) = prepare {
        p(root, test_dir);
    }
    if nix::unistd::geteuid().is_root() {
        let ids = format!("{owner}:{owner}");
        let st = std::process::Command::new("chown").args(["-R", "-h", &ids]).arg(root).status().unwrap();
        assert!(st.success());
    }
    root.to_path_buf()
}

pub fn rand_suffix() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}

pub async fn sh(ch: &Channel, cmd: &str) -> (String, i32) {
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

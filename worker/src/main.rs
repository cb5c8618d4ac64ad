//! pvisor-worker, spawned by the broker: `pvisor-worker [--cgroup JSON]`,
//! then its configuration (an encoded `pvisor.worker.v1.WorkerConfig`) on
//! fd 5, the gRPC socket on fd 3 and the broker's lifeline on fd 4.
use pvisor_proto::agent::agent_client::AgentClient;
use pvisor_proto::worker::worker_server::WorkerServer;
use pvisor_proto::worker::ReadyReply;
use pvisor_worker::agent_link::until_connected;
use pvisor_worker::backend::{self, NetLink, Sandbox};
use pvisor_worker::cgroup::{GroupPaths, SANDBOX_LEAF};
use pvisor_worker::config::{self, Common, WorkerConfig};
use pvisor_worker::forward::AgentForward;
use pvisor_worker::launch::{CONFIG_FD, LIFELINE_FD, LISTEN_FD};
use pvisor_worker::netd::{Netd, NetdError};
use pvisor_worker::service::{Readiness, WorkerService};
use pvisor_worker::threads::{filter_of, Thread};
use pvisor_worker::{agent_link, agent_ready_timeout, SHUTTING_DOWN};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("pvisor-worker: {msg}");
    std::process::exit(2);
}

fn set_cloexec(fd: RawFd) {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    if let Err(e) = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)) {
        fail(format!("fd {fd}: {e}"));
    }
}

/// Joins the cgroup named on the command line (its `sandbox` leaf, which
/// the sandbox's init inherits at clone).
fn join_cgroup() -> Option<GroupPaths> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("--cgroup"), Some(json)) => {
            let g: GroupPaths = serde_json::from_str(&json).unwrap_or_else(|e| fail(format!("bad --cgroup: {e}")));
            if let Err(e) = g.join(SANDBOX_LEAF, std::process::id() as i32) {
                fail(e);
            }
            Some(g)
        }
        (None, _) => None,
        _ => fail("usage: pvisor-worker [--cgroup JSON] (configuration on fd 5)"),
    }
}

/// Waits for the configuration on [`CONFIG_FD`], doing the work asked
/// ahead of it meanwhile. Returns None when the pipe closes without one (the
/// broker retired this warm worker).
fn wait_config() -> Option<(WorkerConfig, Common)> {
    // SAFETY: the broker passed the read end of the config pipe at CONFIG_FD;
    // nothing else in this process owns it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(CONFIG_FD) };
    let mut disk_ahead: Option<pvisor_worker::ns::disk_ahead::Mounted> = None;
    loop {
        match config::read_message(&mut pipe).unwrap_or_else(|e| fail(e)) {
            None => {
                if let Some(d) = disk_ahead {
                    d.discard();
                }
                return None;
            }
            Some(config::PipeKind::Ahead(a)) => {
                // One is asked for; a second replaces the first.
                if let Some(d) = disk_ahead.take() {
                    d.discard();
                }
                disk_ahead = pvisor_worker::ns::disk_ahead::ahead(&a);
            }
            Some(config::PipeKind::Config(cfg)) => {
                let (cfg, mut common) = config::check(cfg).unwrap_or_else(|e| fail(e));
                // Kept only for an ns sandbox with a disk of its template; else
                // dropped now, with its loop device and file system.
                common.disk_ahead = disk_ahead.and_then(|d| match &cfg.backend {
                    Some(config::BackendConfig::Ns(ns)) if std::path::Path::new(&ns.disk_template) == d.template => {
                        Some(d)
                    }
                    _ => {
                        d.discard();
                        None
                    }
                });
                return Some((cfg, common));
            }
        }
    }
}

/// Hands the sandbox's link to its netd (`netd` is None when the
/// configuration has no `net`: then there is nothing to do). netd's answer
/// is read later ([`network_started`]), while the agent is configured.
fn connect_network(
    common: &Common,
    cfg: &WorkerConfig,
    netd: Option<std::result::Result<Netd, NetdError>>,
    link: Option<NetLink>,
) -> Result<Option<Netd>, String> {
    let (Some(net), Some(netd)) = (&cfg.net, netd) else { return Ok(None) };
    let netd = netd.map_err(|e| format!("the sandbox's network: {e}"))?;
    let link = link.ok_or("the sandbox's network: the backend made no network link")?;
    netd.send_start(&common.sandbox_id, link, net).map_err(|e| format!("the sandbox's network: {e}"))?;
    Ok(Some(netd))
}

/// netd's answer to the start [`connect_network`] sent (Ok without a netd).
async fn network_started(netd: Option<Arc<Netd>>) -> Result<(), String> {
    let Some(netd) = netd else { return Ok(()) };
    let t = Instant::now();
    let r = tokio::task::spawn_blocking(move || netd.await_start()).await;
    tracing::debug!(waited = ?t.elapsed(), "netd started");
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the sandbox's network: {e}")),
        Err(e) => Err(format!("the sandbox's network: {e}")),
    }
}

/// `msg`, followed by the sandbox's last console lines when it has any.
fn with_console(msg: String, sandbox: &dyn Sandbox) -> String {
    match sandbox.console_tail() {
        tail if tail.is_empty() => msg,
        tail => format!("{msg}; console: {tail}"),
    }
}

/// Moves the sandbox's readiness from Starting to `state`; the first final
/// state wins (a netd that died first, or the agent's answer).
fn settle(ready: &watch::Sender<Readiness>, state: Readiness) {
    ready.send_if_modified(|s| match s {
        Readiness::Starting => {
            *s = state;
            true
        }
        _ => false,
    });
}

/// Notices the broker's end of the lifeline closing (the broker is gone):
/// a sandbox that outlives its broker only logs it (a restarted broker
/// re-adopts it through the socket); otherwise the worker exits with it.
fn watch_lifeline(fd: RawFd, sandbox: Option<Arc<dyn Sandbox>>, outlive: bool) {
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        // SAFETY: read(2) into a local buffer on an fd the broker handed us.
        while unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) } > 0 {}
        if outlive && sandbox.is_some() {
            eprintln!("pvisor-worker: the broker is gone; the sandbox keeps running");
            return;
        }
        if let Some(s) = sandbox {
            s.kill();
        }
        std::process::exit(0);
    });
}

/// Keeps the sandbox's views of itself current (backend::Sandbox::refresh_views);
/// the first failure is logged, later ones of the same kind are not.
fn refresh_views(sandbox: Arc<dyn Sandbox>) {
    std::thread::spawn(move || {
        let mut failing = false;
        loop {
            std::thread::sleep(backend::VIEW_REFRESH);
            match sandbox.refresh_views() {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    tracing::warn!("{e}");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    });
}

/// What `Agent.Refresh` gives a guest: the host's time now, 64 bytes from
/// the host's getrandom, the sandbox's hostname.
fn guest_refresh(hostname: &str) -> pvisor_proto::agent::RefreshRequest {
    let mut entropy = vec![0u8; 64];
    // SAFETY: getrandom writes at most entropy.len() bytes into the buffer we own.
    let n = unsafe { libc::getrandom(entropy.as_mut_ptr().cast(), entropy.len(), 0) };
    entropy.truncate(n.max(0) as usize);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    pvisor_proto::agent::RefreshRequest { unix_time_ns: now.as_nanos() as i64, entropy, hostname: hostname.to_string() }
}

/// Exits the worker when the sandbox ends (a crash unless shutting down).
fn watch_sandbox(sandbox: Arc<dyn Sandbox>) {
    std::thread::spawn(move || {
        let exit = sandbox.wait();
        if pvisor_worker::expiry::EXPIRED.load(Ordering::SeqCst) {
            std::process::exit(pvisor_worker::expiry::EXPIRED_EXIT_CODE);
        }
        if SHUTTING_DOWN.load(Ordering::SeqCst) {
            std::process::exit(0);
        }
        eprintln!("pvisor-worker: {}", with_console(format!("sandbox {exit}"), sandbox.as_ref()));
        std::process::exit(10);
    });
}

fn main() {
    let group = join_cgroup();
    // Started before the configuration arrives, so a create does not wait
    // for it; a configuration without `net` drops it.
    let netd = Netd::spawn(group.as_ref());
    // Before the configuration too: the work done ahead of it logs.
    tracing_subscriber::fmt()
        // virtio-queue logs an error per bad notify: a guest could fill the
        // host's disk through this log, so it stays silent.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PVISOR_LOG")
                .unwrap_or_else(|_| "info,virtio_queue=off,vhost_user_backend=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let Some((cfg, common)) = wait_config() else { return };
    // Cosmetic: a worker whose title cannot be set still runs its sandbox.
    let title = pvisor_worker::title::set(&pvisor_worker::title::of_sandbox(&common.sandbox_id));
    // Loopback only: the idle netd is killed and reaped.
    let netd = cfg.net.is_some().then_some(netd);
    let t0 = Instant::now();
    if let Err(e) = title {
        tracing::warn!(sandbox = %common.sandbox_id, "process title: {e}");
    }
    set_cloexec(LISTEN_FD);
    set_cloexec(LIFELINE_FD);
    pvisor_worker::harden::protect_worker();
    // Start the sandbox while this process is still single-threaded. Threads
    // the backend starts (a VMM's vCPUs and devices) install their own filters.
    let backend = backend::for_config(&cfg);
    let filter = backend.as_ref().ok().and_then(|b| filter_of(b.threads(), Thread::Api));
    let sync = backend.as_ref().is_ok_and(|b| b.sync_filter());
    let started = backend.and_then(|b| b.start(&common, &cfg));
    let t_started = t0.elapsed();
    let t_net = Instant::now();
    let (sandbox, initial, netd) = match started {
        Ok(s) => match connect_network(&common, &cfg, netd, s.net_link) {
            Ok(netd) => (Some(Arc::<dyn Sandbox>::from(s.sandbox)), Readiness::Starting, netd),
            Err(e) => {
                tracing::error!(sandbox = %common.sandbox_id, "{e}");
                s.sandbox.kill();
                (None, Readiness::Failed(e), None)
            }
        },
        Err(e) => {
            tracing::error!(sandbox = %common.sandbox_id, "{e}");
            (None, Readiness::Failed(e.to_string()), None)
        }
    };
    // The main thread's filter, inherited by the watcher threads below.
    let filter = filter.unwrap_or(pvisor_seccomp::FilterKind::Worker);
    let apply = if sync { pvisor_seccomp::apply_to_all_threads } else { pvisor_seccomp::apply_to_thread };
    match pvisor_seccomp::filter(filter).and_then(|f| apply(&f)) {
        Ok(()) => {}
        Err(e) => fail(format!("seccomp: {e}")),
    }
    tracing::debug!(started = ?t_started, network = ?t_net.elapsed(), seccomp = ?t0.elapsed(), "worker start-up");
    watch_lifeline(LIFELINE_FD, sandbox.clone(), cfg.outlive_broker);
    let (ready_tx, ready_rx) = watch::channel(initial);
    let netd = netd.map(|mut n| {
        // A netd that dies before the sandbox is ready fails the start.
        let ready = ready_tx.clone();
        n.watch(move |how| {
            // Worded as a start that found netd gone: whichever of the two
            // sees the death first, the reason reads the same.
            let gone = NetdError::Gone(how.to_owned());
            settle(&ready, Readiness::Failed(format!("the sandbox's network: {gone}")));
        });
        Arc::new(n)
    });
    if let Some(sb) = &sandbox {
        watch_sandbox(sb.clone());
        refresh_views(sb.clone());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| fail(e));
    rt.block_on(async move {
        // SAFETY: the broker passed a listening Unix socket at this fd number,
        // owned by nobody else in this process.
        let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(LISTEN_FD) };
        listener.set_nonblocking(true).unwrap_or_else(|e| fail(e));
        let listener = tokio::net::UnixListener::from_std(listener).unwrap_or_else(|e| fail(e));
        // Reflection in both versions: grpcurl asks v1 first, older grpcurl and Google's own
        // reflection clients (grpcio-reflection) speak only v1alpha.
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pvisor_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .unwrap_or_else(|e| fail(e));
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pvisor_proto::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .unwrap_or_else(|e| fail(e));
        // netd takes the link while the agent is connected and configured.
        let net_started = tokio::spawn(network_started(netd.clone()));
        let deadline = Arc::new(watch::channel(cfg.deadline_unix_ms.max(0)).0);
        pvisor_worker::expiry::enforce(&deadline, sandbox.clone());
        let svc = WorkerService::new(sandbox.clone(), netd, ready_rx, common.cgroup.clone(), common.limits, deadline);
        let mut router = tonic::transport::Server::builder()
            .add_service(WorkerServer::new(svc))
            .add_service(reflection)
            .add_service(reflection_v1alpha);
        if let Some(sb) = sandbox.clone() {
            match agent_link::connect(sb.clone()).await {
                Ok(channel) => {
                    tracing::debug!(connected = ?t0.elapsed(), "agent link");
                    router = router.add_service(AgentForward::new(channel.clone()));
                    let mut client = AgentClient::new(channel);
                    let agent_cfg = cfg.agent.clone().unwrap_or_default();
                    let hostname = common.hostname.clone();
                    let capture = match &cfg.backend {
                        Some(config::BackendConfig::Vm(v)) => v.template_capture.clone(),
                        _ => None,
                    };
                    let ready_timeout = agent_ready_timeout(&cfg);
                    tokio::spawn(async move {
                        // One deadline for connecting (a guest's boot) and configuring.
                        let deadline = tokio::time::Instant::from_std(t0 + ready_timeout);
                        let r = tokio::time::timeout_at(deadline, async {
                            let captured = match capture {
                                Some(c) => pvisor_worker::vm::capture::capture(&mut client, sb.clone(), c).await,
                                None => None,
                            };
                            // A guest restored from a snapshot resets its vsock connections once
                            // it runs (the transport reset QEMU sends after loading): these calls
                            // are made again on the reconnected channel.
                            let ping = until_connected(|| {
                                let (mut c, cfg) = (client.clone(), agent_cfg.clone());
                                async move { c.configure(cfg).await }
                            })
                            .await?;
                            tracing::debug!(configured = ?t0.elapsed(), "agent link");
                            // A guest gets the host's clock, fresh entropy and its hostname
                            // before anything runs in it (a restored one resumes with its source's).
                            if sb.backend() == "vm" {
                                until_connected(|| {
                                    let mut c = client.clone();
                                    let req = guest_refresh(&hostname);
                                    async move { c.refresh(req).await }
                                })
                                .await?;
                            }
                            Ok::<_, tonic::Status>((ping, captured))
                        })
                        .await;
                        // Ready needs both the agent and the network.
                        let net = net_started.await.unwrap_or_else(|e| Err(format!("the sandbox's network: {e}")));
                        let state = match (r, net) {
                            (Ok(Ok((p, captured))), Ok(())) => Readiness::Ready(ReadyReply {
                                backend: sb.backend().into(),
                                agent_pid: sb.init_pid() as u32,
                                agent_version: p.into_inner().version,
                                boot_us: t0.elapsed().as_micros() as u64,
                                template_cmdline: captured.as_ref().map(|c| c.cmdline.clone()).unwrap_or_default(),
                                template_capture_us: captured.map(|c| c.stopped.as_micros() as u64).unwrap_or(0),
                            }),
                            (Ok(Ok(_)), Err(e)) => Readiness::Failed(e),
                            (Ok(Err(e)), _) if pvisor_proto::hook_failure_of(&e).is_some() => Readiness::HookFailed(e),
                            (Ok(Err(e)), _) => Readiness::Failed(format!("configuring the agent: {}", e.message())),
                            (Err(_), _) => Readiness::Failed(with_console(
                                format!("the agent did not answer within {} s", ready_timeout.as_secs()),
                                sb.as_ref(),
                            )),
                        };
                        settle(&ready_tx, state);
                    });
                }
                Err(e) => {
                    settle(&ready_tx, Readiness::Failed(with_console(e.to_string(), sb.as_ref())));
                }
            }
        }
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        if let Err(e) = router.serve_with_incoming(incoming).await {
            fail(e);
        }
    });
}

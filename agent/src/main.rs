//! pvisor-agent: PID 1 of a sandbox.
//!
//! Usage: `pvisor-agent --fd N` (the backend's connection) or
//! `pvisor-agent --listen PATH` (tests). The configuration comes from
//! `PVISOR_AGENT_CONFIG` (JSON) or `--config JSON`.
use pvisor_agent::config::AgentConfig;
use pvisor_agent::service::AgentService;
use pvisor_agent::{reaper, server};
use pvisor_proto::agent::ExecRequest;

struct Args {
    fd: Option<i32>,
    listen: Option<std::path::PathBuf>,
    config: AgentConfig,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { fd: None, listen: None, config: AgentConfig::default() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--fd" => a.fd = Some(val.parse().map_err(|_| format!("bad fd {val}"))?),
            "--listen" => a.listen = Some(val.into()),
            "--config" => a.config = serde_json::from_str(&val).map_err(|e| format!("bad config: {e}"))?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if let Ok(json) = std::env::var("PVISOR_AGENT_CONFIG") {
        a.config = serde_json::from_str(&json).map_err(|e| format!("bad PVISOR_AGENT_CONFIG: {e}"))?;
        std::env::remove_var("PVISOR_AGENT_CONFIG");
    }
    if a.fd.is_none() && a.listen.is_none() {
        return Err("one of --fd or --listen is required".into());
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pvisor-agent: {e}");
            std::process::exit(2);
        }
    };
    // Sandbox processes share our uid: make sure they cannot ptrace us or open
    // our /proc/1/fd entries (the control connection lives there).
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // Under the sandbox's memory pressure the kernel would evict our text and
    // we would thrash instead of killing what causes the pressure: lock the
    // pages we touch (the worker raised RLIMIT_MEMLOCK for us). Best effort.
    // SAFETY: mlockall takes flags only.
    unsafe {
        libc::mlockall(libc::MCL_CURRENT | libc::MCL_ONFAULT);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PVISOR_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let entrypoint = args.config.entrypoint.clone();
    let svc = AgentService::new(args.config);
    let result = rt.block_on(async move {
        tokio::spawn(async {
            if let Err(e) = reaper::run().await {
                tracing::error!("reaper: {e}");
            }
        });
        if !entrypoint.is_empty() {
            let req = ExecRequest { argv: entrypoint.clone(), background: true, ..Default::default() };
            let (tx, _rx) = tokio::sync::mpsc::channel(1);
            if let Err(e) = svc.commands.exec(req, tx, Some("entrypoint".into())) {
                tracing::warn!("entrypoint {entrypoint:?} did not start: {e}");
            }
        }
        match (args.fd, args.listen) {
            (Some(fd), _) => server::serve_fd(fd, svc).await,
            (None, Some(p)) => server::serve_path(&p, svc).await,
            (None, None) => unreachable!("checked in parse_args"),
        }
    });
    if let Err(e) = result {
        eprintln!("pvisor-agent: {e}");
        std::process::exit(1);
    }
}

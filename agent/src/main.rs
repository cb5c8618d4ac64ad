//! pvisor-agent: PID 1 of a sandbox.
//!
//! Usage: `pvisor-agent --fd N` (ns: N is the connection socket over which
//! the worker sends a stream per connection), `pvisor-agent --listen PATH`
//! (tests), or no arguments as PID 1 (vm: `/init` of the guest, which builds
//! the sandbox's root and serves on vsock). The configuration arrives over
//! the first connection, as `Agent.Configure`.
use pvisor_agent::service::AgentService;
use pvisor_agent::{reaper, server};

enum Serve {
    Fd(i32),
    Listen(std::path::PathBuf),
    Vsock(std::os::fd::OwnedFd),
}

fn parse_args() -> Result<Serve, String> {
    let mut serve = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        serve = Some(match flag.as_str() {
            "--fd" => Serve::Fd(val.parse().map_err(|_| format!("bad fd {val}"))?),
            "--listen" => Serve::Listen(val.into()),
            _ => return Err(format!("unknown argument {flag}")),
        });
    }
    serve.ok_or_else(|| "one of --fd or --listen is required".into())
}

fn main() {
    // A guest's init: build the root before any thread exists.
    let guest = pvisor_agent::guest::is_guest_init().then(pvisor_agent::guest::init);
    let in_guest = guest.is_some();
    let serve = match guest {
        Some((_cfg, listener)) => Ok(Serve::Vsock(listener)),
        None => parse_args(),
    };
    let serve = match serve {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pvisor-agent: {e}");
            std::process::exit(2);
        }
    };
    // Sandbox processes share our uid: make sure they cannot ptrace us or open
    // our /proc/1/fd entries (the control connection lives there).
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("pvisor-agent: prctl(PR_SET_DUMPABLE): {e}");
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
    let svc = AgentService::new();
    let result = rt.block_on(async move {
        tokio::spawn(async {
            if let Err(e) = reaper::run().await {
                tracing::error!("reaper: {e}");
            }
        });
        match serve {
            Serve::Fd(fd) => server::serve_incoming(server::fd_connections(fd)?, svc).await,
            Serve::Listen(p) => server::serve_path(&p, svc).await,
            Serve::Vsock(fd) => {
                use pvisor_agent::guest::vsock::{VsockListener, CID_HOST};
                let listener = VsockListener::from_bound(fd).map_err(|e| format!("listen on vsock: {e}"))?;
                server::serve_incoming(listener.incoming_from(CID_HOST), svc)
                    .await
                    .map_err(|e| format!("serve: {e}").into())
            }
        }
    });
    if let Err(e) = result {
        eprintln!("pvisor-agent: {e}");
        if in_guest {
            // PID 1 of a guest: end the VM rather than panic its kernel.
            pvisor_agent::guest::power::poweroff();
        }
        std::process::exit(1);
    }
}

//! pvisor-agent: PID 1 of a sandbox.
//!
//! Usage: `pvisor-agent --fd N [--isolator-fd M]` (ns: N is the connection
//! socket over which the worker sends a stream per connection, M the agent's
//! end of its isolator's socket), `pvisor-agent --listen PATH` (tests), or
//! no arguments as PID 1 (vm: `/init` of the guest, which builds the
//! sandbox's root, forks its isolator and serves on vsock). The
//! configuration arrives over the first connection, as `Agent.Configure`.
//!
//! `pvisor-agent --isolator N [--uppers M]` is the isolator itself (ns: exec'd
//! by the sandbox's init before it drops its privileges; see
//! `pvisor_agent::isolated::isolator`).
use pvisor_agent::service::AgentService;
use pvisor_agent::{reaper, server};

enum Serve {
    Fd(i32),
    Listen(std::path::PathBuf),
    Vsock(std::os::fd::OwnedFd),
}

/// What the command line asks for.
enum Mode {
    Agent { serve: Serve, isolator: Option<i32> },
    Isolator { sock: i32, uppers: Option<i32> },
}

fn parse_args() -> Result<Mode, String> {
    let (mut serve, mut isolator, mut isolator_sock, mut uppers) = (None, None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let val = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let fd = || val.parse::<i32>().map_err(|_| format!("bad fd {val}"));
        match flag.as_str() {
            "--fd" => serve = Some(Serve::Fd(fd()?)),
            "--listen" => serve = Some(Serve::Listen(val.clone().into())),
            "--isolator-fd" => isolator = Some(fd()?),
            "--isolator" => isolator_sock = Some(fd()?),
            "--uppers" => uppers = Some(fd()?),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if let Some(sock) = isolator_sock {
        return Ok(Mode::Isolator { sock, uppers });
    }
    let serve = serve.ok_or("one of --fd or --listen is required")?;
    Ok(Mode::Agent { serve, isolator })
}

/// Takes an inherited fd (close-on-exec from now on: no sandbox process gets it).
fn inherited(fd: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: the fd was passed on the command line by whoever exec'd us and
    // nothing else in this process owns it; we take ownership exactly once.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let _ = nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    fd
}

fn main() {
    // A guest's init: build the root before any thread exists.
    let guest = pvisor_agent::guest::is_guest_init().then(pvisor_agent::guest::init);
    let in_guest = guest.is_some();
    let mode = match guest {
        Some(g) => Ok((Serve::Vsock(g.listener), g.isolator)),
        None => parse_args().map(|m| match m {
            Mode::Isolator { sock, uppers } => {
                pvisor_agent::isolated::isolator::main(inherited(sock), uppers.map(inherited))
            }
            Mode::Agent { serve, isolator } => (serve, isolator.map(inherited)),
        }),
    };
    let (serve, isolator) = match mode {
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
    let svc = AgentService::with_isolator(isolator);
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

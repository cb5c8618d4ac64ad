//! `pvisor`: the broker daemon (`serve`) and a CLI for it.
mod api;
mod catalog;
mod cli;
mod durable;
mod execd;
mod http;
mod metrics;
mod sandbox;
mod server;
mod snapshot;
mod volumes;

use clap::{Parser, Subcommand};
use sandbox::backend::BackendChoice;
use sandbox::net::DefaultEgress;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "pvisor", version, about = "OpenSandbox-compatible local sandboxes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct ServerArg {
    /// Address of the running daemon.
    #[arg(long, env = "PVISOR_SERVER", default_value = "127.0.0.1:8080")]
    server: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the broker daemon.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[arg(long, env = "PVISOR_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// The worker binary (default: next to this executable).
        #[arg(long)]
        worker_bin: Option<PathBuf>,
        /// The static agent binary (default: next to this executable).
        #[arg(long)]
        agent_bin: Option<PathBuf>,
        /// The image server binary (default: next to this executable).
        #[arg(long)]
        imaged_bin: Option<PathBuf>,
        /// Start even where no cgroup can be created (sandboxes get no limits).
        #[arg(long)]
        allow_no_cgroups: bool,
        /// Pull an image from its registry when a create names one the pool lacks
        /// (with the request's `image.auth`, if any).
        #[arg(long)]
        allow_pull: bool,
        /// Stop an image's server once no sandbox has used it for this many
        /// seconds (releasing the pack files it holds open).
        #[arg(long, default_value_t = 300)]
        image_idle_secs: u64,
        /// Workers started ahead of demand, so a create does not wait for one.
        #[arg(long, default_value_t = 2)]
        warm_workers: usize,
        /// The backend of creates that do not name one (`extensions`
        /// `pvisor.io/backend`): auto picks vm where hardware virtualization
        /// is present, else ns (`pvisor doctor` says which and why).
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// The guest kernel of vm sandboxes (an uncompressed vmlinux with a
        /// PVH entry; `scripts/guest-kernel.sh` builds it).
        #[arg(long, env = "PVISOR_GUEST_KERNEL")]
        guest_kernel: Option<PathBuf>,
        /// What a sandbox created without a `networkPolicy` gets: allow (a
        /// network under the allow-all policy; loopback, link-local, the host
        /// and private ranges stay refused) or none (loopback only).
        #[arg(long, value_enum, default_value = "allow")]
        default_egress: DefaultEgress,
        /// Upstream DNS resolver of sandboxes, ADDR or ADDR:PORT (repeatable;
        /// default: the nameservers of the host's /etc/resolv.conf).
        #[arg(long = "net-dns", value_name = "ADDR[:PORT]")]
        net_dns: Vec<String>,
        /// An address or CIDR no sandbox may reach, whatever its policy
        /// (repeatable; the broker's listen address is always refused).
        #[arg(long = "net-deny", value_name = "ADDR|CIDR")]
        net_deny: Vec<String>,
        /// A host directory beneath which sandboxes may mount host paths
        /// (repeatable; none by default, so every host volume is refused).
        #[arg(long = "allow-host-path", value_name = "PREFIX")]
        allow_host_paths: Vec<PathBuf>,
        /// End every sandbox when the broker stops or dies (the default keeps
        /// them running, and a restarted broker re-adopts them).
        #[arg(long)]
        stop_sandboxes_on_exit: bool,
        #[command(flatten)]
        http: Box<http::HttpLimits>,
        /// Disk bound of an ns sandbox's writable layer (and upper size of its
        /// /tmp) when its create names none (`resourceLimits`
        /// `ephemeral-storage`): a quantity such as 10Gi, or 0 for none. Root
        /// only (a loop-mounted ext4 per sandbox); an unprivileged broker
        /// bounds /tmp and /dev/shm by the memory limit only.
        #[arg(long, value_name = "SIZE", default_value = sandbox::disk::DEFAULT_LIMIT,
              value_parser = parse_disk_limit)]
        disk_limit: u64,
        /// How log lines are written to stderr: text (for people) or json
        /// (one JSON object per line, for log shippers).
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
        /// Opt every ns sandbox into kernel same-page merging (KSM), and turn
        /// the host's KSM on where this broker may (root): identical pages of
        /// sandboxes are then shared. Costs ksmd CPU, and merged pages can
        /// leak through write timing across sandboxes (see README).
        #[arg(long)]
        memory_merge: bool,
        /// vm templates: the first create of an image and shape saves its
        /// booted guest, later ones restore from it (the project's VMM maps
        /// its memory copy-on-write, so clones share untouched pages). Off by
        /// default.
        #[arg(long)]
        vm_templates: bool,
        /// Sandboxes started ahead of demand for each template of the API
        /// (`/v1/templates`), so a create from the template takes one that
        /// already runs; 0 for none.
        #[arg(long, default_value_t = 1)]
        template_warm: usize,
        /// How long a create waits for its sandbox to be ready (worker started, machine
        /// booted or restored, agent configured) before it fails and is cleaned up. Keep
        /// it below the clients' request timeout (the SDK's is 30 s by default).
        #[arg(long, env = "PVISOR_READY_TIMEOUT_SECS", default_value_t = 20,
              value_parser = clap::value_parser!(u64).range(3..=3600))]
        ready_timeout_secs: u64,
    },
    /// Show kernel same-page merging: the host's ksmd and each sandbox's merged pages.
    MemoryMerge {
        #[command(flatten)]
        server: ServerArg,
        #[arg(long)]
        json: bool,
    },
    /// Explain what this host supports and which backend `auto` picks.
    Doctor {
        #[arg(long, env = "PVISOR_GUEST_KERNEL")]
        guest_kernel: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Manage images.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Manage named volumes (`pvc` volumes of sandboxes).
    Volume {
        #[command(subcommand)]
        cmd: VolumeCmd,
    },
    /// List sandboxes with their backend, worker pid and cgroup.
    Ps {
        #[command(flatten)]
        server: ServerArg,
        /// The list as JSON (an array).
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox (`-it`: interactively, on a terminal).
    Exec {
        #[command(flatten)]
        server: ServerArg,
        /// Keep stdin open (with -t: the terminal's input).
        #[arg(short, long)]
        interactive: bool,
        /// Run the command on a terminal in the sandbox: raw mode here,
        /// window size and Ctrl-C forwarded.
        #[arg(short, long)]
        tty: bool,
        id: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Manage snapshots (of the running daemon).
    Snapshot {
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
    /// The entrypoint's output of a sandbox.
    Logs {
        #[command(flatten)]
        server: ServerArg,
        /// Keep printing new output until the entrypoint ends or the sandbox goes.
        #[arg(short, long)]
        follow: bool,
        id: String,
    },
    /// CPU, memory, processes and network of every sandbox (like `docker stats`).
    Stats {
        #[command(flatten)]
        server: ServerArg,
        /// Print one table (after a one-second sample) instead of one a second.
        #[arg(long)]
        no_stream: bool,
        /// Rows as JSON arrays (one per sample).
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script (e.g. `pvisor completions bash > /etc/bash_completion.d/pvisor`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Delete sandboxes.
    Rm {
        #[command(flatten)]
        server: ServerArg,
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// `pvisor serve --log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// List snapshots, newest first.
    Ls {
        #[command(flatten)]
        server: ServerArg,
        /// Only the snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshots (sandboxes restored from them keep running).
    Rm {
        #[command(flatten)]
        server: ServerArg,
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Import docker-archive or OCI-layout tarballs into the local image pool.
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        pool: PoolArgs,
        /// One JSON object per progress event on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Pull images from an OCI registry into the local image pool.
    Pull {
        #[arg(required = true)]
        references: Vec<String>,
        #[command(flatten)]
        pool: PoolArgs,
        #[command(flatten)]
        registry: cli::image::PullArgs,
        /// One JSON object per progress event on stdout.
        #[arg(long)]
        json: bool,
    },
    /// List the pool's images.
    Ls {
        #[command(flatten)]
        pool: PoolArgs,
        #[arg(long)]
        json: bool,
    },
    /// Remove image names or ids from the pool, then collect garbage.
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
        #[command(flatten)]
        pool: PoolArgs,
        /// Leave unreferenced chunks for a later `pvisor image gc`.
        #[arg(long)]
        no_gc: bool,
    },
    /// Delete chunks no image references (safe while sandboxes run).
    Gc {
        #[command(flatten)]
        pool: PoolArgs,
        #[arg(long)]
        json: bool,
    },
    /// Disk usage of the pool: allocated, logical, deduplicated and compressed sizes.
    Du {
        #[command(flatten)]
        pool: PoolArgs,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Create a named volume (nothing happens if it exists).
    Create {
        name: String,
        #[command(flatten)]
        pool: PoolArgs,
    },
    /// List named volumes.
    Ls {
        #[command(flatten)]
        pool: PoolArgs,
        #[arg(long)]
        json: bool,
    },
    /// Show named volumes (with --json: an array with `Mountpoint`, the host directory).
    Inspect {
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        pool: PoolArgs,
        #[arg(long)]
        json: bool,
    },
    /// Remove named volumes and their content (refused while a sandbox uses one).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        pool: PoolArgs,
    },
}

#[derive(clap::Args)]
struct PoolArgs {
    #[arg(long, env = "PVISOR_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

/// `--disk-limit`: `0` or a quantity the API would accept.
fn parse_disk_limit(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        q => api::limits::parse_bytes("ephemeral-storage", q).map_err(|e| e.to_string()),
    }
}

async fn run(cli: Cli) -> Result<i32, String> {
    match cli.cmd {
        Cmd::Serve {
            listen,
            data_dir,
            worker_bin,
            agent_bin,
            imaged_bin,
            allow_no_cgroups,
            allow_pull,
            image_idle_secs,
            warm_workers,
            backend,
            guest_kernel,
            default_egress,
            net_dns,
            net_deny,
            allow_host_paths,
            stop_sandboxes_on_exit,
            http,
            disk_limit,
            log_format: _,
            memory_merge,
            vm_templates,
            template_warm,
            ready_timeout_secs,
        } => {
            let data_dir = data_dir.unwrap_or_else(server::default_data_dir);
            server::serve(server::ServeOptions {
                listen,
                data_dir,
                worker_bin,
                agent_bin,
                imaged_bin,
                allow_no_cgroups,
                allow_pull,
                image_idle: std::time::Duration::from_secs(image_idle_secs),
                warm_workers,
                backend,
                guest_kernel,
                default_egress,
                net_dns,
                net_deny,
                allow_host_paths,
                stop_sandboxes_on_exit,
                http: *http,
                disk_limit,
                memory_merge,
                vm_templates,
                template_warm,
                ready_timeout: std::time::Duration::from_secs(ready_timeout_secs),
            })
            .await?;
        }
        Cmd::Doctor { guest_kernel, json } => return Ok(cli::doctor::run(guest_kernel.as_deref(), json)),
        Cmd::Image { cmd: ImageCmd::Import { files, pool, json } } => {
            cli::image::import(&cli::image::pool(pool.data_dir)?, &files, cli::image::Output::detect(json))?
        }
        Cmd::Image { cmd: ImageCmd::Pull { references, pool, registry, json } } => cli::image::pull(
            &cli::image::pool(pool.data_dir)?,
            &references,
            &registry,
            cli::image::Output::detect(json),
        )?,
        Cmd::Image { cmd: ImageCmd::Ls { pool, json } } => cli::image::ls(&cli::image::pool(pool.data_dir)?, json)?,
        Cmd::Image { cmd: ImageCmd::Rm { references, pool, no_gc } } => {
            cli::image::rm(&cli::image::pool(pool.data_dir)?, &references, no_gc)?
        }
        Cmd::Image { cmd: ImageCmd::Gc { pool, json } } => cli::image::gc(&cli::image::pool(pool.data_dir)?, json)?,
        Cmd::Image { cmd: ImageCmd::Du { pool, json } } => cli::image::du(&cli::image::pool(pool.data_dir)?, json)?,
        Cmd::Volume { cmd } => volume_cmd(cmd)?,
        Cmd::Ps { server, json } => cli::ps(&cli::client::Client::new(&server.server), json).await?,
        Cmd::MemoryMerge { server, json } => {
            cli::memory_merge::show(&cli::client::Client::new(&server.server), json).await?
        }
        Cmd::Exec { server, id, command, interactive, tty } => {
            let c = cli::client::Client::new(&server.server);
            return match (interactive, tty) {
                (_, true) => cli::pty::exec_tty(&c, &id, &command).await,
                (true, false) => Err("-i needs -t here (stdin is only relayed to a terminal)".into()),
                (false, false) => cli::exec::exec(&c, &id, &command).await,
            };
        }
        Cmd::Snapshot { cmd: SnapshotCmd::Ls { server, sandbox, json } } => {
            cli::snapshot::ls(&cli::client::Client::new(&server.server), sandbox.as_deref(), json).await?
        }
        Cmd::Snapshot { cmd: SnapshotCmd::Rm { server, ids } } => {
            cli::snapshot::rm(&cli::client::Client::new(&server.server), &ids).await?
        }
        Cmd::Logs { server, follow, id } => {
            cli::logs::logs(&cli::client::Client::new(&server.server), &id, follow).await?
        }
        Cmd::Stats { server, no_stream, json } => {
            cli::stats::stats(&cli::client::Client::new(&server.server), no_stream, json).await?
        }
        Cmd::Completions { shell } => cli::completions::print::<Cli>(shell),
        Cmd::Rm { server, ids } => cli::rm(&cli::client::Client::new(&server.server), &ids).await?,
    }
    Ok(0)
}

fn volume_cmd(cmd: VolumeCmd) -> Result<(), String> {
    let dir = |p: PoolArgs| p.data_dir.unwrap_or_else(server::default_data_dir);
    match cmd {
        VolumeCmd::Create { name, pool } => cli::volume::create(&dir(pool), &name),
        VolumeCmd::Ls { pool, json } => cli::volume::ls(&dir(pool), json),
        VolumeCmd::Inspect { names, pool, json } => cli::volume::inspect(&dir(pool), &names, json),
        VolumeCmd::Rm { names, pool } => cli::volume::rm(&dir(pool), &names),
    }
}

/// Logs go to stderr, filtered by `PVISOR_LOG` (default `info`).
fn init_logging(format: LogFormat) {
    let filter = || tracing_subscriber::EnvFilter::try_from_env("PVISOR_LOG").unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter()).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.init(),
        // Span fields (a request's id) go into each line's `spans`.
        LogFormat::Json => fmt.json().with_current_span(false).with_span_list(true).init(),
    }
}

fn main() {
    let cli = Cli::parse();
    init_logging(match &cli.cmd {
        Cmd::Serve { log_format, .. } => *log_format,
        _ => LogFormat::Text,
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pvisor: {e}");
            std::process::exit(1);
        }
    }
}

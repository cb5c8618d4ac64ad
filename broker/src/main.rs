//! `pvisor`: the broker daemon (`serve`) and a CLI for it.
mod api;
mod cli;
mod execd;
mod sandbox;
mod server;

use clap::{Parser, Subcommand};
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
        /// Start even where no cgroup can be created (sandboxes get no limits).
        #[arg(long)]
        allow_no_cgroups: bool,
        /// Workers started ahead of demand, so a create does not wait for one.
        #[arg(long, default_value_t = 2)]
        warm_workers: usize,
    },
    /// Manage images.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// List sandboxes.
    Ps(ServerArg),
    /// Run a command in a sandbox.
    Exec {
        #[command(flatten)]
        server: ServerArg,
        id: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Delete sandboxes.
    Rm {
        #[command(flatten)]
        server: ServerArg,
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Import docker-archive or OCI-layout tarballs into the local store.
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, env = "PVISOR_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
    /// List images (asks the daemon).
    Ls(ServerArg),
    /// Remove an image name from the local store.
    Rm {
        reference: String,
        #[arg(long, env = "PVISOR_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
}

fn store(data_dir: Option<PathBuf>) -> Result<pvisor_images::ImageStore, String> {
    let data = data_dir.unwrap_or_else(server::default_data_dir);
    server::secure_dirs(&[&data, &data.join("images")])?;
    pvisor_images::ImageStore::open(&data.join("images")).map_err(|e| e.to_string())
}

async fn run(cli: Cli) -> Result<i32, String> {
    match cli.cmd {
        Cmd::Serve { listen, data_dir, worker_bin, agent_bin, allow_no_cgroups, warm_workers } => {
            let data_dir = data_dir.unwrap_or_else(server::default_data_dir);
            server::serve(server::ServeOptions {
                listen,
                data_dir,
                worker_bin,
                agent_bin,
                allow_no_cgroups,
                warm_workers,
            })
            .await?;
        }
        Cmd::Image { cmd: ImageCmd::Import { files, data_dir } } => {
            let s = store(data_dir)?;
            for f in files {
                let t = std::time::Instant::now();
                let imported = s.import(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                for i in imported {
                    let names = if i.names.is_empty() { "<none>".to_string() } else { i.names.join(", ") };
                    println!("imported {names} ({}) in {:.2} s", i.id, t.elapsed().as_secs_f64());
                }
            }
        }
        Cmd::Image { cmd: ImageCmd::Ls(s) } => cli::image_ls(&cli::client::Client::new(&s.server)).await?,
        Cmd::Image { cmd: ImageCmd::Rm { reference, data_dir } } => {
            store(data_dir)?.remove(&reference).map_err(|e| e.to_string())?;
            println!("removed {reference}");
        }
        Cmd::Ps(s) => cli::ps(&cli::client::Client::new(&s.server)).await?,
        Cmd::Exec { server, id, command } => {
            return cli::exec::exec(&cli::client::Client::new(&server.server), &id, &command).await
        }
        Cmd::Rm { server, ids } => cli::rm(&cli::client::Client::new(&server.server), &ids).await?,
    }
    Ok(0)
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PVISOR_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("pvisor: {e}");
            std::process::exit(1);
        }
    }
}

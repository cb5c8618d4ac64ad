//! `pvisor image ...`: commands on the local image pool (no daemon needed).
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use pvisor_images::{ImportEvent, Pool};

/// Opens the pool under the data dir (created private if needed).
pub fn pool(data_dir: Option<PathBuf>) -> Result<Pool, String> {
    let data = data_dir.unwrap_or_else(crate::server::default_data_dir);
    crate::server::secure_dirs(&[&data, &data.join("images")])?;
    Pool::open(&data.join("images")).map_err(|e| e.to_string())
}

/// How to tell the user what happens: a progress line on a terminal, JSON
/// lines with `--json`, else one line per image.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Terminal,
    Plain,
    Json,
}

impl Output {
    pub fn detect(json: bool) -> Output {
        match (json, std::io::stderr().is_terminal()) {
            (true, _) => Output::Json,
            (false, true) => Output::Terminal,
            (false, false) => Output::Plain,
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn names_of(names: &[String]) -> String {
    if names.is_empty() {
        "<none>".into()
    } else {
        names.join(", ")
    }
}

/// Prints one import event in the chosen style.
pub fn show(out: Output, e: &ImportEvent) {
    match (out, e) {
        (Output::Json, e) => println!("{}", serde_json::to_string(e).unwrap_or_default()),
        (Output::Terminal, ImportEvent::Layer { layer, layers, done, total, .. }) => {
            eprint!("\r\x1b[2K  layer {layer}/{layers}: {:.1} / {:.1} MiB", mib(*done), mib(*total));
            let _ = std::io::stderr().flush();
        }
        (Output::Terminal, ImportEvent::Image { names, layers, bytes, .. }) => {
            eprintln!("importing {} ({layers} layers, {:.1} MiB)", names_of(names), mib(*bytes));
        }
        (_, ImportEvent::Done { id, names, reused, stats }) => {
            if out == Output::Terminal {
                eprint!("\r\x1b[2K");
            }
            if *reused {
                println!("{} ({id}): already in the pool", names_of(names));
            } else {
                println!(
                    "{} ({id}): {:.1} MiB of files in {:.2} s ({:.0} MB/s of layer data); {} new chunks, {:.1} MiB stored",
                    names_of(names),
                    mib(stats.file_bytes),
                    stats.seconds,
                    stats.layer_bytes as f64 / 1e6 / stats.seconds.max(1e-6),
                    stats.new_chunks,
                    mib(stats.new_compressed),
                );
            }
        }
        _ => {}
    }
}

/// `pvisor image import FILE...`
pub fn import(pool: &Pool, files: &[PathBuf], out: Output) -> Result<(), String> {
    for f in files {
        pool.import_with(f, &mut |e| show(out, &e)).map_err(|e| format!("{}: {e}", f.display()))?;
    }
    Ok(())
}

/// `pvisor image ls`: the pool's images, read from disk (no daemon needed).
pub fn ls(pool: &Pool, json: bool) -> Result<(), String> {
    let list = pool.list().map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list).unwrap_or_default());
        return Ok(());
    }
    println!("{:<44} {:<14} {:>10}  IMPORTED", "NAME", "ID", "FILES MiB");
    for i in &list {
        let id = i.id.trim_start_matches("sha256:");
        let names = if i.names.is_empty() { vec!["<none>".to_string()] } else { i.names.clone() };
        for n in names {
            println!("{:<44} {:<14} {:>10.1}  {}", n, &id[..12.min(id.len())], mib(i.size_bytes), i.imported_at);
        }
    }
    Ok(())
}

/// `pvisor image du`
pub fn du(pool: &Pool, json: bool) -> Result<(), String> {
    let r = pool.du().map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        return Ok(());
    }
    println!("{:<40} {:>12} {:>12} {:>12}", "IMAGE", "FILES MiB", "CHUNKS MiB", "STORED MiB");
    for i in &r.images {
        println!(
            "{:<40} {:>12.1} {:>12.1} {:>12.1}",
            i.names.first().cloned().unwrap_or_else(|| i.id.chars().take(19).collect()),
            mib(i.logical_bytes),
            mib(i.chunk_bytes),
            mib(i.compressed_bytes),
        );
    }
    println!(
        "pool: {:.1} MiB allocated; {:.1} MiB of files, {:.1} MiB after deduplication, {:.1} MiB compressed; \
         {:.1} MiB unreferenced; {} chunks in {} packs",
        mib(r.allocated_bytes),
        mib(r.logical_bytes),
        mib(r.deduplicated_bytes),
        mib(r.compressed_bytes),
        mib(r.unreferenced_bytes),
        r.chunks,
        r.packs
    );
    Ok(())
}

/// `pvisor image gc`
pub fn gc(pool: &Pool, json: bool) -> Result<(), String> {
    let r = pool.gc().map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        println!(
            "removed {} chunks ({} packs deleted, {} rewritten, {} merged), kept {}; {:.1} → {:.1} MiB",
            r.chunks_removed,
            r.packs_removed,
            r.packs_rewritten,
            r.packs_merged,
            r.chunks_kept,
            mib(r.allocated_before),
            mib(r.allocated_after)
        );
    }
    Ok(())
}

/// `pvisor image rm REF...`: names or ids, then a gc unless told not to.
pub fn rm(pool: &Pool, refs: &[String], no_gc: bool) -> Result<(), String> {
    for r in refs {
        pool.remove(r).map_err(|e| e.to_string())?;
        println!("removed {r}");
    }
    if !no_gc {
        gc(pool, false)?;
    }
    Ok(())
}

/// Registry credentials and transport for `pvisor image pull`.
#[derive(clap::Args)]
pub struct PullArgs {
    /// Registry user (Basic auth or the token service).
    #[arg(long, env = "PVISOR_REGISTRY_USER")]
    pub username: Option<String>,
    /// Read the password (or token) from stdin.
    #[arg(long)]
    pub password_stdin: bool,
    /// Allow plain http for a non-loopback registry.
    #[arg(long)]
    pub insecure: bool,
}

/// `pvisor image pull REF...`
pub fn pull(pool: &Pool, refs: &[String], args: &PullArgs, out: Output) -> Result<(), String> {
    use pvisor_images::registry::{PullEvent, PullOptions};
    use pvisor_images::PullProgress;
    let password = if args.password_stdin {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).map_err(|e| format!("reading the password: {e}"))?;
        Some(s.trim_end_matches(['\r', '\n']).to_owned())
    } else {
        std::env::var("PVISOR_REGISTRY_PASSWORD").ok()
    };
    let opts = PullOptions {
        username: args.username.clone(),
        password,
        insecure_http: args.insecure,
        ..PullOptions::default()
    };
    for r in refs {
        let mut fetched = 0u64;
        let mut total = 0u64;
        pool.pull(r, &opts, &mut |p| match (out, p) {
            (Output::Json, p) => println!("{}", serde_json::to_string(&p).unwrap_or_default()),
            (_, PullProgress::Import(e)) => show(out, &e),
            (Output::Terminal, PullProgress::Fetch(PullEvent::Manifest { layers, total_bytes, .. })) => {
                total = total_bytes;
                eprintln!("pulling {r}: {layers} layers, {:.1} MiB", mib(total_bytes));
            }
            (Output::Terminal, PullProgress::Fetch(PullEvent::BlobDone { .. })) => fetched += 1,
            (Output::Terminal, PullProgress::Fetch(PullEvent::Blob { done, .. })) => {
                eprint!("\r\x1b[2K  blob {}: {:.1} MiB of {:.1} MiB", fetched + 1, mib(done), mib(total));
                let _ = std::io::stderr().flush();
            }
            _ => {}
        })
        .map_err(|e| format!("{r}: {e}"))?;
    }
    Ok(())
}

//! `pvisor volume create|ls|inspect|rm`: named volumes, managed on the data
//! directory like Docker's (`inspect --json` gives `Mountpoint`, the host
//! directory an operator seeds). `rm` refuses a volume a running sandbox
//! holds (see crate::volumes::store).
use crate::volumes::store::{Store, CREATED_BY};
use std::path::Path;

fn check_name(name: &str) -> Result<(), String> {
    let probe = serde_json::json!([{"name": "v", "mountPath": "/v", "pvc": {"claimName": name}}]);
    let list = probe.as_array().cloned().unwrap_or_default();
    crate::volumes::check(Some(&list), &[]).map(|_| ()).map_err(|e| e.to_string())
}

/// `pvisor volume create NAME`
pub fn create(data_dir: &Path, name: &str) -> Result<(), String> {
    check_name(name)?;
    let store = Store::new(data_dir);
    if !store.create(name, "cli").map_err(|e| e.to_string())? {
        eprintln!("volume {name} already exists");
    }
    println!("{name}");
    Ok(())
}

/// `pvisor volume ls [--json]`
pub fn ls(data_dir: &Path, json: bool) -> Result<(), String> {
    let list = Store::new(data_dir).list().map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{:<8} {:<40} {:<22} CREATED BY", "DRIVER", "VOLUME NAME", "CREATED");
    for v in list {
        let by = v.labels.get(CREATED_BY).map(String::as_str).unwrap_or("");
        println!("{:<8} {:<40} {:<22} {by}", v.driver, v.name, v.created_at);
    }
    Ok(())
}

/// `pvisor volume inspect [--json] NAME...` (the JSON is an array, as Docker's).
pub fn inspect(data_dir: &Path, names: &[String], json: bool) -> Result<(), String> {
    let store = Store::new(data_dir);
    let mut found = Vec::new();
    for n in names {
        found.push(store.inspect(n).map_err(|e| e.to_string())?.ok_or_else(|| format!("no such volume: {n}"))?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&found).map_err(|e| e.to_string())?);
        return Ok(());
    }
    for v in found {
        println!(
            "Name:       {}\nDriver:     {}\nMountpoint: {}\nCreatedAt:  {}",
            v.name, v.driver, v.mountpoint, v.created_at
        );
        for (k, val) in &v.labels {
            println!("Label:      {k}={val}");
        }
    }
    Ok(())
}

/// `pvisor volume rm NAME...`: all named volumes are tried; fails if any failed.
pub fn rm(data_dir: &Path, names: &[String]) -> Result<(), String> {
    let store = Store::new(data_dir);
    let mut failed = Vec::new();
    for n in names {
        match store.remove(n) {
            Ok(()) => println!("{n}"),
            Err(e) => failed.push(e.to_string()),
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(failed.join("; ")),
    }
}

//! `pvisor doctor`: what this host supports and which backend `auto` picks.
use crate::sandbox::backend;
use crate::sandbox::vm;
use pvisor_worker::cgroup::Layout;
use pvisor_worker::vm::host;
use serde::Serialize;
use std::path::Path;

#[derive(Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

fn check(name: &'static str, r: Result<String, String>) -> Check {
    match r {
        Ok(detail) => Check { name, ok: true, detail },
        Err(detail) => Check { name, ok: false, detail },
    }
}

fn user_namespaces() -> Result<String, String> {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").map_err(|e| e.to_string())?;
    if max.trim() == "0" {
        return Err("user.max_user_namespaces is 0".into());
    }
    match std::fs::read_to_string("/proc/sys/kernel/unprivileged_userns_clone") {
        Ok(v) if v.trim() == "0" => Err("kernel.unprivileged_userns_clone is 0 (root only)".into()),
        _ => Ok(format!("up to {} user namespaces", max.trim())),
    }
}

fn fuse() -> Result<String, String> {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(|e| format!("/dev/fuse: {e}"))?;
    let helper = vm::which("fusermount3").map(|p| p.display().to_string());
    Ok(format!("/dev/fuse usable; fusermount3: {}", helper.unwrap_or_else(|| "not installed".into())))
}

fn cgroups() -> Result<String, String> {
    match Layout::detect().map_err(|e| e.to_string())? {
        Layout::V2 { base } => Ok(format!("cgroup v2 at {}", base.display())),
        Layout::V1 { bases } => Ok(format!("cgroup v1 ({})", bases.keys().cloned().collect::<Vec<_>>().join(", "))),
    }
}

/// Prints the report; the exit code is 0 (the report is the answer).
pub fn run(kernel: Option<&Path>, json: bool) -> i32 {
    let h = host::probe();
    let engine = vm::engine(&h);
    let kernel_ok = match kernel {
        Some(k) if k.is_file() => Ok(format!("{}", k.display())),
        Some(k) => Err(format!("{} not found", k.display())),
        None => Err("not given (--guest-kernel or PVISOR_GUEST_KERNEL)".into()),
    };
    let vm_ready =
        engine.as_ref().map(drop).map_err(Clone::clone).and(kernel_ok.as_ref().map(drop).map_err(Clone::clone));
    let (pick, why) = backend::auto(&h, &vm_ready);
    let checks = vec![
        check("virtualization", Ok(h.virtualization.describe().to_string())),
        check("/dev/kvm", h.kvm_access.clone().map(|()| "opens read-write".into())),
        check("vm engine", engine.map(|e| format!("{e:?}"))),
        check("guest kernel", kernel_ok),
        check("cgroups", cgroups()),
        check("fuse", fuse()),
        check("user namespaces", user_namespaces()),
        check(
            "qemu (test engine)",
            vm::which("qemu-system-x86_64").map(|p| p.display().to_string()).ok_or_else(|| "not installed".into()),
        ),
    ];
    if json {
        let v = serde_json::json!({"checks": checks, "auto": {"backend": pick.name(), "why": why}});
        println!("{v}");
    } else {
        for c in &checks {
            println!("{} {:<20} {}", if c.ok { "ok  " } else { "no  " }, c.name, c.detail);
        }
        println!("--backend auto picks {}: {why}", pick.name());
    }
    0
}

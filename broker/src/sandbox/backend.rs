//! Which backend runs a sandbox: the server's default (`pvisor serve
//! --backend auto|vm|ns`) or the create request's `extensions` key
//! `pvisor.io/backend`.
use crate::api::error::ApiError;
use crate::server::Ctx;
use axum::http::StatusCode;
use pvisor_worker::config::BackendKind;
use pvisor_worker::vm::host::{HostSupport, Virtualization};
use std::collections::BTreeMap;

/// The `extensions` key naming a sandbox's backend.
pub const EXTENSION: &str = "pvisor.io/backend";

/// What `--backend` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// vm where hardware virtualization is present, else ns.
    Auto,
    Vm,
    Ns,
}

/// The backend `auto` picks on a host, and why.
pub fn auto(host: &HostSupport, vm_ready: &Result<(), String>) -> (BackendKind, String) {
    match (host.virtualization, &host.kvm_access, vm_ready) {
        (Virtualization::Hardware, Ok(()), Ok(())) => {
            (BackendKind::Vm, "hardware virtualization is present and /dev/kvm is usable".into())
        }
        (Virtualization::Hardware, Err(e), _) => (BackendKind::Ns, format!("hardware virtualization, but {e}")),
        (Virtualization::Hardware, Ok(()), Err(e)) => {
            (BackendKind::Ns, format!("hardware virtualization, but the vm backend is not ready: {e}"))
        }
        (v, _, _) => (BackendKind::Ns, format!("{}: a Linux guest cannot boot under KVM here", v.describe())),
    }
}

/// The backend of a create request: the one its `extensions` name, else
/// `default` (a restore's: its snapshot's backend), else the server's.
pub fn choose(
    ctx: &Ctx,
    extensions: Option<&BTreeMap<String, String>>,
    default: Option<BackendKind>,
) -> Result<BackendKind, ApiError> {
    let kind = match extensions.and_then(|e| e.get(EXTENSION)) {
        None => default.unwrap_or(ctx.default_backend),
        Some(v) => v.parse::<BackendKind>().map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "INVALID_BACKEND", format!("extensions.{EXTENSION}: {e}"))
        })?,
    };
    if kind == BackendKind::Vm {
        if let Err(why) = &ctx.vm {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "BACKEND_UNAVAILABLE",
                format!("the vm backend cannot run on this server: {why}"),
            ));
        }
    }
    Ok(kind)
}

/// Smallest guest RAM a vm sandbox boots with (the kernel, the agent and a shell).
pub const VM_MIN_MEMORY: u64 = 128 << 20;
/// Largest guest RAM and vCPU count a vm sandbox gets.
pub const VM_MAX_MEMORY: u64 = 64 << 30;
pub const VM_MAX_CPU_MILLIS: u64 = 64_000;

/// Limits the backend cannot honour are refused before any state exists.
pub fn check_limits(kind: BackendKind, limits: &pvisor_worker::config::Limits) -> Result<(), ApiError> {
    if kind != BackendKind::Vm {
        return Ok(());
    }
    if !(VM_MIN_MEMORY..=VM_MAX_MEMORY).contains(&limits.memory_bytes) {
        return Err(ApiError::bad_request(format!(
            "resourceLimits.memory: a vm sandbox needs between {} MiB and {} GiB of memory, got {} bytes",
            VM_MIN_MEMORY >> 20,
            VM_MAX_MEMORY >> 30,
            limits.memory_bytes
        )));
    }
    if limits.cpu_millis > VM_MAX_CPU_MILLIS {
        return Err(ApiError::bad_request(format!(
            "resourceLimits.cpu: a vm sandbox has at most {} vCPUs",
            VM_MAX_CPU_MILLIS / 1000
        )));
    }
    Ok(())
}

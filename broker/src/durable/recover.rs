//! Start-up, before anything is cleaned: what a previous broker of this data
//! dir left running, and what each of its sandbox records becomes. The
//! answer ([`Recovery`]) says what the start-up cleanup must keep ([`Keep`])
//! and what [`super::adopt`] does with each record once the server is up.
use super::proc::pidfd_signal;
use super::store::{current_boot_id, swap_boot_id, SandboxRecord, SandboxStore};
use crate::sandbox::images::{survivors, Survivor};
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

/// Reason of a sandbox whose worker died while no broker ran.
pub const WORKER_EXITED: &str = "WORKER_EXITED";
/// The message of [`WORKER_EXITED`].
pub const WORKER_EXITED_MESSAGE: &str = "the sandbox's worker exited while the broker was down";
/// Reason of a sandbox that ran when its host went down.
pub const HOST_RESTARTED: &str = "HOST_RESTARTED";
/// Reason of a sandbox whose root (its image server) is gone.
pub const IMAGE_SERVER_EXITED: &str = "IMAGE_SERVER_EXITED";

/// Names the start-up cleanup leaves in place: they belong to live
/// sandboxes and image servers being re-adopted.
#[derive(Default, Debug)]
pub struct Keep {
    /// File names in the run dir (sockets, logs, image-server records).
    pub run_files: HashSet<String>,
    /// Directory names under `<data>/sandboxes`.
    pub sandbox_dirs: HashSet<String>,
    /// Cgroup names (`pvisor-<instance>-...`).
    pub cgroups: HashSet<String>,
    /// Directory names under `<data>/mnt`.
    pub mounts: HashSet<String>,
}

/// What becomes of a record.
pub enum Fate {
    /// Its worker runs (held by this pidfd): re-adopt it.
    Adopt(OwnedFd),
    /// Nothing of it runs; the record stays as it now says (Failed, Terminated).
    Ended,
    /// Gone for good (a delete was decided, it expired, or the broker
    /// stops sandboxes with it): the record is removed.
    Drop,
}

pub struct Found {
    pub rec: SandboxRecord,
    pub fate: Fate,
}

pub struct Recovery {
    pub store: Arc<SandboxStore>,
    pub found: Vec<Found>,
    pub images: Vec<Survivor>,
    pub keep: Keep,
}

fn end(rec: &mut SandboxRecord, state: &str, reason: &str, message: &str) {
    rec.state = state.into();
    rec.reason = Some(reason.into());
    rec.message = Some(message.into());
    rec.since = chrono::Utc::now();
    rec.worker = None;
}

/// Reads the records and decides each one's fate; kills what will not be
/// adopted (a worker is only ever signalled through a pidfd of the very
/// process recorded). `durable` false: nothing is adopted, every record goes.
pub fn recover(data_dir: &Path, run_dir: &Path, durable: bool) -> Result<Recovery, String> {
    let state_dir = data_dir.join("state");
    let store = SandboxStore::open(&state_dir.join("sandboxes")).map_err(|e| e.to_string())?;
    let boot = current_boot_id();
    let before = swap_boot_id(&state_dir.join("boot_id"), &boot).map_err(|e| e.to_string())?;
    let host_restarted = before.is_some_and(|b| b != boot);
    if host_restarted {
        tracing::warn!("the host restarted since the last broker ran: its sandboxes are terminated");
    }
    let images = survivors(run_dir, durable && !host_restarted);
    let serving: HashSet<&str> = images.iter().map(|s| s.image_id()).collect();
    let mut keep = Keep::default();
    for s in &images {
        s.keep(&mut keep);
    }
    let now = chrono::Utc::now();
    let mut found = Vec::new();
    for mut rec in store.load().map_err(|e| e.to_string())? {
        let live = rec.worker.as_ref().and_then(|w| w.proc.open());
        let kill = |fd: Option<OwnedFd>| {
            if let Some(fd) = fd {
                pidfd_signal(&fd, libc::SIGKILL);
            }
        };
        let expired = rec.expires_at.is_some_and(|t| t <= now);
        let needs_image = rec.origin.backend != Some(pvisor_worker::config::BackendKind::Vm);
        let fate = if rec.deleting || expired || !durable {
            kill(live);
            Fate::Drop
        } else if rec.worker.is_none() {
            Fate::Ended
        } else if host_restarted {
            kill(live);
            end(&mut rec, "Terminated", HOST_RESTARTED, "the host restarted; nothing of the sandbox runs any more");
            Fate::Ended
        } else if let Some(fd) = live {
            if needs_image && !serving.contains(rec.image_id.as_str()) {
                kill(Some(fd));
                end(
                    &mut rec,
                    "Failed",
                    IMAGE_SERVER_EXITED,
                    "the image server of the sandbox's image exited while the broker was down",
                );
                Fate::Ended
            } else {
                if let Some(w) = &rec.worker {
                    for f in [&w.socket, &w.log] {
                        keep.run_files.extend(f.file_name().map(|n| n.to_string_lossy().into_owned()));
                    }
                    keep.sandbox_dirs.extend(w.state_dir.file_name().map(|n| n.to_string_lossy().into_owned()));
                    keep.cgroups.extend(w.cgroup.as_ref().and_then(super::cgroup_name));
                }
                Fate::Adopt(fd)
            }
        } else {
            end(&mut rec, "Failed", WORKER_EXITED, WORKER_EXITED_MESSAGE);
            Fate::Ended
        };
        found.push(Found { rec, fate });
    }
    Ok(Recovery { store: Arc::new(store), found, images, keep })
}

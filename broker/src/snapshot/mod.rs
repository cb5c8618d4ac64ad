//! Snapshots of sandboxes (OpenSandbox's "Snapshots" API).
//!
//! An ns snapshot is a new image in the pool: the sandbox's image plus one
//! layer holding its writable state (overlay upper and `/tmp`, captured
//! while the sandbox is frozen, [`capture`]), with the sandbox's environment
//! in its config. A restore is an ordinary create of that image, so restores
//! are independent copies and a snapshot outlives its source. The records
//! live in `<data>/snapshots/` ([`store`]); [`take`] runs a capture.
//!
//! A vm snapshot is the whole machine ([`take`]): the worker stops the
//! vCPUs, writes the machine's state with guest memory and copies the
//! scratch disk while they are stopped, then they run on. Its files are
//! `<data>/snapshots/<id>.vm/{state,memory,scratch.img}` (`memory`: guest RAM
//! apart from the state, the project's VMM's; QEMU's state holds it); a
//! restore is a create whose engine loads that state instead of booting
//! ([`VmSnapshot`]), so the guest's processes run on from the moment of the
//! snapshot. Both engines take them (`pvisor_worker::vm::kvm`, `::qemu`); a
//! snapshot restores only under the engine, kernel and initramfs it was taken with.
pub mod capture;
pub mod store;
pub mod take;

use pvisor_worker::config::BackendKind;
pub use store::VmSnapshot;
use store::{SnapshotRecord, SnapshotStore};

/// What a snapshot needs to know of a sandbox, fixed at its create (kept
/// in the sandbox's record on disk, see [`crate::durable`]).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Origin {
    /// The sandbox's backend (None only for records made before this existed).
    pub backend: Option<BackendKind>,
    /// Environment of the sandbox's processes (`K=V`), its own id left out.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    /// The snapshot it was restored from.
    pub snapshot_id: Option<String>,
    /// ns: `/tmp` is in the root file system (restored), not a tmpfs.
    pub tmp_on_root: bool,
    /// The whole environment the agent was configured with (`env` plus the
    /// sandbox's id): a vm snapshot's agent keeps it.
    pub agent_env: Vec<String>,
    /// The sandbox's lifecycle hooks: its agent runs them (a vm snapshot's
    /// agent goes on running them in its restores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::sandbox::hooks::Lifecycle>,
    /// vm: the machine's shape, fixed at create.
    pub vm: Option<VmShape>,
}

/// A vm sandbox's machine: a restore of its snapshot must have the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmShape {
    pub vcpus: u32,
    pub memory_mib: u64,
    /// A virtio-net device (the sandbox has a network).
    pub net: bool,
}

/// The pool name of a snapshot's image.
pub fn image_name(snapshot_id: &str) -> String {
    format!("pvisor-snapshots:{snapshot_id}")
}

/// Opens the records under `<data>/snapshots` and drops from the pool what
/// captures interrupted by a previous broker left there.
pub fn open_store(data_dir: &std::path::Path, pool: &pvisor_images::Pool) -> Result<SnapshotStore, String> {
    let (store, interrupted) = SnapshotStore::open(&data_dir.join("snapshots")).map_err(|e| e.to_string())?;
    for rec in interrupted {
        forget_image(pool, &rec);
    }
    Ok(store)
}

/// Removes a snapshot's image from the pool (chunks stay until gc; running
/// restores keep reading theirs: image servers hold their packs open).
pub fn forget_image(pool: &pvisor_images::Pool, rec: &SnapshotRecord) {
    let r = match &rec.image_id {
        Some(id) => pool.remove(id),
        None => pool.remove(&image_name(&rec.id)),
    };
    match r {
        Ok(()) | Err(pvisor_images::Error::NotFound(_)) => {}
        Err(e) => tracing::warn!(snapshot = %rec.id, "removing the snapshot's image: {e}"),
    }
}

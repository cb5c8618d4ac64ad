//! From checked volumes to what the worker mounts: host paths made to
//! exist beneath their prefix (`mkdir -p`, as the reference does), named
//! volumes created when asked and marked in use; the [`Held`] result keeps
//! them in use until the sandbox ends and then deletes the volumes this
//! create made with `deleteOnSandboxTermination`.
//!
//! The checks here are the early, friendly ones (a 400 naming the path);
//! the worker resolves every source again beneath the same root when it
//! mounts it, so nothing changed in between can redirect a mount.
use super::error::VolumeError;
use super::spec::{Checked, Source};
use super::store::{InUse, Store};
use pvisor_worker::config::Volume;
use pvisor_worker::ns::volumes::{create_under, open_dir, Leaf};
use std::os::fd::AsFd;
use std::path::Path;

/// What a sandbox holds of its volumes while it lives.
#[derive(Debug)]
pub struct Held {
    store: Store,
    in_use: Vec<InUse>,
    /// The names of `in_use`, in the same order (kept in the sandbox's record).
    names: Vec<String>,
    /// Volumes this create made that go with the sandbox.
    delete: Vec<String>,
}

impl Held {
    /// Names of the volumes held, and of those that go with the sandbox.
    pub fn names(&self) -> (Vec<String>, Vec<String>) {
        (self.names.clone(), self.delete.clone())
    }

    /// Takes the holds of a sandbox a previous broker started again (after
    /// a restart); a volume that cannot be held any more is logged.
    pub fn reacquire(store: &Store, in_use: &[String], delete: &[String]) -> Held {
        let mut held = Held { store: store.clone(), in_use: Vec::new(), names: Vec::new(), delete: delete.to_vec() };
        for name in in_use {
            match store.hold(name) {
                Ok(h) => {
                    held.in_use.push(h);
                    held.names.push(name.clone());
                }
                Err(e) => tracing::warn!(volume = %name, "re-holding a sandbox's volume: {e}"),
            }
        }
        held
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.in_use.clear();
        for name in std::mem::take(&mut self.delete) {
            match self.store.remove(&name) {
                Ok(()) => tracing::info!(volume = %name, "volume deleted with its sandbox"),
                Err(VolumeError::InUse(_)) => {
                    tracing::info!(volume = %name, "volume kept: another sandbox still uses it")
                }
                Err(VolumeError::NotFound(_)) => {}
                Err(e) => tracing::warn!(volume = %name, "deleting volume: {e}"),
            }
        }
    }
}

/// The mounts for the worker and what the sandbox holds.
pub struct Prepared {
    pub mounts: Vec<Volume>,
    pub held: Held,
}

const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// `mkdir -p` of `rel` beneath `root` (an existing file is kept as is).
fn ensure_beneath(root: &Path, rel: &Path, shown: &str, escape: VolumeError) -> Result<(), VolumeError> {
    let failed =
        |e: std::io::Error| VolumeError::HostPathCreateFailed { path: shown.to_string(), reason: e.to_string() };
    let fd = open_dir(root).map_err(failed)?;
    match create_under(fd.as_fd(), rel, BENEATH, Leaf::Dir) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP)) => Err(escape),
        Err(e) => Err(failed(e)),
    }
}

/// Prepares a create's volumes (blocking: run it off the async runtime).
pub fn prepare(checked: &[Checked], store: &Store) -> Result<Prepared, VolumeError> {
    let mut held = Held { store: store.clone(), in_use: Vec::new(), names: Vec::new(), delete: Vec::new() };
    let mut mounts = Vec::with_capacity(checked.len());
    for c in checked {
        let (root, rel) = match &c.source {
            Source::Host { prefix, rel } => {
                let shown = prefix.join(rel).to_string_lossy().into_owned();
                let escape =
                    VolumeError::HostPathNotAllowed(format!("{shown} (resolves outside {})", prefix.display()));
                ensure_beneath(prefix, rel, &shown, escape)?;
                (prefix.clone(), rel.clone())
            }
            Source::Named { claim, create_if_missing, delete_on_termination, sub } => {
                if store.inspect(claim)?.is_none() {
                    if !create_if_missing {
                        return Err(VolumeError::PvcNotFound(claim.clone()));
                    }
                    if store.create(claim, "api")? && *delete_on_termination {
                        held.delete.push(claim.clone());
                    }
                }
                held.in_use.push(store.hold(claim)?);
                held.names.push(claim.clone());
                let data = store.data_dir(claim);
                if !sub.as_os_str().is_empty() {
                    let shown = format!("{claim}:{}", sub.display());
                    ensure_beneath(
                        &data,
                        sub,
                        &shown,
                        VolumeError::InvalidSubPath(sub.to_string_lossy().into_owned()),
                    )?;
                }
                (data, sub.clone())
            }
        };
        mounts.push(Volume {
            name: c.name.clone(),
            source_root: root.to_string_lossy().into_owned(),
            source_path: rel.to_string_lossy().into_owned(),
            mount_path: c.mount_path.clone(),
            read_only: c.read_only,
        });
    }
    Ok(Prepared { mounts, held })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::spec::{check, AllowedPrefix};
    use serde_json::json;

    #[test]
    fn host_paths_created_beneath_and_escapes_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let allowed = d.path().join("allowed");
        std::fs::create_dir(&allowed).expect("mkdir");
        std::os::unix::fs::symlink("/", allowed.join("out")).expect("symlink");
        std::os::unix::fs::symlink("../..", allowed.join("up")).expect("symlink");
        let p = vec![AllowedPrefix::new(&allowed).expect("prefix")];
        let store = Store::new(d.path());
        let vol = |path: String| json!({"name":"a","mountPath":"/m","host":{"path": path}});
        let run = |path: String| {
            let c = check(Some(&[vol(path)]), &p).map_err(|e| e.code())?;
            prepare(&c, &store).map(|p| p.mounts).map_err(|e| e.code())
        };
        let m = run(format!("{}/new/dir", allowed.display())).expect("created");
        assert!(allowed.join("new/dir").is_dir());
        assert_eq!(m[0].source_path, "new/dir");
        assert_eq!(run(format!("{}/out/etc", allowed.display())).map(|_| ()), Err("VOLUME::HOST_PATH_NOT_ALLOWED"));
        assert_eq!(run(format!("{}/up", allowed.display())).map(|_| ()), Err("VOLUME::HOST_PATH_NOT_ALLOWED"));
    }

    #[test]
    fn named_volumes_created_held_and_deleted() {
        let d = tempfile::tempdir().expect("tempdir");
        let store = Store::new(d.path());
        let pvc = |create: bool, delete: bool| {
            json!({"name":"a","mountPath":"/m","subPath":"x/y",
                   "pvc":{"claimName":"v","createIfNotExists":create,"deleteOnSandboxTermination":delete}})
        };
        let c = check(Some(&[pvc(false, false)]), &[]).expect("valid");
        assert_eq!(prepare(&c, &store).map(|_| ()).map_err(|e| e.code()), Err("VOLUME::PVC_NOT_FOUND"));
        let c = check(Some(&[pvc(true, true)]), &[]).expect("valid");
        let p = prepare(&c, &store).expect("prepared");
        assert!(store.data_dir("v").join("x/y").is_dir());
        assert_eq!(store.remove("v").map_err(|e| e.code()), Err("VOLUME::IN_USE"));
        // A second sandbox on the same volume did not create it: it never deletes it.
        let second = prepare(&c, &store).expect("prepared");
        drop(p);
        assert!(store.inspect("v").expect("inspect").is_some(), "still in use by the second");
        drop(second);
        assert!(store.inspect("v").expect("inspect").is_some(), "the second did not create it");
    }
}

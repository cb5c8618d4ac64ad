//! Pulling from a registry into the pool: the registry client writes a
//! verified OCI layout into a private temporary directory, which is then
//! imported like any archive and deleted.

use super::{ImportEvent, Pool};
use crate::error::Result;
use crate::registry::{self, PullEvent, PullOptions};
use crate::ImageRecord;

/// What a pull is doing: fetching blobs, then importing.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(untagged)]
pub enum PullProgress {
    Fetch(PullEvent),
    Import(ImportEvent),
}

impl Pool {
    /// Pulls `reference` (`[registry/]repo[:tag|@digest]`) and imports it.
    pub fn pull(
        &self,
        reference: &str,
        opts: &PullOptions,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<Vec<ImageRecord>> {
        let dir = self.store.tmp_dir("pull", None)?;
        let fetched = registry::fetch(reference, dir.path(), opts, &mut |e| progress(PullProgress::Fetch(e)))?;
        let records = self.import_with(&fetched.path, &mut |e| progress(PullProgress::Import(e)))?;
        tracing::info!(reference, digest = %fetched.manifest_digest, "pulled");
        Ok(records)
    }
}

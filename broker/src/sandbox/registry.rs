//! The live set of sandboxes. Removal from the registry is the single point
//! that decides a sandbox's end: whoever removes it (delete, expiry) tears it
//! down, and nobody can renew or reach a sandbox once removed.
use super::SandboxEntry;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Registry {
    map: Mutex<BTreeMap<String, Arc<SandboxEntry>>>,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<SandboxEntry>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, e: Arc<SandboxEntry>) {
        self.map().insert(e.id.clone(), e);
    }

    pub fn get(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        self.map().get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<SandboxEntry>> {
        let e = self.map().remove(id);
        if let Some(e) = &e {
            e.mark_deleting();
        }
        e
    }

    /// All sandboxes, oldest first.
    pub fn list(&self) -> Vec<Arc<SandboxEntry>> {
        let mut v: Vec<_> = self.map().values().cloned().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Removes and returns every sandbox whose expiry is at or before `now`.
    /// The check and the removal happen under one lock, so a concurrent renew
    /// either lands first (and the sandbox stays) or finds it gone (404).
    pub fn take_expired(&self, now: DateTime<Utc>) -> Vec<Arc<SandboxEntry>> {
        let mut map = self.map();
        let ids: Vec<String> =
            map.values().filter(|e| e.status().expires_at.is_some_and(|t| t <= now)).map(|e| e.id.clone()).collect();
        ids.iter().filter_map(|id| map.remove(id)).inspect(|e| e.mark_deleting()).collect()
    }

    /// Renews under the registry lock (see [`take_expired`](Self::take_expired)).
    pub fn with_live<T>(&self, id: &str, f: impl FnOnce(&SandboxEntry) -> T) -> Option<T> {
        let map = self.map();
        map.get(id).map(|e| f(e))
    }
}

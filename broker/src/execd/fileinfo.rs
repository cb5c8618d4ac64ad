//! execd's `FileInfo` JSON.
use chrono::{TimeZone, Utc};
use pvisor_proto::agent::FileInfo;
use serde_json::{json, Value};

use super::mode::mode_to_wire;

fn time(ms: i64) -> String {
    let t = Utc.timestamp_millis_opt(ms).single().unwrap_or_default();
    crate::sandbox::record::rfc3339(&t)
}

pub fn to_json(f: &FileInfo) -> Value {
    json!({
        "path": f.path,
        "size": f.size,
        "modified_at": time(f.modified_at_ms),
        "created_at": time(f.created_at_ms),
        "owner": f.owner,
        "group": f.group,
        "mode": mode_to_wire(f.mode),
        "type": f.r#type,
    })
}

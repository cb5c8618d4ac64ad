//! Lifecycle API wire types (camelCase; optional fields omitted, never null).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    pub uri: String,
    /// Registry credentials, used when the server pulls a missing image.
    #[serde(default)]
    pub auth: Option<ImageAuth>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ImageAuth {
    pub username: Option<String>,
    pub password: Option<String>,
}

/// `POST /v1/sandboxes`. A field not listed here is a 400 `UNKNOWN_FIELD` unless it is empty
/// (null, false, "", [], {}), as a newer SDK may send by default.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandboxRequest {
    pub image: Option<ImageSpec>,
    pub snapshot_id: Option<String>,
    /// A template (`POST /v1/templates`) to create the sandbox from: its
    /// image, entrypoint, env and limits. Only `metadata` (over the
    /// template's), `networkPolicy`, `extensions` and `timeout` (required)
    /// may come with it; `entrypoint`, `env`, `resourceLimits`,
    /// `resourceRequests`, `volumes`, `platform`, `credentialProxy`,
    /// `secureAccess: true`, `lifecycle`, `image` and `snapshotId` are a 400.
    pub template_id: Option<String>,
    /// Only this host's (`linux` and its architecture); anything else is a 400.
    #[serde(default)]
    pub platform: Option<crate::sandbox::requested::Platform>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Seconds; absent or null means no automatic expiry.
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub resource_limits: Option<BTreeMap<String, String>>,
    /// Checked like `resourceLimits`, at most the limits; shown back.
    #[serde(default)]
    pub resource_requests: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub volumes: Option<Vec<serde_json::Value>>,
    /// The OpenSandbox egress policy (`pvisor_net::policy::api` parses it).
    #[serde(default)]
    pub network_policy: Option<serde_json::Value>,
    #[serde(default)]
    pub credential_proxy: Option<CredentialProxy>,
    /// Lifecycle hooks: `preStart` (the create answers after it) and `periodic`.
    /// Any other hook, or a bad one, is a 400 `LIFECYCLE_*`; `GET` does not show them
    /// (nor does the reference's).
    #[serde(default)]
    #[schema(value_type = Option<crate::sandbox::hooks::Lifecycle>)]
    pub lifecycle: Option<serde_json::Value>,
    /// Every endpoint here needs its sandbox's token (the endpoint's
    /// `headers`), so `true` is what every sandbox gets: parsed (a value that
    /// is not a bool is a 400); `true` beside `templateId` is a 400, as the
    /// reference has it.
    #[serde(default)]
    pub secure_access: Option<bool>,
    /// Opaque to OpenSandbox, kept and shown back; pvisor reads `pvisor.io/backend`
    /// (`ns`, `vm`) and `poolRef` (only `default`, the warm workers), and refuses
    /// `access.renew.extend.seconds` and other `pvisor.io/` keys.
    #[serde(default)]
    pub extensions: Option<BTreeMap<String, String>>,
}

/// `credentialProxy`, the credential vault opt-in: not supported yet (`enabled: true` is a
/// 400); `enabled` must be a bool (a string is a 400, not "off").
#[derive(Debug, Deserialize, ToSchema)]
pub struct CredentialProxy {
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// The status of a sandbox or of a snapshot, as the API shows both.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub last_transition_at: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ImageRef {
    pub uri: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxView {
    pub id: String,
    /// Absent for a sandbox restored from a snapshot (it has `snapshotId`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// The platform the create asked for (absent: it named none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<crate::sandbox::requested::Platform>,
    pub status: StatusView,
    pub entrypoint: Vec<String>,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, String>,
    /// The create's `resourceRequests`, in the request's shape.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_requests: BTreeMap<String, String>,
    /// Set when a pool (`extensions.poolRef`) served the create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationView>,
}

/// A pool's allocation of a sandbox (OpenSandbox's `AllocationSummary`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationView {
    /// Always `pool`.
    pub mode: String,
    pub pool_ref: String,
    /// Always `allocated`.
    pub state: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandboxResponse {
    pub id: String,
    pub status: StatusView,
    pub created_at: String,
    pub entrypoint: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<crate::sandbox::requested::Platform>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pagination {
    pub page: u64,
    pub page_size: u64,
    pub total_items: u64,
    pub total_pages: u64,
    pub has_next_page: bool,
}

impl Pagination {
    /// Page `page` (from 1) of `page_size` of `items` (all that match a list's
    /// filters), each shown by `show`, and the pagination that describes it.
    pub fn page_of<T, V>(items: Vec<T>, page: u64, page_size: u64, show: impl Fn(T) -> V) -> (Vec<V>, Pagination) {
        let total_items = items.len() as u64;
        let total_pages = total_items.div_ceil(page_size);
        let start = usize::try_from((page - 1).saturating_mul(page_size)).unwrap_or(usize::MAX);
        let shown = items.into_iter().skip(start).take(page_size as usize).map(show).collect();
        (shown, Pagination { page, page_size, total_items, total_pages, has_next_page: page < total_pages })
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListSandboxesResponse {
    pub items: Vec<SandboxView>,
    pub pagination: Pagination,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewRequest {
    pub expires_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewResponse {
    pub expires_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    pub endpoint: String,
    pub headers: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::Pagination;

    #[test]
    fn a_page_of_a_list_and_what_follows_it() {
        let (items, p) = Pagination::page_of(vec![1, 2, 3, 4, 5], 2, 2, |x| x * 10);
        assert_eq!(items, vec![30, 40]);
        assert_eq!((p.total_items, p.total_pages, p.has_next_page), (5, 3, true));
        let (items, p) = Pagination::page_of(vec![1, 2, 3, 4, 5], 3, 2, |x| x);
        assert_eq!((items, p.has_next_page), (vec![5], false));
        let (items, p) = Pagination::page_of(Vec::<u8>::new(), 7, 50, |x| x);
        assert!(items.is_empty());
        assert_eq!((p.total_pages, p.has_next_page), (0, false));
    }
}

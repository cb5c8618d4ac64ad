//! What a create asked for that the API shows back as it was asked (the
//! platform, `resourceRequests`, the pool, the opaque `extensions`, the
//! template): kept
//! in the sandbox's record, so a restarted broker shows the same.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An OS and CPU architecture, in the API's spelling (`linux`, `amd64`/`arm64`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Platform {
    pub os: String,
    pub arch: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Requested {
    /// The platform the create asked for (None: it named none).
    pub platform: Option<Platform>,
    /// `resourceRequests` as given (validated against the limits).
    pub resource_requests: BTreeMap<String, String>,
    /// The warm pool that served the create (`extensions.poolRef`).
    pub pool_ref: Option<String>,
    /// The create's `extensions`, every key as given.
    pub extensions: BTreeMap<String, String>,
    /// The template it was created from (`templateId`).
    pub template_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_it_loads_empty_and_a_full_one_round_trips() {
        assert_eq!(serde_json::from_str::<Requested>("{}").unwrap(), Requested::default());
        let r = Requested {
            platform: Some(Platform { os: "linux".into(), arch: "amd64".into() }),
            resource_requests: BTreeMap::from([("cpu".into(), "250m".into())]),
            pool_ref: Some("default".into()),
            extensions: BTreeMap::from([("poolRef".into(), "default".into())]),
            template_id: Some("tpl-x".into()),
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["resourceRequests"]["cpu"], "250m");
        assert_eq!(serde_json::from_value::<Requested>(json).unwrap(), r);
    }
}

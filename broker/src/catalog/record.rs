//! One template of the catalog: an image and the settings every sandbox made
//! from it gets (entrypoint, environment, limits), with its own metadata,
//! as `/v1/templates` takes and shows it. What the reference server needs
//! for its golden-image build (`publish`, `format`) is kept and shown back;
//! pvisor builds nothing that would be published.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The entrypoint of a template that names none (as the reference).
pub const DEFAULT_ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];

/// A template's `resourceLimits` keys and the create keys they stand for:
/// `disk` (the reference's name) is a sandbox's `ephemeral-storage`.
pub const LIMIT_KEYS: [(&str, &str); 4] =
    [("cpu", "cpu"), ("memory", "memory"), ("disk", crate::api::limits::EPHEMERAL_STORAGE), ("pids", "pids")];

/// How the reference stores a built golden image; shown back only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Native,
    #[default]
    Overlaybd,
}

/// The build phase of a template. pvisor's "build" is finding the image in
/// the pool (pulling it where the server may), done before the create
/// answers: a template is `Succeeded` from its first answer on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum Phase {
    Pending,
    Building,
    Succeeded,
    Failed,
}

/// The readiness gate of a template's sandboxes (see [`super::warm`]): a
/// sandbox started ahead of demand is handed out once its probe answers, or
/// once `warmupSeconds` passed without one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Readiness {
    /// `tcp://127.0.0.1:PORT` (the port accepts a connection inside the sandbox) or
    /// `cmd://COMMAND` (the shell command exits 0 inside the sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// How long a probe may fail before the sandbox is handed out anyway
    /// (default 60), or, with no probe, how long it runs first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_seconds: Option<u64>,
}

/// A readiness probe, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A port of the sandbox's own loopback.
    Tcp {
        port: u16,
    },
    Cmd(String),
}

impl Readiness {
    /// The fallback warm-up window when the template names none.
    pub const DEFAULT_WARMUP_SECS: u64 = 60;
    /// The longest warm-up a template may ask for (one hour).
    pub const MAX_WARMUP_SECS: u64 = 3600;

    /// The probe, checked: `tcp://127.0.0.1:PORT` (or `localhost`) or `cmd://COMMAND`.
    pub fn probe(&self) -> Result<Option<Probe>, String> {
        let Some(p) = self.probe.as_deref() else { return Ok(None) };
        if let Some(cmd) = p.strip_prefix("cmd://") {
            return match cmd.trim() {
                "" => Err("readiness.probe: cmd:// needs a command".into()),
                c => Ok(Some(Probe::Cmd(c.to_string()))),
            };
        }
        if let Some(addr) = p.strip_prefix("tcp://") {
            let (host, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| format!("readiness.probe: {p:?} needs a port (tcp://HOST:PORT)"))?;
            let port: u16 = port
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("readiness.probe: {port:?} is not a port (1-65535)"))?;
            // The probe reaches the sandbox's own ports (as the endpoints do), nothing beyond.
            if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
                return Err(format!(
                    "readiness.probe: {p:?} must name a port of the sandbox itself (tcp://127.0.0.1:{port})"
                ));
            }
            return Ok(Some(Probe::Tcp { port }));
        }
        Err(format!("readiness.probe: {p:?} is neither tcp://HOST:PORT nor cmd://COMMAND"))
    }

    /// The warm-up window, checked.
    pub fn warmup(&self) -> Result<std::time::Duration, String> {
        match self.warmup_seconds {
            Some(s) if s > Self::MAX_WARMUP_SECS => {
                Err(format!("readiness.warmupSeconds: {s} is more than {}", Self::MAX_WARMUP_SECS))
            }
            s => Ok(std::time::Duration::from_secs(s.unwrap_or(Self::DEFAULT_WARMUP_SECS))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRecord {
    /// `tpl-<uuid4>`.
    pub id: String,
    /// The image, as the create named it (resolved at each sandbox's create).
    pub image: String,
    /// The reference's publish target: kept and shown back.
    #[serde(default)]
    pub publish: String,
    #[serde(default)]
    pub format: Format,
    /// As given (keys of [`LIMIT_KEYS`]; absent: the server's defaults).
    #[serde(default)]
    pub resource_limits: Option<BTreeMap<String, String>>,
    /// As given (absent: [`DEFAULT_ENTRYPOINT`]).
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Over the image's own environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// The template's; also the defaults of its sandboxes' metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub readiness: Option<Readiness>,
    pub phase: Phase,
    #[serde(default)]
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl TemplateRecord {
    /// What its sandboxes run.
    pub fn entrypoint(&self) -> Vec<String> {
        match &self.entrypoint {
            Some(ep) => ep.clone(),
            None => DEFAULT_ENTRYPOINT.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Its `resourceLimits` as a sandbox create's (`disk` as `ephemeral-storage`).
    pub fn create_limits(&self) -> Option<BTreeMap<String, String>> {
        self.resource_limits.as_ref().map(|m| m.iter().map(|(k, v)| (create_key(k).to_string(), v.clone())).collect())
    }

    /// A sandbox's metadata: the template's, under the create's own keys.
    pub fn sandbox_metadata(&self, requested: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
        let mut m = self.metadata.clone();
        m.extend(requested.into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        m
    }
}

/// The create key of a template's limit key (an unknown key maps to itself).
pub fn create_key(template_key: &str) -> &str {
    LIMIT_KEYS.iter().find(|(t, _)| *t == template_key).map(|(_, c)| *c).unwrap_or(template_key)
}

/// A template's key of a create's limit key (for messages).
pub fn template_key(create_key: &str) -> &str {
    LIMIT_KEYS.iter().find(|(_, c)| *c == create_key).map(|(t, _)| *t).unwrap_or(create_key)
}

/// Template ids: `tpl-` and a uuid. Nothing else names a record file.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("tpl-").is_some_and(|u| u.len() == 36 && u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

pub fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let variant = ["8", "9", "a", "b"][(b[8] >> 6) as usize];
    format!("tpl-{}-{}-4{}-{}{}-{}", &h[0..8], &h[8..12], &h[13..16], variant, &h[17..20], &h[20..32])
}

#[cfg(test)]
impl TemplateRecord {
    /// A template of busybox with nothing optional set, for tests.
    pub fn sample() -> TemplateRecord {
        let now = Utc::now();
        TemplateRecord {
            id: new_id(),
            image: "busybox:latest".into(),
            publish: String::new(),
            format: Format::default(),
            resource_limits: None,
            entrypoint: None,
            env: None,
            metadata: BTreeMap::new(),
            readiness: None,
            phase: Phase::Succeeded,
            message: None,
            created_at: now,
            updated_at: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_tpl_and_a_uuid4_and_nothing_else_passes() {
        let id = new_id();
        assert!(valid_id(&id), "{id}");
        assert_eq!(&id[18..19], "4");
        for bad in ["tpl-../../etc/passwd", "aaaaaaaa-aaaa-4aaa-aaaa-aaaaaaaaaaaa", "tpl-", &format!("{id}x")] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn entrypoint_and_limits_as_a_create_takes_them() {
        let mut r = TemplateRecord::sample();
        assert_eq!(r.entrypoint(), ["tail", "-f", "/dev/null"]);
        assert_eq!(r.create_limits(), None);
        r.entrypoint = Some(vec!["sleep".into(), "9".into()]);
        r.resource_limits = Some(BTreeMap::from([("disk".into(), "1Gi".into()), ("cpu".into(), "1".into())]));
        assert_eq!(r.entrypoint(), ["sleep", "9"]);
        let l = r.create_limits().unwrap();
        assert_eq!(l.get("ephemeral-storage").map(String::as_str), Some("1Gi"));
        assert_eq!(l.get("cpu").map(String::as_str), Some("1"));
        assert_eq!(template_key("ephemeral-storage"), "disk");
    }

    #[test]
    fn the_creates_metadata_goes_over_the_templates() {
        let mut r = TemplateRecord::sample();
        r.metadata = BTreeMap::from([("team".into(), "a".into()), ("tier".into(), "gold".into())]);
        let asked = BTreeMap::from([("team".into(), "b".into()), ("run".into(), "7".into())]);
        let m = r.sandbox_metadata(Some(&asked));
        assert_eq!(m.get("team").map(String::as_str), Some("b"));
        assert_eq!(m.get("tier").map(String::as_str), Some("gold"));
        assert_eq!(m.get("run").map(String::as_str), Some("7"));
        assert_eq!(r.sandbox_metadata(None), r.metadata);
    }

    #[test]
    fn probes_parse_or_say_why_not() {
        let r = |p: &str| Readiness { probe: Some(p.into()), warmup_seconds: None };
        assert_eq!(r("tcp://127.0.0.1:8080").probe().unwrap(), Some(Probe::Tcp { port: 8080 }));
        assert_eq!(r("cmd://test -f /tmp/up").probe().unwrap(), Some(Probe::Cmd("test -f /tmp/up".into())));
        for bad in [
            "http://x",
            "tcp://127.0.0.1",
            "tcp://:80",
            "tcp://localhost:0",
            "tcp://localhost:99999",
            "tcp://10.0.0.1:80",
            "cmd://  ",
        ] {
            assert!(r(bad).probe().is_err(), "{bad}");
        }
        assert_eq!(Readiness::default().probe().unwrap(), None);
        assert_eq!(Readiness::default().warmup().unwrap().as_secs(), 60);
        let long = Readiness { probe: None, warmup_seconds: Some(7200) };
        assert!(long.warmup().is_err());
    }

    #[test]
    fn a_record_round_trips_and_an_older_one_loads() {
        let mut r = TemplateRecord::sample();
        r.readiness = Some(Readiness { probe: Some("tcp://127.0.0.1:1".into()), warmup_seconds: Some(5) });
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["phase"], "Succeeded");
        assert_eq!(json["format"], "overlaybd");
        assert_eq!(serde_json::from_value::<TemplateRecord>(json).unwrap(), r);
    }
}

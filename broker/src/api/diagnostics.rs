//! `GET /v1/sandboxes/{id}/diagnostics/logs|events?scope=S`: best-effort,
//! plain-text diagnostics, always delivered inline.
//!
//! What each scope holds (`all` is every section, each under a header):
//!
//! | scope | logs | events |
//! |---|---|---|
//! | `container`, `process` | the entrypoint's output (kept by the agent) | the entrypoint's state (running, exit code) |
//! | `runtime` | the tail of the worker's log | lifecycle events |
//! | `lifecycle` | lifecycle events | lifecycle events |
//! | `network` | nothing kept (a warning says so) | nothing kept (a warning says so) |
//!
//! Lifecycle events are the broker's ([`crate::sandbox::events`]). A source
//! that cannot be read now (a paused or ended sandbox) yields a warning, not
//! an error. Content is cut to [`MAX_CONTENT`] bytes, keeping the newest,
//! and `truncated` says so.
use super::error::{ApiError, ApiResult};
use super::query::Query;
use crate::execd::agent;
use crate::sandbox::{SandboxEntry, State as SbState};
use crate::server::Ctx;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use pvisor_proto::agent::{CommandRef, LogsRequest};
use serde::Serialize;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

/// Largest content of one answer; older output is cut first.
pub const MAX_CONTENT: usize = 256 << 10;
/// The agent's background-command id of the entrypoint.
const ENTRYPOINT_ID: &str = "entrypoint";
/// How long the agent may take to answer (a wedged sandbox must not hang the call).
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Logs,
    Events,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Logs => "logs",
            Kind::Events => "events",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Container,
    Lifecycle,
    Runtime,
    Network,
    Process,
    All,
}

impl Scope {
    const NAMES: [(&'static str, Scope); 6] = [
        ("container", Scope::Container),
        ("lifecycle", Scope::Lifecycle),
        ("runtime", Scope::Runtime),
        ("network", Scope::Network),
        ("process", Scope::Process),
        ("all", Scope::All),
    ];

    fn parse(raw: Option<&str>) -> ApiResult<Scope> {
        let names = || Self::NAMES.map(|(n, _)| n).join(", ");
        let s = Query::parse(raw).one("scope").map(|s| s.trim().to_ascii_lowercase());
        let s = s.filter(|s| !s.is_empty()).ok_or_else(|| {
            ApiError::bad_request(format!("query parameter \"scope\" is required (one of {})", names()))
        })?;
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| ApiError::bad_request(format!("unknown scope {s:?} (one of {})", names())))
    }

    fn as_str(self) -> &'static str {
        Self::NAMES.iter().find(|(_, v)| *v == self).map(|(n, _)| *n).unwrap_or("all")
    }
}

/// The answer (the SDK's `DiagnosticContent`; `url` delivery is never used).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiagnosticContent {
    sandbox_id: String,
    kind: &'static str,
    scope: &'static str,
    delivery: &'static str,
    content_type: &'static str,
    truncated: bool,
    content: String,
    content_length: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// Content being assembled from its sources.
#[derive(Default)]
struct Collected {
    text: String,
    truncated: bool,
    warnings: Vec<String>,
}

impl Collected {
    fn section(&mut self, title: Option<&str>, body: &str) {
        if let Some(t) = title {
            self.text.push_str(&format!("==> {t} <==\n"));
        }
        self.text.push_str(body);
        if !body.is_empty() && !body.ends_with('\n') {
            self.text.push('\n');
        }
    }

    /// Keeps the newest [`MAX_CONTENT`] bytes, cut at a line start where one is near.
    fn finish(mut self) -> Collected {
        if self.text.len() > MAX_CONTENT {
            let mut cut = self.text.len() - MAX_CONTENT;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            if let Some(nl) = self.text[cut..].find('\n') {
                cut += nl + 1;
            }
            self.text.drain(..cut);
            self.truncated = true;
        }
        self
    }
}

/// The lifecycle events, one line each.
fn lifecycle(sb: &SandboxEntry, out: &mut Collected, title: Option<&str>) {
    let snap = sb.events.snapshot();
    let mut body = String::new();
    if snap.dropped > 0 {
        body.push_str(&format!("({} older events dropped)\n", snap.dropped));
        out.truncated = true;
    }
    for e in &snap.events {
        body.push_str(&e.line());
        body.push('\n');
    }
    out.section(title, &body);
}

/// The last [`MAX_CONTENT`] bytes of the worker's log.
fn worker_log(sb: &SandboxEntry, out: &mut Collected, title: Option<&str>) {
    let Some(path) = sb.worker_log() else {
        out.warnings.push("runtime: the worker has ended; its log is gone".into());
        return out.section(title, "");
    };
    let read = || -> std::io::Result<(String, bool)> {
        let mut f = std::fs::File::open(&path)?;
        let len = f.metadata()?.len();
        let start = len.saturating_sub(MAX_CONTENT as u64);
        f.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::with_capacity((len - start) as usize);
        f.take(MAX_CONTENT as u64).read_to_end(&mut buf)?;
        Ok((String::from_utf8_lossy(&buf).into_owned(), start > 0))
    };
    match read() {
        Ok((text, cut)) => {
            out.truncated |= cut;
            out.section(title, &text);
        }
        Err(e) => {
            out.warnings.push(format!("runtime: worker log unreadable: {e}"));
            out.section(title, "");
        }
    }
}

/// Why the agent cannot be asked now, if it cannot.
fn agent_unreachable(sb: &SandboxEntry) -> Option<String> {
    let s = sb.status();
    match s.state {
        SbState::Paused => Some("the sandbox is paused; resume it to read the entrypoint".into()),
        SbState::Failed => Some(format!("the sandbox failed ({})", s.reason.as_deref().unwrap_or("no reason"))),
        SbState::Terminated => {
            Some(format!("the sandbox was terminated ({})", s.reason.as_deref().unwrap_or("no reason")))
        }
        SbState::Running => None,
    }
}

/// The entrypoint's output (`logs`) or state (`events`), from the agent.
async fn entrypoint(sb: &SandboxEntry, kind: Kind, out: &mut Collected, title: Option<&str>) {
    if sb.entrypoint.is_empty() {
        out.warnings.push("container: the sandbox has no entrypoint".into());
        return out.section(title, "");
    }
    if let Some(why) = agent_unreachable(sb) {
        out.warnings.push(format!("container: {why}"));
        return out.section(title, "");
    }
    let ask = async {
        let mut a = agent(sb)?;
        let text = match kind {
            Kind::Logs => a.command_logs(LogsRequest { id: ENTRYPOINT_ID.into(), cursor: 0 }).await?.into_inner().text,
            Kind::Events => {
                let s = a.command_status(CommandRef { id: ENTRYPOINT_ID.into() }).await?.into_inner();
                let at = |ms: i64| {
                    chrono::DateTime::from_timestamp_millis(ms)
                        .map(|t| crate::sandbox::record::rfc3339(&t))
                        .unwrap_or_default()
                };
                let mut t = format!("{} EntrypointStarted: {:?}\n", at(s.started_at_ms), sb.entrypoint);
                match (s.running, s.finished_at_ms) {
                    (true, _) => {}
                    (false, f) => {
                        let code =
                            s.exit_code.map(|c| format!("exit code {c}")).unwrap_or_else(|| "no exit code".into());
                        let err = if s.error.is_empty() { String::new() } else { format!(" ({})", s.error) };
                        t.push_str(&format!("{} EntrypointExited: {code}{err}\n", at(f.unwrap_or_default())));
                    }
                }
                t
            }
        };
        Ok::<_, ApiError>(text)
    };
    match tokio::time::timeout(AGENT_TIMEOUT, ask).await {
        Ok(Ok(text)) => out.section(title, &text),
        Ok(Err(e)) => {
            out.warnings.push(format!("container: the agent did not answer: {}", e.message));
            out.section(title, "");
        }
        Err(_) => {
            out.warnings.push(format!("container: the agent did not answer within {} s", AGENT_TIMEOUT.as_secs()));
            out.section(title, "");
        }
    }
}

fn network(out: &mut Collected, title: Option<&str>) {
    out.warnings.push("network: this server keeps no network diagnostics".into());
    out.section(title, "");
}

async fn collect(sb: &SandboxEntry, kind: Kind, scope: Scope) -> Collected {
    let mut out = Collected::default();
    match (kind, scope) {
        (_, Scope::Container | Scope::Process) => entrypoint(sb, kind, &mut out, None).await,
        (Kind::Logs, Scope::Runtime) => worker_log(sb, &mut out, None),
        (Kind::Events, Scope::Runtime) | (_, Scope::Lifecycle) => lifecycle(sb, &mut out, None),
        (_, Scope::Network) => network(&mut out, None),
        (_, Scope::All) => {
            lifecycle(sb, &mut out, Some("lifecycle"));
            entrypoint(sb, kind, &mut out, Some("container")).await;
            if kind == Kind::Logs {
                worker_log(sb, &mut out, Some("runtime"));
            }
            network(&mut out, Some("network"));
        }
    }
    out.finish()
}

async fn answer(ctx: &Ctx, id: &str, kind: Kind, raw: Option<&str>) -> ApiResult<Json<DiagnosticContent>> {
    let sb = ctx.registry.get(id).ok_or_else(|| ApiError::sandbox_not_found(id))?;
    let scope = Scope::parse(raw)?;
    let c = collect(&sb, kind, scope).await;
    Ok(Json(DiagnosticContent {
        sandbox_id: sb.id.clone(),
        kind: kind.as_str(),
        scope: scope.as_str(),
        delivery: "inline",
        content_type: "text/plain; charset=utf-8",
        truncated: c.truncated,
        content_length: c.text.len(),
        content: c.text,
        warnings: c.warnings,
    }))
}

#[utoipa::path(get, path = "/sandboxes/{id}/diagnostics/logs", tag = "diagnostics",
    params(("id" = String, Path, description = "sandbox id"), ("scope" = String, Query, description = "lifecycle, runtime or all")),
    responses((status = 200, body = DiagnosticContent)))]
pub async fn logs(
    State(ctx): State<Arc<Ctx>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<DiagnosticContent>> {
    answer(&ctx, &id, Kind::Logs, raw.as_deref()).await
}

#[utoipa::path(get, path = "/sandboxes/{id}/diagnostics/events", tag = "diagnostics",
    params(("id" = String, Path, description = "sandbox id"), ("scope" = String, Query, description = "lifecycle, runtime or all")),
    responses((status = 200, body = DiagnosticContent)))]
pub async fn events(
    State(ctx): State<Arc<Ctx>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<DiagnosticContent>> {
    answer(&ctx, &id, Kind::Events, raw.as_deref()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_is_required_and_checked() {
        assert_eq!(Scope::parse(Some("scope=all")).unwrap(), Scope::All);
        assert_eq!(Scope::parse(Some("scope=Lifecycle")).unwrap(), Scope::Lifecycle);
        for (n, v) in Scope::NAMES {
            assert_eq!(Scope::parse(Some(&format!("scope={n}"))).unwrap(), v);
            assert_eq!(v.as_str(), n);
        }
        for bad in [None, Some(""), Some("scope="), Some("scope=disk")] {
            let e = Scope::parse(bad).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    #[test]
    fn content_keeps_the_newest_lines() {
        let mut c = Collected::default();
        let line = "x".repeat(99);
        for _ in 0..(2 * MAX_CONTENT / 100) {
            c.section(None, &line);
        }
        c.section(None, "last");
        let c = c.finish();
        assert!(c.truncated);
        assert!(c.text.len() <= MAX_CONTENT);
        assert!(c.text.starts_with(&line) && c.text.ends_with("last\n"));
    }
}

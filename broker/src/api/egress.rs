//! The egress policy API, served by the broker itself.
//!
//! Two doors, one handler ([`serve`]):
//! * port 18080 of a sandbox's endpoint (`/sandboxes/{id}/proxy/18080/...`,
//!   where OpenSandbox runs its egress sidecar): `/policy`, `/healthz` and
//!   `/credential-vault*`, guarded by the sandbox's data-plane token (also
//!   accepted as `OPENSANDBOX-EGRESS-AUTH`, as the sidecar names it); never
//!   forwarded into the sandbox;
//! * the lifecycle routes `/v1/sandboxes/{id}/networkpolicy` (API key).
//!
//! Bodies and answers are OpenSandbox's policy server's: `GET` gives
//! `{status, mode, enforcementMode, policy}`; `POST`/`PUT` replace (an empty
//! body resets to deny-all); `PATCH` merges rules; `DELETE` removes targets
//! (200 with `reason` when none matched). Errors are `{code, message}`: 400
//! naming the rule, 413 past 4,096 rules. A sandbox without a network
//! (`--default-egress none` and no `networkPolicy`) reads as deny-all with a
//! `reason`, and every change to it is a 409 `NETWORK_DISABLED`: it has no
//! network process to enforce a policy, and gets none after its start.
use super::error::{ApiError, ApiResult};
use crate::sandbox::{egress, SandboxEntry};
use crate::server::Ctx;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pvisor_net::policy::{api, edit, Policy, PolicyError};
use serde_json::Value;
use std::sync::Arc;

/// The sandbox port the SDK expects the egress API on.
pub const EGRESS_PORT: u16 = 18080;
/// The sidecar's own token header, accepted as an alternative on 18080.
pub const EGRESS_AUTH_HEADER: &str = "OPENSANDBOX-EGRESS-AUTH";
/// Largest policy body (OpenSandbox's limit; 4,096 rules fit easily).
const MAX_POLICY_BODY: usize = 1 << 20;
const NO_NETWORK: &str = "sandbox has no network (the server runs with --default-egress none and the create set no \
                          networkPolicy)";
const RESET: &str = "policy reset to default deny-all";
const ALLOW: &str = "GET, POST, PUT, PATCH, DELETE";

/// The error of a create's `networkPolicy`: always 400 (a create is not a
/// large upload; the issue asks for the rule named), 4,096 rules included.
pub fn create_error(e: PolicyError) -> ApiError {
    let code = if e.is_too_large() { "TOO_MANY_RULES" } else { "INVALID_NETWORK_POLICY" };
    ApiError::new(StatusCode::BAD_REQUEST, code, format!("networkPolicy: {e}"))
}

/// The error of a `/policy` request: 413 past 4,096 rules (as OpenSandbox's
/// policy server), else 400.
pub fn policy_error(e: PolicyError) -> ApiError {
    if e.is_too_large() {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "TOO_MANY_RULES", e.to_string())
    } else {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_NETWORK_POLICY", e.to_string())
    }
}

/// What one request does to a policy: the answer, and the policy to store
/// and push (`None`: unchanged).
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub reply: Value,
    pub new: Option<Policy>,
}

/// The request's effect on `current` (`None`: the sandbox has no network).
pub fn decide(method: &Method, body: &[u8], current: Option<&Policy>) -> ApiResult<Outcome> {
    if *method == Method::GET {
        let reply = match current {
            Some(p) => p.status_json(true, None),
            None => Policy::deny_all().status_json(true, Some(NO_NETWORK)),
        };
        return Ok(Outcome { reply, new: None });
    }
    if ![Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method) {
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", format!("allowed: {ALLOW}")));
    }
    let Some(current) = current else {
        return Err(ApiError::conflict("NETWORK_DISABLED", format!("{NO_NETWORK}; its egress policy cannot change")));
    };
    match *method {
        Method::PATCH => {
            let rules = api::patch_from_json(body).map_err(policy_error)?;
            let new = current.patched(rules).map_err(policy_error)?;
            Ok(Outcome { reply: new.status_json(false, None), new: Some(new) })
        }
        Method::DELETE => {
            let targets = api::delete_from_json(body).map_err(policy_error)?;
            let (new, removed) = current.without_targets(&targets);
            if removed == 0 {
                return Ok(Outcome { reply: current.status_json(false, Some(edit::NOTHING_DELETED)), new: None });
            }
            Ok(Outcome { reply: new.status_json(false, None), new: Some(new) })
        }
        _ => {
            let reset = body.iter().all(u8::is_ascii_whitespace);
            let new = Policy::from_json_bytes(body).map_err(policy_error)?;
            Ok(Outcome { reply: new.status_json(false, reset.then_some(RESET)), new: Some(new) })
        }
    }
}

/// Applies one request to a sandbox: decides under the policy lock, pushes
/// a change to the worker, then stores it.
pub async fn serve(sb: &SandboxEntry, method: &Method, body: &[u8]) -> Response {
    let mut policy = sb.egress.lock().await;
    let outcome = match decide(method, body, policy.as_ref()) {
        Ok(o) => o,
        Err(e) => return with_allow(e),
    };
    if let Some(new) = outcome.new {
        if let Err(e) = egress::push(sb, &new).await {
            return e.into_response();
        }
        tracing::info!(sandbox = %sb.id, mode = new.mode().as_str(), rules = new.egress.len(), "egress policy changed");
        *policy = Some(new);
        sb.save_egress(policy.as_ref());
    }
    Json(outcome.reply).into_response()
}

fn with_allow(e: ApiError) -> Response {
    let allow = e.status == StatusCode::METHOD_NOT_ALLOWED;
    let mut r = e.into_response();
    if allow {
        r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static(ALLOW));
    }
    r
}

/// `/v1/sandboxes/{id}/networkpolicy`.
#[utoipa::path(method(get, put, patch, delete), path = "/sandboxes/{id}/networkpolicy", tag = "egress",
    params(("id" = String, Path, description = "sandbox id")),
    request_body(content = Option<Object>, description = "the OpenSandbox egress policy (PUT) or an edit (PATCH)"),
    responses((status = 200, description = "the policy now in force", body = Object)))]
pub async fn lifecycle(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>, method: Method, body: Bytes) -> Response {
    match ctx.registry.get(&id) {
        Some(sb) => serve(&sb, &method, &body).await,
        None => ApiError::sandbox_not_found(&id).into_response(),
    }
}

/// Port 18080 of a sandbox (`rest`: the path after the port), the token
/// already checked.
pub async fn sidecar(sb: Arc<SandboxEntry>, rest: &str, req: Request) -> Response {
    match rest.trim_end_matches('/') {
        "policy" => {
            let method = req.method().clone();
            match axum::body::to_bytes(req.into_body(), MAX_POLICY_BODY).await {
                Ok(body) => serve(&sb, &method, &body).await,
                Err(_) => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "BODY_TOO_LARGE",
                    format!("a policy body is at most {MAX_POLICY_BODY} bytes"),
                )
                .into_response(),
            }
        }
        "healthz" => (StatusCode::OK, "ok").into_response(),
        p if p == "credential-vault" || p.starts_with("credential-vault/") => ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "NOT_SUPPORTED",
            "the credential vault is not supported by this server yet",
        )
        .into_response(),
        _ => ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such egress route").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(v: Value) -> Policy {
        Policy::from_json(&v).expect("valid policy")
    }

    #[test]
    fn get_reports_the_policy() {
        let p = policy(json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "x.com"}]}));
        let o = decide(&Method::GET, b"", Some(&p)).expect("ok");
        assert_eq!(
            o.reply,
            json!({"status": "ok", "mode": "enforcing", "enforcementMode": "dns+nft",
                   "policy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "x.com"}]}})
        );
        assert_eq!(o.new, None);
    }

    #[test]
    fn replace_and_reset() {
        let o = decide(&Method::POST, br#"{"defaultAction":"allow"}"#, Some(&Policy::deny_all())).expect("ok");
        assert_eq!(o.new, Some(Policy::allow_all()));
        assert_eq!(o.reply["mode"], "allow_all");
        let o = decide(&Method::PUT, b"", Some(&Policy::allow_all())).expect("ok");
        assert_eq!(o.new, Some(Policy::deny_all()));
        assert_eq!(o.reply["reason"], RESET);
        let e = decide(
            &Method::PUT,
            br#"{"egress":[{"action":"allow","target":"10.0.0.0/33"}]}"#,
            Some(&Policy::allow_all()),
        )
        .expect_err("bad");
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "INVALID_NETWORK_POLICY"));
        assert_eq!(e.message, "egress[0]: bad CIDR \"10.0.0.0/33\"");
    }

    #[test]
    fn patch_merges_and_rejects_empty() {
        let p = policy(json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "a.com"}]}));
        let o = decide(
            &Method::PATCH,
            br#"[{"action":"deny","target":"A.com"},{"action":"allow","target":"b.com"}]"#,
            Some(&p),
        )
        .expect("ok");
        assert_eq!(
            o.new.map(|p| p.to_json()),
            Some(
                json!({"defaultAction": "deny", "egress": [{"action": "deny", "target": "a.com"}, {"action": "allow", "target": "b.com"}]})
            )
        );
        assert_eq!(decide(&Method::PATCH, b"[]", Some(&p)).expect_err("empty").status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn too_many_rules_is_413() {
        let rules: Vec<Value> = (0..4097).map(|i| json!({"action": "allow", "target": format!("h{i}.test")})).collect();
        let body = serde_json::to_vec(&json!({"egress": rules})).expect("json");
        let e = decide(&Method::POST, &body, Some(&Policy::deny_all())).expect_err("too many");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        let body = serde_json::to_vec(&rules).expect("json");
        assert_eq!(
            decide(&Method::PATCH, &body, Some(&Policy::deny_all())).expect_err("too many").status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn delete_is_idempotent() {
        let p = policy(json!({"egress": [{"action": "allow", "target": "*.x.com"}]}));
        let o = decide(&Method::DELETE, br#"["*.X.com"]"#, Some(&p)).expect("ok");
        assert_eq!(o.new, Some(Policy::deny_all()));
        assert_eq!(o.reply.get("reason"), None);
        let o = decide(&Method::DELETE, br#"["y.com"]"#, Some(&p)).expect("ok");
        assert_eq!(o.new, None);
        assert_eq!(o.reply["reason"], "no matching targets found");
        assert_eq!(decide(&Method::DELETE, b"[]", Some(&p)).expect_err("empty").status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn no_network() {
        let o = decide(&Method::GET, b"", None).expect("ok");
        assert_eq!(o.reply["mode"], "deny_all");
        assert_eq!(o.reply["reason"], NO_NETWORK);
        let e = decide(&Method::PATCH, br#"[{"action":"allow","target":"x.com"}]"#, None).expect_err("409");
        assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "NETWORK_DISABLED"));
    }

    #[test]
    fn other_methods() {
        let e = decide(&Method::OPTIONS, b"", Some(&Policy::deny_all())).expect_err("405");
        assert_eq!(e.status, StatusCode::METHOD_NOT_ALLOWED);
    }
}

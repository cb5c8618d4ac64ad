//! `/openapi.json`: the broker's OpenAPI document, generated from the route
//! definitions themselves. Each documented handler carries its
//! `#[utoipa::path]` and is registered through `utoipa_axum::routes!`, which
//! adds the route to the router and the operation to the document in one
//! step, so the two cannot drift; request and response schemas come from the
//! serde types (`#[derive(ToSchema)]`). Routes deliberately left out are
//! listed in [`UNDOCUMENTED`], and a test checks that the router serves
//! exactly the documented paths plus those.
//!
//! Every operation also gets a `default` response (the `{code, message}`
//! error body): limits, authentication and validation can answer any route
//! with an error status.
use axum::Json;
use serde::Serialize;
use std::sync::OnceLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{OpenApi, RefOr, Response, ResponseBuilder};
use utoipa::{PartialSchema, ToSchema};

/// Served paths that are not in the document, and why.
pub const UNDOCUMENTED: &[(&str, &str)] = &[
    ("/sandboxes/{id}/proxy/{port}", "the execd data plane (OpenSandbox's execd API) and port tunnels"),
    ("/sandboxes/{id}/proxy/{port}/", "a port tunnel: the port's root"),
    ("/sandboxes/{id}/proxy/{port}/{*rest}", "the execd data plane and port tunnels"),
    ("/v1/sandboxes/{id}/proxy/{port}", "the execd data plane through the server proxy"),
    ("/v1/sandboxes/{id}/proxy/{port}/", "a port tunnel through the server proxy: the port's root"),
    ("/v1/sandboxes/{id}/proxy/{port}/{*rest}", "the execd data plane through the server proxy"),
    ("/sandboxes/{id}/signed/{port}/{exp}/{sig}", "a signed endpoint (OSEP-0011): a port tunnel, see execd::signed"),
    ("/sandboxes/{id}/signed/{port}/{exp}/{sig}/", "a signed endpoint: the port's root"),
    ("/sandboxes/{id}/signed/{port}/{exp}/{sig}/{*rest}", "a signed endpoint: a path of the port"),
    ("/v1/snapshots/{sid}/{*rest}", "a 501 catch-all for snapshot APIs this server lacks"),
    (
        "/pvisor/sandboxes/{id}/pty",
        "an HTTP/1.1 upgrade to a terminal (length-delimited protobuf), not JSON (see api::pty)",
    ),
    ("/metrics", "Prometheus metrics in a text exposition format, not JSON (see api::prom)"),
];

/// The name of the API-key security scheme.
const API_KEY_SCHEME: &str = "apiKey";

/// Every API error: `{code, message}` with its HTTP status.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code (`SANDBOX_NOT_FOUND`, `TOO_MANY_CREATES`, ...).
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
}

static DOCUMENT: OnceLock<serde_json::Value> = OnceLock::new();

/// Completes the generated document (title, security, error responses) and
/// keeps it for [`serve`]. The first published document wins (one router
/// per process).
pub fn publish(mut doc: OpenApi) -> serde_json::Value {
    finish(&mut doc);
    let v = serde_json::to_value(&doc).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}));
    DOCUMENT.get_or_init(|| v).clone()
}

/// Adds what the per-route attributes do not say.
pub fn finish(doc: &mut OpenApi) {
    doc.info.title = "pvisor".into();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    let left_out: Vec<String> = UNDOCUMENTED.iter().map(|(p, why)| format!("{p} ({why})")).collect();
    doc.info.description = Some(format!(
        "The OpenSandbox lifecycle API under /v1 and pvisor's own routes. Served but not described here: {}.",
        left_out.join("; ")
    ));
    let components = doc.components.get_or_insert_with(Default::default);
    components.schemas.insert("ErrorBody".into(), ErrorBody::schema());
    components.add_security_scheme(
        API_KEY_SCHEME,
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new(crate::api::auth::API_KEY_HEADER))),
    );
    let error: RefOr<Response> = ResponseBuilder::new()
        .description("an error: {code, message}")
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into();
    for (path, item) in doc.paths.paths.iter_mut() {
        let gated = path.starts_with("/v1/") || path.starts_with("/pvisor/");
        let ops: [(&str, &mut Option<Operation>); 8] = [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("options", &mut item.options),
            ("head", &mut item.head),
            ("patch", &mut item.patch),
            ("trace", &mut item.trace),
        ];
        let ops: Vec<(&str, &mut Operation)> =
            ops.into_iter().filter_map(|(m, o)| o.as_mut().map(|o| (m, o))).collect();
        // Handler names repeat across modules (`create`, `list`) and a
        // multi-method handler names several operations: ids must be unique,
        // so the tag comes first, and the method last where one handler
        // serves several.
        let names: Vec<Option<String>> = ops.iter().map(|(_, o)| o.operation_id.clone()).collect();
        for (method, op) in ops {
            let tag = op.tags.as_ref().and_then(|t| t.first()).cloned().unwrap_or_default();
            let name = op.operation_id.clone().unwrap_or_else(|| method.to_string());
            let shared = names.iter().filter(|n| n.as_deref() == Some(name.as_str())).count() > 1;
            op.operation_id = Some(if shared { format!("{tag}_{name}_{method}") } else { format!("{tag}_{name}") });
            op.responses.responses.entry("default".into()).or_insert_with(|| error.clone());
            if gated {
                op.security = Some(vec![SecurityRequirement::new(API_KEY_SCHEME, Vec::<String>::new())]);
            }
        }
    }
}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", tag = "pvisor",
    responses((status = 200, description = "this document", body = Object)))]
pub async fn serve() -> Json<serde_json::Value> {
    Json(DOCUMENT.get().cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Paths the router serves, read from its `Debug` output (axum has no
    /// route listing; the debug form names each path once, quoted).
    fn served(router: &axum::Router<std::sync::Arc<crate::server::Ctx>>) -> BTreeSet<String> {
        let text = format!("{router:?}");
        let start = text.find("paths: {").expect("axum's Debug lists the paths") + "paths: {".len();
        let (mut paths, mut current, mut quoted) = (BTreeSet::new(), String::new(), false);
        for c in text[start..].chars() {
            match (c, quoted) {
                ('"', false) => quoted = true,
                ('"', true) => {
                    quoted = false;
                    paths.insert(std::mem::take(&mut current));
                }
                (c, true) => current.push(c),
                ('}', false) => break,
                _ => {}
            }
        }
        paths
    }

    #[test]
    fn the_router_serves_exactly_the_documented_paths_and_the_listed_others() {
        let (router, doc) = crate::api::routes(&|r| r).split_for_parts();
        let served = served(&router);
        let documented: BTreeSet<String> = doc.paths.paths.keys().cloned().collect();
        let undocumented: BTreeSet<String> = UNDOCUMENTED.iter().map(|(p, _)| p.to_string()).collect();
        assert!(documented.len() > 15, "{documented:?}");
        assert!(documented.is_disjoint(&undocumented));
        let expected: BTreeSet<String> = documented.union(&undocumented).cloned().collect();
        let missing: Vec<_> = expected.difference(&served).collect();
        let extra: Vec<_> = served.difference(&expected).collect();
        assert!(missing.is_empty(), "documented or listed but not served: {missing:?}");
        assert!(extra.is_empty(), "served but neither documented nor listed in UNDOCUMENTED: {extra:?}");
    }

    #[test]
    fn every_operation_has_an_error_response_and_gated_ones_need_the_key() {
        let (_, mut doc) = crate::api::routes(&|r| r).split_for_parts();
        finish(&mut doc);
        let v = serde_json::to_value(&doc).unwrap();
        assert!(v["openapi"].as_str().unwrap().starts_with("3."));
        let mut ops = 0;
        for (path, item) in v["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                ops += 1;
                assert!(op["responses"]["default"].is_object(), "{method} {path}");
                let gated = !op["security"].is_null();
                assert_eq!(gated, path.starts_with("/v1/") || path.starts_with("/pvisor/"), "{method} {path}");
            }
        }
        assert!(ops > 20, "{ops} operations");
        let ids: Vec<&str> = v["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values().map(|op| op["operationId"].as_str().unwrap()))
            .collect();
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "operation ids repeat: {ids:?}");
        assert!(v["components"]["schemas"]["CreateSandboxRequest"].is_object());
        assert!(v["components"]["schemas"]["ErrorBody"].is_object());
    }
}

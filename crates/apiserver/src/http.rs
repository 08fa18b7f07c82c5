//! Request routing and the HTTP encoding of every API operation: paths,
//! verbs, bodies (JSON/YAML, size-limited), content negotiation (Table,
//! aggregated discovery), `Warning` headers, watch streaming, metrics and
//! the authn/authz seam.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cozyplane_errors::Chain;
use futures::{FutureExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};

use crate::auth::reviews::{self, VirtualResource};
use crate::auth::{authn, Attributes, Auth, Credentials, Decision, PeerIdentity, UserInfo};
use crate::discovery;
use crate::metrics::Metrics;
use crate::openapi::OpenApi;
use crate::patch::PatchType;
use crate::query::{accept_wants, Query};
use crate::registry::{
    DeleteOptions, FieldValidation, KindEntry, ListParams, Registry, WriteOptions,
};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::status::ApiError;
use crate::table::{self, IncludeObject};
use crate::watch::{self, WatchItem, WatchParams};

/// Response body type.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub use crate::limits::MAX_BODY_BYTES;

/// Default and maximum watch duration when the client gives none.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Everything a request handler needs.
pub struct AppState {
    pub registry: Arc<Registry>,
    pub openapi: OpenApi,
    pub metrics: Metrics,
    pub auth: Auth,
    /// The computed review kinds served (standalone mode), else empty.
    pub reviews: &'static [VirtualResource],
    /// Issues ServiceAccount tokens (standalone mode).
    pub sa_tokens: Option<Arc<crate::auth::serviceaccount::Issuer>>,
    /// Bumped to end every open watch.
    pub closer: tokio::sync::watch::Receiver<u64>,
    /// Open watches, limited per user.
    pub watches: Arc<watch::WatchSlots>,
    pub bookmark_interval: Duration,
    pub server_address: String,
    pub version: Value,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("server_address", &self.server_address)
            .finish_non_exhaustive()
    }
}

enum Reply {
    Json {
        code: u16,
        body: Value,
        content_type: &'static str,
        warnings: Vec<String>,
    },
    Text {
        body: String,
        content_type: &'static str,
    },
    Bytes {
        body: Vec<u8>,
        content_type: &'static str,
    },
    Stream(Body),
}

/// The encodings `/openapi/v2` is served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenApiV2 {
    Json,
    Protobuf,
}

/// Picks `/openapi/v2`'s encoding from an Accept header: the acceptable
/// media range with the highest `q` (the first of equals); JSON when the
/// header is empty; `None` when it accepts neither encoding.
fn openapi_v2_encoding(accept: &str) -> Option<OpenApiV2> {
    if accept.trim().is_empty() {
        return Some(OpenApiV2::Json);
    }
    let mut best: Option<(f32, OpenApiV2)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let encoding = match media.as_str() {
            "application/json" | "application/*" | "*/*" => OpenApiV2::Json,
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
            | "application/com.github.proto-openapi.spec.v2.v1.0+protobuf" => OpenApiV2::Protobuf,
            _ => continue,
        };
        if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, encoding));
        }
    }
    best.map(|(_, e)| e)
}

fn json_reply(code: u16, body: Value) -> Reply {
    Reply::Json {
        code,
        body,
        content_type: "application/json",
        warnings: Vec::new(),
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn build(code: u16, content_type: &str, body: Body, warnings: &[String]) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(ct) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    for w in warning_headers(warnings) {
        if let Ok(v) = HeaderValue::from_str(&w) {
            r.headers_mut().append("warning", v);
        }
    }
    r
}

/// At most this many bytes of `Warning` header values per response, as
/// kube-apiserver caps warnings (`truncateAtTotalRunes`): a client must not
/// be able to make the server send headers of any size (many unknown fields
/// under `fieldValidation=Warn`), and proxies refuse large header blocks.
pub const MAX_WARNINGS_BYTES: usize = 4 * 1024;
/// Once the warnings add up to more than [`MAX_WARNINGS_BYTES`], each text
/// is cut to this many characters before the total is applied (kube's
/// `truncateItemRunes`).
pub const MAX_WARNING_CHARS: usize = 256;

/// One `Warning` header value: `299 - "<text>"`.
fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

/// The `Warning` header values to send: duplicates dropped; when they add
/// up to more than [`MAX_WARNINGS_BYTES`], each text is truncated to
/// [`MAX_WARNING_CHARS`] characters and those that no longer fit are
/// dropped, as kube does.
fn warning_headers(warnings: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&String> = warnings.iter().filter(|w| seen.insert(*w)).collect();
    let all: Vec<String> = unique.iter().map(|w| warning_header(w)).collect();
    if all.iter().map(String::len).sum::<usize>() <= MAX_WARNINGS_BYTES {
        return all;
    }
    let mut out = Vec::new();
    let mut total = 0;
    for w in unique {
        let cut: String = w.chars().take(MAX_WARNING_CHARS).collect();
        let h = warning_header(&cut);
        if total + h.len() > MAX_WARNINGS_BYTES {
            break;
        }
        total += h.len();
        out.push(h);
    }
    out
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = build(
        e.code,
        "application/json",
        full(e.to_status().to_string()),
        &[],
    );
    if let Some(s) = e.details.retry_after_seconds {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// What a request is, for authorization and metrics.
struct Target {
    verb: &'static str,
    resource: String,
}

/// Handle one HTTP request. Never fails: errors become `Status` bodies.
pub async fn handle(
    state: Arc<AppState>,
    peer: Option<Arc<PeerIdentity>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let mut target = Target {
        verb: "get",
        resource: String::new(),
    };
    // A panic in a handler answers 500 to its own request only; without
    // this it unwinds through the connection task and drops every request
    // of that connection (all streams of an HTTP/2 connection).
    let result = AssertUnwindSafe(route(&state, peer.as_deref(), req, &mut target))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "request handler panicked");
            Err(ApiError::internal(
                "the request handler failed unexpectedly",
            ))
        });
    let resp = match result {
        Ok(Reply::Json {
            code,
            body,
            content_type,
            warnings,
        }) => build(code, content_type, full(body.to_string()), &warnings),
        Ok(Reply::Text { body, content_type }) => build(200, content_type, full(body), &[]),
        Ok(Reply::Bytes { body, content_type }) => build(200, content_type, full(body), &[]),
        Ok(Reply::Stream(body)) => build(200, "application/json", body, &[]),
        Err(e) => error_response(&e),
    };
    if !target.resource.is_empty() {
        state.metrics.observe(
            target.verb,
            &target.resource,
            resp.status().as_u16(),
            started.elapsed(),
        );
    }
    Ok(resp)
}

async fn authorize(state: &AppState, user: &UserInfo, attrs: Attributes) -> Result<(), ApiError> {
    match state.auth.authorizer.authorize(user, &attrs).await {
        Decision::Allow => Ok(()),
        Decision::Deny(why) => {
            let mut e = ApiError::forbidden(attrs.forbidden_message(user, &why));
            if attrs.is_resource() {
                e = e.with_details(&attrs.group, &attrs.resource, &attrs.name);
            }
            Err(e)
        }
    }
}

async fn route(
    state: &AppState,
    peer: Option<&PeerIdentity>,
    req: Request<Incoming>,
    target: &mut Target,
) -> Result<Reply, ApiError> {
    let path = req.uri().path().to_string();
    let user = authn::resolve(
        &*state.auth.authenticator,
        &Credentials {
            headers: req.headers(),
            peer,
        },
        &path,
    )
    .await?;
    let query = Query::parse(req.uri().query())?;
    let accept = header_str(req.headers(), header::ACCEPT);
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let non_resource = |p: &str| Attributes::non_resource("get", p);
    let is_get = req.method() == Method::GET;
    match segs.as_slice() {
        ["livez"] | ["healthz"] | ["readyz"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            if segs[0] == "readyz" {
                // The store's health flag (no write): 503 while writes fail.
                state
                    .registry
                    .store()
                    .ready()
                    .await
                    .map_err(ApiError::from_store)?;
            }
            return Ok(Reply::Text {
                body: "ok".into(),
                content_type: "text/plain; charset=utf-8",
            });
        }
        ["version"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return Ok(json_reply(200, state.version.clone()));
        }
        ["metrics"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return Ok(Reply::Text {
                body: state.metrics.render(),
                content_type: crate::metrics::CONTENT_TYPE,
            });
        }
        ["openapi", "v2"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return match openapi_v2_encoding(&accept) {
                Some(OpenApiV2::Json) => Ok(json_reply(200, (*state.openapi.v2).clone())),
                Some(OpenApiV2::Protobuf) => Ok(Reply::Bytes {
                    body: (*state.openapi.v2_protobuf).clone(),
                    content_type: crate::openapi::protobuf::CONTENT_TYPE,
                }),
                None => Err(ApiError::not_acceptable(
                    "/openapi/v2 is served as application/json or application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
                )),
            };
        }
        ["openapi", "v3"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return Ok(json_reply(200, (*state.openapi.v3_index).clone()));
        }
        ["openapi", "v3", rest @ ..] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            let gv = rest.join("/");
            return match state.openapi.v3.get(&gv) {
                Some(doc) => Ok(json_reply(200, doc.clone())),
                None => Err(ApiError::no_route(&path)),
            };
        }
        ["api"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return Ok(discovery_reply(state, &accept, true));
        }
        ["apis"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return Ok(discovery_reply(state, &accept, false));
        }
        ["api", "v1"] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return discovery::resource_list(state.registry.kinds(), state.reviews, "", "v1")
                .map(|b| json_reply(200, b))
                .ok_or_else(|| ApiError::no_route(&path));
        }
        ["apis", g] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return discovery::group(state.registry.kinds(), state.reviews, g)
                .map(|b| json_reply(200, b))
                .ok_or_else(|| ApiError::no_route(&path));
        }
        ["apis", g, v] if is_get => {
            authorize(state, &user, non_resource(&path)).await?;
            return discovery::resource_list(state.registry.kinds(), state.reviews, g, v)
                .map(|b| json_reply(200, b))
                .ok_or_else(|| ApiError::no_route(&path));
        }
        _ => {}
    }
    if let ["apis", g, v, plural] = segs.as_slice() {
        if let Some(r) = state
            .reviews
            .iter()
            .find(|r| r.group == *g && r.version == *v && r.plural == *plural)
        {
            return review_reply(state, &user, r, req, target).await;
        }
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", "v1", rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return Err(ApiError::no_route(&path)),
    };
    let res = parse_resource(&state.registry, group, version, rest)
        .ok_or_else(|| ApiError::no_route(&path))?;
    target.resource = res.kind.info.plural.to_string();
    let watching = query.flag("watch")?;
    let computed_sub = res.subresource.as_deref().and_then(|s| {
        res.kind
            .hooks
            .computed_subresources
            .iter()
            .find(|c| c.name == s)
    });
    let create_sub = res
        .subresource
        .as_deref()
        .and_then(|s| res.kind.hooks.create_subresource(s))
        .map(|_| ())
        .or(computed_sub.map(|_| ()));
    let verb: &'static str = match (req.method().clone(), res.name.is_some()) {
        (Method::POST, true) if create_sub.is_some() => "create",
        (_, true) if create_sub.is_some() => {
            return Err(ApiError::method_not_allowed(req.method().as_str()))
        }
        (Method::GET, true) => "get",
        (Method::GET, false) if watching => "watch",
        (Method::GET, false) => "list",
        (Method::POST, false) => "create",
        (Method::PUT, true) => "update",
        (Method::PATCH, true) => "patch",
        (Method::DELETE, true) => "delete",
        (Method::DELETE, false) => "deletecollection",
        (m, _) => return Err(ApiError::method_not_allowed(m.as_str())),
    };
    target.verb = verb;
    if res.subresource.is_some()
        && create_sub.is_none()
        && !matches!(verb, "get" | "update" | "patch")
    {
        return Err(ApiError::method_not_allowed(req.method().as_str()));
    }
    if res.kind.info.namespaced && res.namespace.is_none() && !matches!(verb, "list" | "watch") {
        return Err(ApiError::no_route(&path));
    }
    authorize(
        state,
        &user,
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: res.kind.info.plural.into(),
            subresource: res.subresource.clone().unwrap_or_default(),
            namespace: res.namespace.clone().unwrap_or_default(),
            name: res.name.clone().unwrap_or_default(),
            path: path.clone(),
        },
    )
    .await?;

    if let (Some(id), "list" | "watch") = (
        crate::auth::node::NodeIdentity::of(&user, &state.auth.agent_accounts),
        verb,
    ) {
        crate::auth::node::check_read(
            &id,
            res.kind.info.group,
            res.kind.info.plural,
            query.get("fieldSelector"),
        )
        .map_err(|why| {
            ApiError::forbidden(format!(
                "{} is forbidden: User \"{}\" cannot {verb} it: {why}",
                crate::status::qualified(res.kind.info.group, res.kind.info.plural),
                user.name
            ))
            .with_details(res.kind.info.group, res.kind.info.plural, "")
        })?;
    }
    let table = accept_wants(&accept, "Table", "meta.k8s.io", "v1");
    let include = IncludeObject::parse(query.get("includeObject"))?;
    let kind = res.kind.clone();
    let ns = res.namespace.as_deref();
    let name = res.name.as_deref().unwrap_or("");
    let status_only = res.subresource.as_deref() == Some("status");
    let admit: Option<Arc<dyn crate::registry::Admit>> = Some(Arc::new(Admission {
        authorizer: state.auth.authorizer.clone(),
        registry: state.registry.clone(),
        user: user.clone(),
        node: crate::auth::node::NodeIdentity::of(&user, &state.auth.agent_accounts),
    }));
    let write_opts = || -> Result<WriteOptions, ApiError> {
        Ok(WriteOptions {
            dry_run: query.dry_run()?,
            field_validation: FieldValidation::parse(query.get("fieldValidation"))?,
            field_manager: query.get("fieldManager").map(str::to_string),
            admit: admit.clone(),
        })
    };
    let render = |obj: Value| {
        if table {
            table::to_table(&kind, &obj, include)
        } else {
            obj
        }
    };
    let content_type = header_str(req.headers(), header::CONTENT_TYPE);
    match verb {
        "get" => Ok(json_reply(
            200,
            render(state.registry.get(&kind, ns, name).await?),
        )),
        "list" => {
            let params = list_params(&kind, &query)?;
            if table {
                Ok(json_reply(
                    200,
                    render(state.registry.list(&kind, ns, &params).await?),
                ))
            } else {
                let bytes = state.registry.list_json(&kind, ns, &params).await?;
                Ok(Reply::Bytes {
                    body: bytes,
                    content_type: "application/json",
                })
            }
        }
        "watch" => {
            watch_reply(
                state,
                &user,
                kind.clone(),
                res.namespace.clone(),
                &query,
                table,
                include,
            )
            .await
        }
        "create" if computed_sub.is_some() => {
            let body = read_body(req).await?;
            let obj = decode_object(&content_type, &body)?;
            let Some(issuer) = &state.sa_tokens else {
                return Err(ApiError::new(
                    503,
                    "ServiceUnavailable",
                    "this server issues no service account tokens",
                ));
            };
            let out = issuer
                .token_request(&state.registry, ns.unwrap_or(""), name, obj)
                .await?;
            Ok(json_reply(201, out))
        }
        "create" if create_sub.is_some() => {
            let opts = write_opts()?;
            let body = read_body(req).await?;
            let obj = decode_object(&content_type, &body)?;
            let sub = res.subresource.as_deref().unwrap_or("");
            state
                .registry
                .create_subresource(&kind, ns, name, sub, &obj, &opts)
                .await?;
            let mut status =
                crate::status::success_status(kind.info.group, kind.info.plural, Some(name));
            status["code"] = json!(201);
            Ok(json_reply(201, status))
        }
        "create" => {
            let opts = write_opts()?;
            let body = read_body(req).await?;
            let obj = decode_object(&content_type, &body)?;
            let w = state.registry.create(&kind, ns, obj, &opts).await?;
            Ok(Reply::Json {
                code: 201,
                body: w.object,
                content_type: "application/json",
                warnings: w.warnings,
            })
        }
        "update" => {
            let opts = write_opts()?;
            let body = read_body(req).await?;
            let obj = decode_object(&content_type, &body)?;
            let w = state
                .registry
                .update(&kind, ns, name, obj, status_only, &opts)
                .await?;
            Ok(Reply::Json {
                code: 200,
                body: w.object,
                content_type: "application/json",
                warnings: w.warnings,
            })
        }
        "patch" => {
            let opts = write_opts()?;
            let ptype = PatchType::from_content_type(&content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(&content_type))?;
            let body = read_body(req).await?;
            let patch = if ptype == PatchType::Apply {
                decode_yaml(&body)?
            } else {
                decode_json(&body)?
            };
            let w = state
                .registry
                .patch(&kind, ns, name, ptype, &patch, status_only, &opts)
                .await?;
            let code = if w.created { 201 } else { 200 };
            Ok(Reply::Json {
                code,
                body: w.object,
                content_type: "application/json",
                warnings: w.warnings,
            })
        }
        "delete" => {
            let dry = query.dry_run()?;
            let body = read_body(req).await?;
            let mut opts = delete_options(&query, &body, dry)?;
            opts.admit = admit.clone();
            Ok(json_reply(
                200,
                state.registry.delete(&kind, ns, name, &opts).await?,
            ))
        }
        "deletecollection" => {
            let dry = query.dry_run()?;
            let params = list_params(&kind, &query)?;
            let body = read_body(req).await?;
            let mut opts = delete_options(&query, &body, dry)?;
            opts.admit = admit.clone();
            Ok(json_reply(
                200,
                state
                    .registry
                    .delete_collection(&kind, ns, &params, &opts)
                    .await?,
            ))
        }
        _ => Err(ApiError::method_not_allowed(verb)),
    }
}

/// The admission steps that need the requesting user, run by the
/// registry just before a write: the kind's second questions (virtual
/// verbs), RBAC escalation prevention ([`crate::auth::escalation`]) and
/// node restriction ([`crate::auth::node`]).
struct Admission {
    authorizer: Arc<dyn crate::auth::Authorizer>,
    registry: Arc<Registry>,
    user: UserInfo,
    node: Option<crate::auth::node::NodeIdentity>,
}

impl Admission {
    async fn ask(&self, a: &Attributes) -> Result<(), ApiError> {
        match self.authorizer.authorize(&self.user, a).await {
            Decision::Allow => Ok(()),
            Decision::Deny(why) => Err(ApiError::forbidden(a.forbidden_message(&self.user, &why))
                .with_details(&a.group, &a.resource, &a.name)),
        }
    }

    fn restrict_node(
        &self,
        kind: &KindEntry,
        new: Option<&Value>,
        old: Option<&Value>,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(id) = &self.node else {
            return Ok(());
        };
        crate::auth::node::check(id, kind.info.group, kind.info.plural, new, old).map_err(|why| {
            ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: User \"{}\" cannot write it: {why}",
                crate::status::qualified(kind.info.group, kind.info.plural),
                self.user.name
            ))
            .with_details(kind.info.group, kind.info.plural, name)
        })
    }

    /// kube's escalation check: the waiver verb, else every permission
    /// granted must be held by the writer.
    async fn no_escalation(
        &self,
        kind: &KindEntry,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        use crate::auth::escalation::{self, Grants};
        if kind.info.group != crate::auth::rbac::GROUP {
            return Ok(());
        }
        let Some(check) = escalation::check_for(kind.info.plural, new, old) else {
            return Ok(());
        };
        if self
            .authorizer
            .authorize(&self.user, &check.waiver)
            .await
            .allowed()
        {
            return Ok(());
        }
        let name = crate::meta::meta_str(new, "name").unwrap_or("").to_string();
        let forbidden = |why: String| {
            ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: user \"{}\" (groups={:?}) {why}",
                crate::status::qualified(kind.info.group, kind.info.plural),
                self.user.name,
                self.user.groups
            ))
            .with_details(kind.info.group, kind.info.plural, &name)
        };
        if check.waiver_only {
            return Err(forbidden(format!(
                "must have verb {:?} on {} to use the aggregationRule",
                check.waiver.verb, check.waiver.resource
            )));
        }
        let rules = match &check.grants {
            Grants::Rules(r) => r.clone(),
            Grants::RoleRef {
                plural,
                namespace,
                name: role,
            } => {
                let role_kind = self
                    .registry
                    .find(crate::auth::rbac::GROUP, "v1", plural)
                    .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
                let ns = (!namespace.is_empty()).then_some(namespace.as_str());
                let obj = match self.registry.get(&role_kind, ns, role).await {
                    Ok(obj) => obj,
                    Err(e) if e.code == 404 => {
                        return Err(forbidden(format!(
                            "cannot bind {plural} {role:?}: it does not exist, and only a user with verb \"bind\" on it may bind it before it does"
                        )))
                    }
                    Err(e) => return Err(e),
                };
                let rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = obj
                    .get("rules")
                    .cloned()
                    .and_then(|r| serde_json::from_value(r).ok())
                    .unwrap_or_default();
                rules.iter().map(crate::auth::rbac::Rule::from).collect()
            }
        };
        let atoms = escalation::breakdown(&rules, &check.namespace).map_err(|e| {
            forbidden(format!(
                "is attempting to grant RBAC permissions that cannot be checked one by one ({e}); it needs verb {:?}",
                check.waiver.verb
            ))
        })?;
        let mut missing = Vec::new();
        for a in &atoms {
            if !self.authorizer.authorize(&self.user, a).await.allowed() {
                missing.push(escalation::describe(a));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let shown = missing.len().min(20);
        let more = if missing.len() > shown {
            format!("\n...and {} more", missing.len() - shown)
        } else {
            String::new()
        };
        Err(forbidden(format!(
            "is attempting to grant RBAC permissions not currently held:\n{}{more}",
            missing[..shown].join("\n")
        )))
    }
}

#[async_trait::async_trait]
impl crate::registry::Admit for Admission {
    async fn admit(
        &self,
        kind: &KindEntry,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let name = crate::meta::meta_str(new, "name").unwrap_or("");
        self.restrict_node(kind, Some(new), old, name)?;
        if let Some(questions) = kind.hooks.second_questions {
            for a in questions(new, old) {
                self.ask(&a).await?;
            }
        }
        self.no_escalation(kind, new, old).await
    }

    async fn admit_delete(
        &self,
        kind: &KindEntry,
        old: Option<&Value>,
        name: &str,
    ) -> Result<(), ApiError> {
        self.restrict_node(kind, None, old, name)
    }
}

/// POST of a review kind: authorized as `create` on it, answered in
/// `status`, never stored.
async fn review_reply(
    state: &AppState,
    user: &UserInfo,
    r: &'static VirtualResource,
    req: Request<Incoming>,
    target: &mut Target,
) -> Result<Reply, ApiError> {
    target.resource = r.plural.to_string();
    target.verb = "create";
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed(req.method().as_str()));
    }
    authorize(
        state,
        user,
        Attributes {
            verb: "create".into(),
            group: r.group.into(),
            resource: r.plural.into(),
            ..Attributes::default()
        },
    )
    .await?;
    let content_type = header_str(req.headers(), header::CONTENT_TYPE);
    let body = read_body(req).await?;
    let obj = if content_type.starts_with(crate::auth::proto::CONTENT_TYPE) {
        crate::auth::proto::decode_review(r, &body)?
    } else {
        decode_object(&content_type, &body)?
    };
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(r.kind);
    if kind != r.kind {
        return Err(ApiError::bad_request(format!(
            "the body is a {kind}, not a {}",
            r.kind
        )));
    }
    let who = reviews::Reviewers {
        authenticator: &*state.auth.authenticator,
        authorizer: &*state.auth.authorizer,
    };
    let mut out = reviews::review(r, &who, user, obj).await?;
    out["apiVersion"] = json!(format!("{}/{}", r.group, r.version));
    out["kind"] = json!(r.kind);
    Ok(json_reply(201, out))
}

/// A header's value as text, empty when absent or not text.
fn header_str(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn discovery_reply(state: &AppState, accept: &str, core: bool) -> Reply {
    if accept_wants(accept, "APIGroupDiscoveryList", "apidiscovery.k8s.io", "v2") {
        return Reply::Json {
            code: 200,
            body: discovery::aggregated(state.registry.kinds(), state.reviews, core),
            content_type: discovery::AGGREGATED_CONTENT_TYPE,
            warnings: Vec::new(),
        };
    }
    if core {
        json_reply(
            200,
            discovery::api_versions(state.registry.kinds(), &state.server_address),
        )
    } else {
        json_reply(
            200,
            discovery::group_list(state.registry.kinds(), state.reviews),
        )
    }
}

/// A parsed resource path.
struct ResourcePath {
    kind: Arc<KindEntry>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

/// Whether `kind` serves the subresource `sub` (`status`, or one of its
/// create hooks such as `binding`).
fn serves_subresource(kind: &KindEntry, sub: &str) -> bool {
    (sub == "status" && kind.info.status_subresource)
        || kind.hooks.create_subresource(sub).is_some()
        || kind
            .hooks
            .computed_subresources
            .iter()
            .any(|c| c.name == sub)
}

fn parse_resource(
    reg: &Registry,
    group: &str,
    version: &str,
    segs: &[&str],
) -> Option<ResourcePath> {
    if segs.first() == Some(&"namespaces") && segs.len() >= 3 {
        if let Some(kind) = reg
            .find(group, version, segs[2])
            .filter(|k| k.info.namespaced)
        {
            if segs.len() > 5 {
                return None;
            }
            let sub = segs.get(4).map(|s| s.to_string());
            if sub
                .as_deref()
                .is_some_and(|s| !serves_subresource(&kind, s))
            {
                return None;
            }
            return Some(ResourcePath {
                kind,
                namespace: Some(segs[1].to_string()),
                name: segs.get(3).map(|s| s.to_string()),
                subresource: sub,
            });
        }
    }
    let kind = reg.find(group, version, segs.first()?)?;
    if segs.len() > 3 || (kind.info.namespaced && segs.len() > 1) {
        return None;
    }
    let sub = segs.get(2).map(|s| s.to_string());
    if sub
        .as_deref()
        .is_some_and(|s| !serves_subresource(&kind, s))
    {
        return None;
    }
    Some(ResourcePath {
        kind,
        namespace: None,
        name: segs.get(1).map(|s| s.to_string()),
        subresource: sub,
    })
}

fn selectors(kind: &KindEntry, q: &Query) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(
            q.get("fieldSelector").unwrap_or(""),
            kind.info.field_selectors,
        )?,
    })
}

fn list_params(kind: &KindEntry, q: &Query) -> Result<ListParams, ApiError> {
    Ok(ListParams {
        selectors: selectors(kind, q)?,
        limit: q
            .number("limit")?
            .map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
        continue_token: q
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        resource_version: q.get("resourceVersion").map(str::to_string),
        resource_version_match: q.get("resourceVersionMatch").map(str::to_string),
    })
}

async fn watch_reply(
    state: &AppState,
    user: &UserInfo,
    kind: Arc<KindEntry>,
    ns: Option<String>,
    q: &Query,
    table: bool,
    include: IncludeObject,
) -> Result<Reply, ApiError> {
    let timeout = q
        .number("timeoutSeconds")?
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT)
        .min(DEFAULT_WATCH_TIMEOUT);
    let params = WatchParams {
        selectors: selectors(&kind, q)?,
        resource_version: q.get("resourceVersion").map(str::to_string),
        resource_version_match: q.get("resourceVersionMatch").map(str::to_string),
        send_initial_events: q.flag("sendInitialEvents")?,
        allow_bookmarks: q.flag("allowWatchBookmarks")?,
        timeout,
        bookmark_interval: state.bookmark_interval,
    };
    let slot = state.watches.acquire(user)?;
    let stream = watch::watch(
        &state.registry,
        kind.clone(),
        ns,
        params,
        state.closer.clone(),
        slot,
    )
    .await?;
    let frames = stream.map(move |item| {
        let line = match item {
            WatchItem::Event { type_, object } => {
                let object = if table && type_ != "BOOKMARK" {
                    table::to_table(&kind, &object, include)
                } else {
                    object
                };
                json!({"type": type_, "object": object})
            }
            WatchItem::Error(status) => json!({"type": "ERROR", "object": status}),
        };
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        Ok::<_, Infallible>(Frame::data(Bytes::from(bytes)))
    });
    Ok(Reply::Stream(StreamBody::new(frames).boxed_unsync()))
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let declared = content_length(req.headers());
    let mut body = req.into_body();
    let mut buf = bytes::BytesMut::new();
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::bad_request(format!("reading the request body: {}", Chain(&e)))
        })?;
        if let Ok(data) = frame.into_data() {
            seen += data.len() as u64;
            if seen > MAX_BODY_BYTES as u64 {
                // Keep reading (and discarding) a bounded amount so the
                // client gets the 413 instead of a reset connection.
                if seen > DRAIN_LIMIT {
                    break;
                }
                continue;
            }
            buf.extend_from_slice(&data);
        }
    }
    if seen > MAX_BODY_BYTES as u64 || declared.is_some_and(|l| l > MAX_BODY_BYTES as u64) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    Ok(buf.freeze())
}

/// How much of an oversized body is drained before giving up on it.
const DRAIN_LIMIT: u64 = 16 * 1024 * 1024;

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn decode_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("error decoding JSON request body: {}", Chain(&e)))
    })
}

fn decode_yaml(body: &[u8]) -> Result<Value, ApiError> {
    serde_saphyr::from_slice_with_options(body, yaml_options()).map_err(|e| {
        ApiError::bad_request(format!("error decoding YAML request body: {}", Chain(&e)))
    })
}

/// How YAML bodies are read: as before the move from `serde_yaml` (YAML 1.2 core
/// booleans, so `yes` stays a string; `0777` and `1_000` stay strings), a repeated key
/// keeps its last value as in [`decode_json`], and an error is one line (no source
/// snippet) for the `Status` message. serde-saphyr's default budget (events, depth,
/// aliases) stays on: bodies come from clients.
fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o.ignore_binary_tag_for_string = true;
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    o.with_snippet = false;
    o
}

fn decode_object(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let base = content_type.split(';').next().unwrap_or("").trim();
    let v = match base {
        "" | "application/json" | "*/*" => decode_json(body)?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => decode_yaml(body)?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be an object"));
    }
    Ok(v)
}

fn delete_options(q: &Query, body: &[u8], dry_query: bool) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        dry_run: dry_query,
        propagation_policy: q.get("propagationPolicy").map(str::to_string),
        grace_period_seconds: match q.get("gracePeriodSeconds") {
            None | Some("") => None,
            Some(g) => Some(g.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("gracePeriodSeconds: invalid integer {g:?}"))
            })?),
        },
        ..Default::default()
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(opts);
    }
    let v = decode_json(body)?;
    if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
        if !matches!(p, "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {p:?}"
            )));
        }
        opts.propagation_policy = Some(p.to_string());
    }
    match v.get("gracePeriodSeconds") {
        None | Some(Value::Null) => {}
        Some(g) => {
            let g = g.as_i64().ok_or_else(|| {
                ApiError::bad_request(format!("gracePeriodSeconds: must be an integer, got {g}"))
            })?;
            opts.grace_period_seconds = Some(g);
        }
    }
    if let Some(pre) = v.get("preconditions") {
        opts.precondition_uid = pre.get("uid").and_then(Value::as_str).map(str::to_string);
        opts.precondition_rv = pre
            .get("resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
        for x in d {
            match x.as_str() {
                Some("All") => opts.dry_run = true,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "dryRun: Unsupported value: {other:?}"
                    )))
                }
            }
        }
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openapi_v2_is_served_in_the_encoding_the_client_prefers() {
        use OpenApiV2::{Json, Protobuf};
        let pb = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
        for (accept, want) in [
            ("", Some(Json)),
            ("application/json", Some(Json)),
            ("*/*", Some(Json)),
            (pb, Some(Protobuf)),
            (
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                Some(Protobuf),
            ),
            (&format!("{pb}, application/json"), Some(Protobuf)),
            (&format!("application/json;q=0.5, {pb}"), Some(Protobuf)),
            (&format!("{pb};q=0.1, application/json"), Some(Json)),
            (&format!("{pb};q=0, text/html"), None),
            ("application/vnd.kubernetes.protobuf", None),
            ("text/html", None),
        ] {
            assert_eq!(openapi_v2_encoding(accept), want, "{accept:?}");
        }
    }

    fn yaml(body: &str) -> Value {
        match decode_object("application/yaml", body.as_bytes()) {
            Ok(v) => v,
            Err(e) => panic!("{body:?}: {}", e.message),
        }
    }

    fn yaml_err(body: &str) -> ApiError {
        match decode_object("application/yaml", body.as_bytes()) {
            Ok(v) => panic!("{body:?} decoded to {v}"),
            Err(e) => e,
        }
    }

    #[test]
    fn yaml_bodies_read_as_they_did_with_serde_yaml() {
        // JSON is YAML: server-side apply sends compact JSON as apply-patch+yaml.
        let compact = r#"{"apiVersion":"v1","kind":"X","metadata":{"name":"a"},"spec":{"n":null,"f":1.5,"t":true,"e":"a\"b\\c\u00e9"}}"#;
        assert_eq!(
            yaml(compact),
            json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"},
                   "spec": {"n": null, "f": 1.5, "t": true, "e": "a\"b\\cé"}})
        );
        // YAML 1.1 spellings stay strings; YAML 1.2 core scalars are typed.
        let v = yaml(
            "a: yes\nb: no\nc: on\nd: y\ne: 0777\nf: 1_000\ng: 0x1F\nh: ~\ni: 1e3\nj: True\n\
             k: 2001-12-14\nl: !!binary aGk=\n",
        );
        assert_eq!(
            v,
            json!({"a": "yes", "b": "no", "c": "on", "d": "y", "e": "0777", "f": "1_000",
                   "g": 31, "h": null, "i": 1000.0, "j": true, "k": "2001-12-14", "l": "aGk="})
        );
        // A repeated key keeps its last value, as the JSON decoder does.
        assert_eq!(yaml("a: 1\na: 2\n"), json!({"a": 2}));
        assert_eq!(
            decode_object("application/json", br#"{"a": 1, "a": 2}"#).ok(),
            Some(json!({"a": 2}))
        );
        // Anchors and aliases resolve.
        assert_eq!(
            yaml("a: &x {b: 1}\nc: *x\n"),
            json!({"a": {"b": 1}, "c": {"b": 1}})
        );
    }

    #[test]
    fn warnings_are_capped_at_4_kib() {
        // Few and short: all sent, duplicates once, quotes escaped.
        let few = vec!["a \"b\"".to_string(), "c".into(), "c".into()];
        assert_eq!(
            warning_headers(&few),
            ["299 - \"a \\\"b\\\"\"", "299 - \"c\""]
        );
        // Many and long: each cut to 256 characters, the total under 4 KiB.
        let many: Vec<String> = (0..100)
            .map(|i| format!("{i:03}{}", "x".repeat(1000)))
            .collect();
        let sent = warning_headers(&many);
        let total: usize = sent.iter().map(String::len).sum();
        assert!(total <= MAX_WARNINGS_BYTES, "{total}");
        assert_eq!(sent.len(), MAX_WARNINGS_BYTES / (MAX_WARNING_CHARS + 8));
        assert!(sent.iter().all(|h| h.len() == MAX_WARNING_CHARS + 8));
        assert!(sent[1].starts_with("299 - \"001x"));
    }

    #[test]
    fn bad_yaml_bodies_are_one_line_bad_requests() {
        for body in ["metadata: [unclosed", "---\na: 1\n---\nb: 2\n", "a: .inf\n"] {
            let e = yaml_err(body);
            assert_eq!((e.code, e.reason), (400, "BadRequest"), "{body:?}");
            assert!(
                e.message.starts_with("error decoding YAML request body: ")
                    && !e.message.contains('\n'),
                "{body:?}: {}",
                e.message
            );
        }
        let e = yaml_err("- 1\n- 2\n");
        assert_eq!(e.message, "the request body must be an object");
    }
}

//! The review kinds standalone mode serves, as kube-apiserver does:
//! `SelfSubjectAccessReview` (`kubectl auth can-i`), `SubjectAccessReview`
//! (what an aggregated API server asks its main API server),
//! `SelfSubjectRulesReview` (`kubectl auth can-i --list`), `TokenReview`
//! (delegated bearer-token authentication) and `SelfSubjectReview`
//! (`kubectl auth whoami`). They are create-only and never stored: the
//! answer is in the returned object's `status`.

use std::collections::BTreeMap;

use cozyplane_api::kinds::{FieldError, FieldErrorType};
use serde_json::{json, Value};

use super::{Attributes, Authenticator, Authorizer, UserInfo};
use crate::status::ApiError;

/// A create-only resource that is computed, not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualResource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

pub const AUTHORIZATION: &str = "authorization.k8s.io";
pub const AUTHENTICATION: &str = "authentication.k8s.io";

/// The review resources, for discovery and routing.
pub const REVIEWS: &[VirtualResource] = &[
    VirtualResource {
        group: AUTHORIZATION,
        version: "v1",
        kind: "SelfSubjectAccessReview",
        plural: "selfsubjectaccessreviews",
    },
    VirtualResource {
        group: AUTHORIZATION,
        version: "v1",
        kind: "SelfSubjectRulesReview",
        plural: "selfsubjectrulesreviews",
    },
    VirtualResource {
        group: AUTHORIZATION,
        version: "v1",
        kind: "SubjectAccessReview",
        plural: "subjectaccessreviews",
    },
    VirtualResource {
        group: AUTHENTICATION,
        version: "v1",
        kind: "TokenReview",
        plural: "tokenreviews",
    },
    VirtualResource {
        group: AUTHENTICATION,
        version: "v1",
        kind: "SelfSubjectReview",
        plural: "selfsubjectreviews",
    },
];

/// The review resource at `group/version/plural`, if it is one.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static VirtualResource> {
    REVIEWS
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

fn invalid(r: &VirtualResource, errors: &[FieldError]) -> ApiError {
    ApiError::invalid(r.group, r.kind, "", errors)
}

fn field(path: &str, message: &str) -> FieldError {
    FieldError::new(FieldErrorType::Required, path, message)
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The strings of a JSON array (others skipped); empty when absent.
pub(crate) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The attributes a review's `spec` asks about.
fn spec_attributes(r: &VirtualResource, spec: &Value) -> Result<Attributes, ApiError> {
    match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(ra), None) => Ok(Attributes {
            verb: str_at(ra, "verb").into(),
            group: str_at(ra, "group").into(),
            resource: str_at(ra, "resource").into(),
            subresource: str_at(ra, "subresource").into(),
            namespace: str_at(ra, "namespace").into(),
            name: str_at(ra, "name").into(),
            path: String::new(),
        }),
        (None, Some(na)) => Ok(Attributes::non_resource(
            str_at(na, "verb"),
            str_at(na, "path"),
        )),
        _ => Err(invalid(
            r,
            &[field(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        )),
    }
}

fn answer(mut body: Value, status: Value) -> Value {
    if !body.is_object() {
        body = json!({});
    }
    body["status"] = status;
    if body.get("metadata").is_none_or(|m| !m.is_object()) {
        body["metadata"] = json!({});
    }
    body["metadata"]["creationTimestamp"] = Value::Null;
    body
}

async fn decide(authz: &dyn Authorizer, user: &UserInfo, a: &Attributes) -> Value {
    match authz.authorize(user, a).await {
        super::Decision::Allow => json!({"allowed": true}),
        super::Decision::Deny(why) if why.is_empty() => json!({"allowed": false}),
        super::Decision::Deny(why) => json!({"allowed": false, "reason": why}),
    }
}

fn user_info_json(u: &UserInfo) -> Value {
    let mut v = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        v["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        v["extra"] = json!(u.extra);
    }
    v
}

/// What the server needs to answer a review.
pub struct Reviewers<'a> {
    pub authenticator: &'a dyn Authenticator,
    pub authorizer: &'a dyn Authorizer,
}

/// Answers a review `r` posted by `user` with `body`.
pub async fn review(
    r: &VirtualResource,
    who: &Reviewers<'_>,
    user: &UserInfo,
    body: Value,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    match r.plural {
        "selfsubjectaccessreviews" => {
            let a = spec_attributes(r, &spec)?;
            let status = decide(who.authorizer, user, &a).await;
            Ok(answer(body, status))
        }
        "subjectaccessreviews" => {
            let a = spec_attributes(r, &spec)?;
            let subject = UserInfo {
                name: str_at(&spec, "user").into(),
                uid: str_at(&spec, "uid").into(),
                groups: strings(spec.get("groups")),
                extra: spec
                    .get("extra")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), strings(Some(v))))
                            .collect::<BTreeMap<_, _>>()
                    })
                    .unwrap_or_default(),
            };
            if subject.name.is_empty() && subject.groups.is_empty() {
                return Err(invalid(
                    r,
                    &[field(
                        "spec.user",
                        "at least one of user or group must be specified",
                    )],
                ));
            }
            let status = decide(who.authorizer, &subject, &a).await;
            Ok(answer(body, status))
        }
        "selfsubjectrulesreviews" => {
            let ns = str_at(&spec, "namespace");
            let status = match who.authorizer.rules_for(user, ns) {
                Some(rules) => {
                    let (res, non): (Vec<_>, Vec<_>) = rules
                        .into_iter()
                        .partition(|r| r.non_resource_urls.is_empty());
                    json!({
                        "resourceRules": res.iter().map(|r| json!({
                            "verbs": r.verbs, "apiGroups": r.api_groups,
                            "resources": r.resources, "resourceNames": r.resource_names,
                        })).collect::<Vec<_>>(),
                        "nonResourceRules": non.iter().map(|r| json!({
                            "verbs": r.verbs, "nonResourceURLs": r.non_resource_urls,
                        })).collect::<Vec<_>>(),
                        "incomplete": false,
                    })
                }
                None => json!({"resourceRules": [], "nonResourceRules": [], "incomplete": true}),
            };
            Ok(answer(body, status))
        }
        "tokenreviews" => {
            let token = str_at(&spec, "token");
            if token.is_empty() {
                return Err(invalid(
                    r,
                    &[field("spec.token", "token must be non-empty")],
                ));
            }
            let audiences = spec.get("audiences").cloned().unwrap_or(json!([]));
            let status = match who.authenticator.authenticate_token(token).await {
                Some(u) => {
                    json!({"authenticated": true, "user": user_info_json(&u), "audiences": audiences})
                }
                None => {
                    json!({"authenticated": false, "user": {}, "error": "invalid bearer token"})
                }
            };
            // The token is a secret: it is not echoed back.
            let mut body = body;
            if let Some(s) = body.get_mut("spec").and_then(Value::as_object_mut) {
                s.remove("token");
            }
            Ok(answer(body, status))
        }
        "selfsubjectreviews" => Ok(answer(body, json!({"userInfo": user_info_json(user)}))),
        _ => Err(ApiError::method_not_allowed("POST")),
    }
}

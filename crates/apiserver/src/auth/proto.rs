//! Protobuf request bodies of the review kinds.
//!
//! kubectl's typed clients post `SelfSubjectAccessReview` (`kubectl auth
//! can-i`), `SelfSubjectRulesReview` and `SelfSubjectReview` (`kubectl auth
//! whoami`) as `application/vnd.kubernetes.protobuf`, and the server has no
//! protobuf otherwise (see docs/apiserver.md). These few messages are
//! decoded here into the JSON form the rest of the server reads; the answer
//! is JSON, which those clients accept. The field numbers are those of
//! `k8s.io/api/{authorization,authentication}/v1/generated.proto`.

use serde_json::{json, Map, Value};

use super::reviews::VirtualResource;
use crate::status::ApiError;

/// The protobuf content type.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The 4-byte prefix of every Kubernetes protobuf envelope.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, PartialEq, prost::Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// `runtime.Unknown`, the envelope.
#[derive(Clone, PartialEq, prost::Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResourceAttributes {
    #[prost(string, optional, tag = "1")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "2")]
    verb: Option<String>,
    #[prost(string, optional, tag = "3")]
    group: Option<String>,
    #[prost(string, optional, tag = "4")]
    version: Option<String>,
    #[prost(string, optional, tag = "5")]
    resource: Option<String>,
    #[prost(string, optional, tag = "6")]
    subresource: Option<String>,
    #[prost(string, optional, tag = "7")]
    name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NonResourceAttributes {
    #[prost(string, optional, tag = "1")]
    path: Option<String>,
    #[prost(string, optional, tag = "2")]
    verb: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExtraValue {
    #[prost(string, repeated, tag = "1")]
    items: Vec<String>,
}

/// SubjectAccessReviewSpec; SelfSubjectAccessReviewSpec is its first two
/// fields.
#[derive(Clone, PartialEq, prost::Message)]
struct AccessSpec {
    #[prost(message, optional, tag = "1")]
    resource_attributes: Option<ResourceAttributes>,
    #[prost(message, optional, tag = "2")]
    non_resource_attributes: Option<NonResourceAttributes>,
    #[prost(string, optional, tag = "3")]
    user: Option<String>,
    #[prost(string, repeated, tag = "4")]
    groups: Vec<String>,
    #[prost(btree_map = "string, message", tag = "5")]
    extra: std::collections::BTreeMap<String, ExtraValue>,
    #[prost(string, optional, tag = "6")]
    uid: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RulesSpec {
    #[prost(string, optional, tag = "1")]
    namespace: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TokenSpec {
    #[prost(string, optional, tag = "1")]
    token: Option<String>,
    #[prost(string, repeated, tag = "2")]
    audiences: Vec<String>,
}

// Review objects: metadata (field 1, ignored) and a spec (field 2).
#[derive(Clone, PartialEq, prost::Message)]
struct AccessReview {
    #[prost(message, optional, tag = "2")]
    spec: Option<AccessSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RulesReview {
    #[prost(message, optional, tag = "2")]
    spec: Option<RulesSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TokenReview {
    #[prost(message, optional, tag = "2")]
    spec: Option<TokenSpec>,
}

fn put(m: &mut Map<String, Value>, k: &str, v: Option<String>) {
    if let Some(v) = v {
        m.insert(k.into(), Value::String(v));
    }
}

fn bad(why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("decoding the protobuf body: {why}"))
}

/// The JSON form of a protobuf review body.
pub fn decode_review(r: &VirtualResource, body: &[u8]) -> Result<Value, ApiError> {
    use prost::Message;
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("no k8s protobuf envelope"))?;
    let env = Unknown::decode(rest).map_err(bad)?;
    if env
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(bad("content encodings are not supported"));
    }
    let kind = env
        .type_meta
        .as_ref()
        .and_then(|t| t.kind.clone())
        .unwrap_or_else(|| r.kind.to_string());
    let raw = env.raw.unwrap_or_default();
    let spec = match r.kind {
        "SelfSubjectAccessReview" | "SubjectAccessReview" => {
            let s = AccessReview::decode(raw.as_slice())
                .map_err(bad)?
                .spec
                .unwrap_or_default();
            let mut m = Map::new();
            if let Some(ra) = s.resource_attributes {
                let mut a = Map::new();
                put(&mut a, "namespace", ra.namespace);
                put(&mut a, "verb", ra.verb);
                put(&mut a, "group", ra.group);
                put(&mut a, "version", ra.version);
                put(&mut a, "resource", ra.resource);
                put(&mut a, "subresource", ra.subresource);
                put(&mut a, "name", ra.name);
                m.insert("resourceAttributes".into(), Value::Object(a));
            }
            if let Some(na) = s.non_resource_attributes {
                let mut a = Map::new();
                put(&mut a, "path", na.path);
                put(&mut a, "verb", na.verb);
                m.insert("nonResourceAttributes".into(), Value::Object(a));
            }
            put(&mut m, "user", s.user);
            put(&mut m, "uid", s.uid);
            if !s.groups.is_empty() {
                m.insert("groups".into(), json!(s.groups));
            }
            if !s.extra.is_empty() {
                let extra: Map<String, Value> = s
                    .extra
                    .into_iter()
                    .map(|(k, v)| (k, json!(v.items)))
                    .collect();
                m.insert("extra".into(), Value::Object(extra));
            }
            Value::Object(m)
        }
        "SelfSubjectRulesReview" => {
            let s = RulesReview::decode(raw.as_slice())
                .map_err(bad)?
                .spec
                .unwrap_or_default();
            let mut m = Map::new();
            put(&mut m, "namespace", s.namespace);
            Value::Object(m)
        }
        "TokenReview" => {
            let s = TokenReview::decode(raw.as_slice())
                .map_err(bad)?
                .spec
                .unwrap_or_default();
            let mut m = Map::new();
            put(&mut m, "token", s.token);
            if !s.audiences.is_empty() {
                m.insert("audiences".into(), json!(s.audiences));
            }
            Value::Object(m)
        }
        // SelfSubjectReview has no spec.
        _ => json!({}),
    };
    Ok(json!({
        "apiVersion": format!("{}/{}", r.group, r.version),
        "kind": kind,
        "metadata": {},
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_self_subject_access_review_decodes_as_kubectl_sends_it() {
        let spec = AccessSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some("a".into()),
                verb: Some("create".into()),
                group: Some("sdn.cozystack.io".into()),
                resource: Some("vpcs".into()),
                ..ResourceAttributes::default()
            }),
            ..AccessSpec::default()
        };
        let raw = AccessReview { spec: Some(spec) }.encode_to_vec();
        let env = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("authorization.k8s.io/v1".into()),
                kind: Some("SelfSubjectAccessReview".into()),
            }),
            raw: Some(raw),
            content_encoding: None,
        };
        let mut body = MAGIC.to_vec();
        body.extend(env.encode_to_vec());
        let r = super::super::reviews::REVIEWS[0];
        let v = decode_review(&r, &body).unwrap();
        assert_eq!(
            v["spec"],
            json!({"resourceAttributes": {"namespace": "a", "verb": "create", "group": "sdn.cozystack.io", "resource": "vpcs"}})
        );
        assert_eq!(v["kind"], "SelfSubjectAccessReview");
        assert!(decode_review(&r, b"not protobuf").is_err());
        assert!(decode_review(&r, b"k8s\0\xff\xff\xff").is_err());
    }
}

//! OpenAPI v2 (`/openapi/v2`) and v3 (`/openapi/v3`, per group-version)
//! documents, generated once at startup from the registered kinds. Every
//! kind always gets its schema, list schema and paths, so the documents are
//! complete by construction (an incomplete OpenAPI broke `kubectl apply`
//! for a whole group in the prior system).
//!
//! kubectl reads v3: `explain` takes field descriptions from the schemas,
//! and `apply` checks that each kind's PATCH operation lists the
//! `fieldValidation` parameter (server-side validation) and which patch
//! media types it accepts (strategic merge patch only for core kinds).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::registry::KindEntry;
use crate::schema;

pub mod protobuf;

/// The definition name of a kind: kube's names for Kubernetes groups
/// (`io.k8s.api.core.v1.Pod`), reverse-DNS otherwise
/// (`io.cozystack.sdn.v1alpha1.VPC`).
pub fn definition_name(k: &KindEntry, suffix: &str) -> String {
    let g = k.info.group;
    let prefix = if g.is_empty() {
        "io.k8s.api.core".to_string()
    } else if let Some(first) = g.strip_suffix(".k8s.io") {
        format!("io.k8s.api.{}", first.split('.').next().unwrap_or(first))
    } else {
        g.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{prefix}.{}.{}{suffix}", k.info.version, k.info.kind)
}

fn gvk(k: &KindEntry, kind: &str) -> Value {
    json!({"group": k.info.group, "version": k.info.version, "kind": kind})
}

/// The `group/version` path segment: `api/v1` or `apis/<g>/<v>`.
pub fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn kind_schema(k: &KindEntry) -> Value {
    let mut s = k.schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([gvk(k, k.info.kind)]),
        );
        o.entry("type").or_insert(json!("object"));
    }
    s
}

fn list_schema(k: &KindEntry, item_ref: &str) -> Value {
    json!({
        "description": format!("{}List is a list of {}.", k.info.kind, k.info.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
            "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
            "metadata": {"type": "object", "description": "Standard list metadata.", "properties": {
                "resourceVersion": {"type": "string"}, "continue": {"type": "string"}, "remainingItemCount": {"type": "integer", "format": "int64"}}},
            "items": {"type": "array", "description": format!("List of {}.", k.info.plural), "items": {"$ref": item_ref}},
        },
        "x-kubernetes-group-version-kind": [gvk(k, &format!("{}List", k.info.kind))],
    })
}

/// Patch media types a kind accepts (strategic merge patch: core kinds).
pub fn patch_types(k: &KindEntry) -> Vec<&'static str> {
    let mut v = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    if k.info.group.is_empty() || k.info.group.ends_with(".k8s.io") {
        v.push("application/strategic-merge-patch+json");
    }
    v
}

/// One path's operations, independent of the OpenAPI version; `v3`
/// selects the parameter/body/response encoding.
fn operations(k: &KindEntry, v3: bool, refs: &str, scope: Scope) -> Value {
    let item_ref = format!("{refs}{}", definition_name(k, ""));
    let list_ref = format!("{refs}{}", definition_name(k, "List"));
    let q = |name: &str, desc: &str| {
        if v3 {
            json!({"name": name, "in": "query", "description": desc, "schema": {"type": "string"}, "uniqueItems": true})
        } else {
            json!({"name": name, "in": "query", "description": desc, "type": "string", "uniqueItems": true})
        }
    };
    let p = |name: &str| {
        if v3 {
            json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
        } else {
            json!({"name": name, "in": "path", "required": true, "type": "string"})
        }
    };
    let write_params = vec![
        q("dryRun", "When present, indicates that modifications should not be persisted. Valid value: All."),
        q("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
        q("fieldValidation", "How the server treats unknown fields: Ignore, Warn or Strict."),
    ];
    let read_params = vec![
        q("labelSelector", "A selector to restrict the list of returned objects by their labels."),
        q("fieldSelector", "A selector to restrict the list of returned objects by their fields."),
        q("limit", "Maximum number of responses to return for a list call."),
        q("continue", "The continue option should be set when retrieving more results from the server."),
        q("resourceVersion", "resourceVersion sets a constraint on what resource versions a request may be served from."),
        q("resourceVersionMatch", "resourceVersionMatch determines how resourceVersion is applied to list calls."),
        q("watch", "Watch for changes to the described resources."),
        q("allowWatchBookmarks", "allowWatchBookmarks requests watch events with type BOOKMARK."),
        q("sendInitialEvents", "sendInitialEvents=true may be set together with watch=true."),
        q("timeoutSeconds", "Timeout for the list/watch call."),
    ];
    let resp = |r: &str| {
        if v3 {
            json!({"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": r}}, "application/yaml": {"schema": {"$ref": r}}}},
                   "201": {"description": "Created", "content": {"application/json": {"schema": {"$ref": r}}}}})
        } else {
            json!({"200": {"description": "OK", "schema": {"$ref": r}}, "201": {"description": "Created", "schema": {"$ref": r}}})
        }
    };
    let op = |action: &str, verb: &str, params: Vec<Value>, r: &str, body: Option<Vec<&str>>| {
        let id = format!(
            "{verb}{}{}",
            k.info.kind,
            match scope {
                Scope::Status => "Status",
                _ => "",
            }
        );
        let mut o = json!({
            "operationId": id, "tags": [gv_path(k.info.group, k.info.version)],
            "parameters": params, "responses": resp(r),
            "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk(k, k.info.kind),
        });
        if let Some(types) = body {
            if v3 {
                let content: Map<String, Value> = types
                    .iter()
                    .map(|t| (t.to_string(), json!({"schema": {"$ref": item_ref}})))
                    .collect();
                o["requestBody"] = json!({"required": true, "content": content});
            } else {
                let mut ps = o["parameters"].as_array().cloned().unwrap_or_default();
                ps.push(json!({"name": "body", "in": "body", "required": true, "schema": {"$ref": item_ref}}));
                o["parameters"] = Value::Array(ps);
                o["consumes"] = json!(types);
            }
        }
        o
    };
    let mut ns_params = Vec::new();
    if k.info.namespaced && !matches!(scope, Scope::AllNamespaces) {
        ns_params.push(p("namespace"));
    }
    let with = |mut base: Vec<Value>, extra: &[Value]| {
        base.extend_from_slice(extra);
        base
    };
    match scope {
        Scope::AllNamespaces => json!({"get": op("list", "list", read_params, &list_ref, None)}),
        Scope::Collection => json!({
            "get": op("list", "list", with(ns_params.clone(), &read_params), &list_ref, None),
            "post": op("post", "create", with(ns_params.clone(), &write_params), &item_ref, Some(vec!["application/json", "application/yaml"])),
            "delete": op("deletecollection", "deleteCollection", with(ns_params, &read_params), &list_ref, None),
        }),
        Scope::Item | Scope::Status => {
            let mut base = ns_params;
            base.push(p("name"));
            let (get_verb, put_verb, patch_verb) = match scope {
                Scope::Status => ("read", "replace", "patch"),
                _ => ("read", "replace", "patch"),
            };
            let mut ops = json!({
                "get": op("get", get_verb, base.clone(), &item_ref, None),
                "put": op("put", put_verb, with(base.clone(), &write_params), &item_ref, Some(vec!["application/json", "application/yaml"])),
                "patch": op("patch", patch_verb, with(base.clone(), &write_params), &item_ref, Some(patch_types(k))),
            });
            if matches!(scope, Scope::Item) {
                ops["delete"] = op(
                    "delete",
                    "delete",
                    with(
                        base,
                        &[
                            q("dryRun", "Valid value: All."),
                            q("propagationPolicy", "Orphan, Background or Foreground."),
                        ],
                    ),
                    &item_ref,
                    None,
                );
            }
            ops
        }
    }
}

#[derive(Clone, Copy)]
enum Scope {
    Collection,
    Item,
    Status,
    AllNamespaces,
}

fn paths_for(k: &KindEntry, v3: bool, refs: &str) -> Vec<(String, Value)> {
    let base = format!("/{}", gv_path(k.info.group, k.info.version));
    let coll = if k.info.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", k.info.plural)
    } else {
        format!("{base}/{}", k.info.plural)
    };
    let mut out = vec![
        (coll.clone(), operations(k, v3, refs, Scope::Collection)),
        (
            format!("{coll}/{{name}}"),
            operations(k, v3, refs, Scope::Item),
        ),
    ];
    if k.info.status_subresource {
        out.push((
            format!("{coll}/{{name}}/status"),
            operations(k, v3, refs, Scope::Status),
        ));
    }
    if k.info.namespaced {
        out.push((
            format!("{base}/{}", k.info.plural),
            operations(k, v3, refs, Scope::AllNamespaces),
        ));
    }
    out
}

fn hash_of(v: &Value) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// One group-version's v3 paths and component schemas, while building.
type GvDoc = (Map<String, Value>, Map<String, Value>);

/// The precomputed OpenAPI documents.
#[derive(Debug, Clone)]
pub struct OpenApi {
    pub v2: Arc<Value>,
    /// The same document in protobuf ([`protobuf`]).
    pub v2_protobuf: Arc<Vec<u8>>,
    /// `api/v1` or `apis/<g>/<v>` → document.
    pub v3: Arc<BTreeMap<String, Value>>,
    /// The `/openapi/v3` index.
    pub v3_index: Arc<Value>,
}

impl OpenApi {
    /// Build every document from the registered kinds.
    pub fn build(kinds: &[Arc<KindEntry>], version: &str) -> Self {
        let mut defs = Map::new();
        let mut v2_paths = Map::new();
        let mut v3_docs: BTreeMap<String, GvDoc> = BTreeMap::new();
        for k in kinds {
            let v2_ref = format!("#/definitions/{}", definition_name(k, ""));
            defs.insert(definition_name(k, ""), schema::to_v2(&kind_schema(k)));
            defs.insert(definition_name(k, "List"), list_schema(k, &v2_ref));
            for (p, ops) in paths_for(k, false, "#/definitions/") {
                v2_paths.insert(p, ops);
            }
            let (paths, schemas) = v3_docs
                .entry(gv_path(k.info.group, k.info.version))
                .or_default();
            let v3_ref = format!("#/components/schemas/{}", definition_name(k, ""));
            schemas.insert(definition_name(k, ""), kind_schema(k));
            schemas.insert(definition_name(k, "List"), list_schema(k, &v3_ref));
            for (p, ops) in paths_for(k, true, "#/components/schemas/") {
                paths.insert(p, ops);
            }
        }
        let info = json!({"title": "cozyplane", "version": version});
        let v2 = json!({"swagger": "2.0", "info": info, "paths": v2_paths, "definitions": defs});
        let mut v3 = BTreeMap::new();
        let mut index = Map::new();
        for (gv, (paths, schemas)) in v3_docs {
            let doc = json!({"openapi": "3.0.0", "info": info, "paths": paths, "components": {"schemas": schemas}});
            index.insert(
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", hash_of(&doc))}),
            );
            v3.insert(gv, doc);
        }
        OpenApi {
            v2_protobuf: Arc::new(protobuf::encode_document(&v2)),
            v2: Arc::new(v2),
            v3: Arc::new(v3),
            v3_index: Arc::new(json!({"paths": index})),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_kinds;

    fn entries() -> Vec<Arc<KindEntry>> {
        core_kinds::standalone_kinds()
            .into_iter()
            .map(|info| {
                Arc::new(KindEntry {
                    schema: (info.schema)(),
                    info,
                    hooks: Default::default(),
                })
            })
            .collect()
    }

    #[test]
    fn names() {
        let e = entries();
        let names: Vec<String> = e.iter().map(|k| definition_name(k, "")).collect();
        assert!(names.contains(&"io.k8s.api.core.v1.Pod".to_string()));
        assert!(names.contains(&"io.k8s.api.networking.v1.NetworkPolicy".to_string()));
        assert!(names.contains(&"io.k8s.api.discovery.v1.EndpointSlice".to_string()));
    }

    #[test]
    fn every_kind_has_schema_and_patch_path_with_field_validation() {
        let e = entries();
        let api = OpenApi::build(&e, "v0");
        for k in &e {
            let doc = &api.v3[&gv_path(k.info.group, k.info.version)];
            let schema = &doc["components"]["schemas"][definition_name(k, "")];
            assert_eq!(
                schema["x-kubernetes-group-version-kind"][0]["kind"],
                k.info.kind
            );
            let patch = doc["paths"].as_object().and_then(|ps| {
                ps.values().find(|ops| {
                    ops["patch"]["x-kubernetes-group-version-kind"]["kind"] == k.info.kind
                        && ops["patch"]["x-kubernetes-action"] == "patch"
                })
            });
            let params = patch
                .and_then(|p| p["patch"]["parameters"].as_array().cloned())
                .unwrap_or_default();
            assert!(
                params.iter().any(|p| p["name"] == "fieldValidation"),
                "{}",
                k.info.kind
            );
            assert!(api.v2["definitions"][definition_name(k, "")].is_object());
            assert!(api.v3_index["paths"][gv_path(k.info.group, k.info.version)]
                ["serverRelativeURL"]
                .is_string());
        }
        assert!(!api.v2.to_string().contains("\"nullable\""));
    }
}

//! API discovery: the legacy documents (`APIVersions`, `APIGroupList`,
//! `APIGroup`, `APIResourceList`) and aggregated discovery
//! (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`), which kubectl 1.30+
//! asks for on `/api` and `/apis`. Both are derived from the same registered
//! kinds, so they cannot disagree.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::auth::reviews::VirtualResource;
use crate::registry::KindEntry;

/// Content type of an aggregated discovery response.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];
/// Verbs of a create-only subresource such as `pods/binding`.
const CREATE_VERBS: &[&str] = &["create"];

/// Groups (excluding core) with their versions, in first-registered order,
/// the computed (create-only) resources last.
fn groups(
    kinds: &[Arc<KindEntry>],
    virt: &[VirtualResource],
) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    let gvs = kinds
        .iter()
        .map(|k| (k.info.group, k.info.version))
        .chain(virt.iter().map(|v| (v.group, v.version)))
        .filter(|(g, _)| !g.is_empty());
    for (group, version) in gvs {
        match out.iter_mut().find(|(g, _)| *g == group) {
            Some((_, vs)) => {
                if !vs.contains(&version) {
                    vs.push(version);
                }
            }
            None => out.push((group, vec![version])),
        }
    }
    out
}

/// `/api`.
pub fn api_versions(kinds: &[Arc<KindEntry>], server_address: &str) -> Value {
    let versions: Vec<&str> = if kinds.iter().any(|k| k.info.group.is_empty()) {
        vec!["v1"]
    } else {
        vec![]
    };
    json!({"kind": "APIVersions", "versions": versions,
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn api_group(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(json!({}))})
}

/// `/apis`.
pub fn group_list(kinds: &[Arc<KindEntry>], virt: &[VirtualResource]) -> Value {
    let gs: Vec<Value> = groups(kinds, virt)
        .iter()
        .map(|(g, vs)| api_group(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>`.
pub fn group(kinds: &[Arc<KindEntry>], virt: &[VirtualResource], name: &str) -> Option<Value> {
    groups(kinds, virt)
        .iter()
        .find(|(g, _)| *g == name)
        .map(|(g, vs)| api_group(g, vs))
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(
    kinds: &[Arc<KindEntry>],
    virt: &[VirtualResource],
    group: &str,
    version: &str,
) -> Option<Value> {
    let mut resources = Vec::new();
    for k in kinds
        .iter()
        .filter(|k| k.info.group == group && k.info.version == version)
    {
        let i = &k.info;
        resources.push(json!({
            "name": i.plural, "singularName": i.singular, "namespaced": i.namespaced, "kind": i.kind,
            "verbs": VERBS, "shortNames": i.short_names, "categories": i.categories,
        }));
        if i.status_subresource {
            resources.push(json!({"name": format!("{}/status", i.plural), "singularName": "", "namespaced": i.namespaced, "kind": i.kind, "verbs": STATUS_VERBS}));
        }
        for sub in k.hooks.create_subresources {
            resources.push(json!({"name": format!("{}/{}", i.plural, sub.name), "singularName": "", "namespaced": i.namespaced, "kind": sub.kind, "verbs": CREATE_VERBS}));
        }
        for sub in k.hooks.computed_subresources {
            resources.push(json!({"name": format!("{}/{}", i.plural, sub.name), "singularName": "", "namespaced": i.namespaced,
                                  "group": sub.group, "version": sub.version, "kind": sub.kind, "verbs": CREATE_VERBS}));
        }
    }
    for v in virt
        .iter()
        .filter(|v| v.group == group && v.version == version)
    {
        resources.push(json!({"name": v.plural, "singularName": v.kind.to_lowercase(), "namespaced": false, "kind": v.kind, "verbs": CREATE_VERBS}));
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn aggregated_resource(k: &KindEntry) -> Value {
    let i = &k.info;
    let response_kind = json!({"group": i.group, "version": i.version, "kind": i.kind});
    let mut r = json!({
        "resource": i.plural, "responseKind": response_kind, "scope": if i.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": i.singular, "verbs": VERBS,
    });
    if !i.short_names.is_empty() {
        r["shortNames"] = json!(i.short_names);
    }
    if !i.categories.is_empty() {
        r["categories"] = json!(i.categories);
    }
    let mut subs = Vec::new();
    if i.status_subresource {
        subs.push(
            json!({"subresource": "status", "responseKind": response_kind, "verbs": STATUS_VERBS}),
        );
    }
    for sub in k.hooks.create_subresources {
        subs.push(json!({"subresource": sub.name, "responseKind": {"group": i.group, "version": i.version, "kind": sub.kind}, "verbs": CREATE_VERBS}));
    }
    for sub in k.hooks.computed_subresources {
        subs.push(json!({"subresource": sub.name, "responseKind": {"group": sub.group, "version": sub.version, "kind": sub.kind}, "verbs": CREATE_VERBS}));
    }
    if !subs.is_empty() {
        r["subresources"] = Value::Array(subs);
    }
    r
}

fn aggregated_virtual(v: &VirtualResource) -> Value {
    json!({
        "resource": v.plural, "responseKind": {"group": v.group, "version": v.version, "kind": v.kind},
        "scope": "Cluster", "singularResource": v.kind.to_lowercase(), "verbs": CREATE_VERBS,
    })
}

/// Aggregated discovery for `/api` (`core = true`) or `/apis`.
pub fn aggregated(kinds: &[Arc<KindEntry>], virt: &[VirtualResource], core: bool) -> Value {
    let mut by_group: BTreeMap<&str, Vec<(&str, Vec<Value>)>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let entries = kinds
        .iter()
        .map(|k| (k.info.group, k.info.version, aggregated_resource(k)))
        .chain(
            virt.iter()
                .map(|v| (v.group, v.version, aggregated_virtual(v))),
        );
    for (group, version, resource) in entries.filter(|(g, _, _)| g.is_empty() == core) {
        if !order.contains(&group) {
            order.push(group);
        }
        let versions = by_group.entry(group).or_default();
        match versions.iter_mut().find(|(v, _)| *v == version) {
            Some((_, rs)) => rs.push(resource),
            None => versions.push((version, vec![resource])),
        }
    }
    let items: Vec<Value> = order
        .iter()
        .map(|g| {
            let versions: Vec<Value> = by_group
                .get(g)
                .map(|vs| vs.iter().map(|(v, rs)| json!({"version": v, "resources": rs, "freshness": "Current"})).collect())
                .unwrap_or_default();
            let mut metadata = json!({"creationTimestamp": null});
            if !g.is_empty() {
                metadata["name"] = json!(g);
            }
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

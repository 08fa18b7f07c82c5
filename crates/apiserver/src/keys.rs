//! Storage key layout, as kube-apiserver lays out etcd:
//! `/<group>/<plural>/<namespace>/<name>` for namespaced kinds and
//! `/<group>/<plural>/<name>` for cluster-scoped ones. The core group is
//! spelled `core` so every key has the same number of segments.
//!
//! Prefixes always end in `/`, so listing namespace `a` never sees `ab`.

use cozyplane_api::kinds::KindInfo;

fn group_segment(kind: &KindInfo) -> &'static str {
    if kind.group.is_empty() {
        "core"
    } else {
        kind.group
    }
}

/// The key of one object.
pub fn object_key(kind: &KindInfo, namespace: Option<&str>, name: &str) -> String {
    match (kind.namespaced, namespace) {
        (true, Some(ns)) => format!("/{}/{}/{ns}/{name}", group_segment(kind), kind.plural),
        _ => format!("/{}/{}/{name}", group_segment(kind), kind.plural),
    }
}

/// The prefix of a collection: one namespace, or every object of the kind
/// when `namespace` is `None` (or the kind is cluster-scoped).
pub fn collection_prefix(kind: &KindInfo, namespace: Option<&str>) -> String {
    match (kind.namespaced, namespace) {
        (true, Some(ns)) => format!("/{}/{}/{ns}/", group_segment(kind), kind.plural),
        _ => format!("/{}/{}/", group_segment(kind), kind.plural),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_kinds;

    #[test]
    fn layout_matches_kube() {
        let pods = core_kinds::pods();
        assert_eq!(object_key(&pods, Some("ns1"), "p"), "/core/pods/ns1/p");
        assert_eq!(collection_prefix(&pods, Some("ns1")), "/core/pods/ns1/");
        assert_eq!(collection_prefix(&pods, None), "/core/pods/");
        let nodes = core_kinds::nodes();
        assert_eq!(object_key(&nodes, None, "n1"), "/core/nodes/n1");
        assert_eq!(object_key(&nodes, Some("ignored"), "n1"), "/core/nodes/n1");
        let np = core_kinds::network_policies();
        assert_eq!(
            object_key(&np, Some("a"), "x"),
            "/networking.k8s.io/networkpolicies/a/x"
        );
    }
}

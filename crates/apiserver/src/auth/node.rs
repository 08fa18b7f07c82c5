//! Node restriction: what RBAC cannot narrow for per-node components.
//!
//! A node's agent and kubelet must read objects of every node (the overlay
//! needs every node's endpoint; a kubelet lists pods), and RBAC cannot
//! narrow a create, list or watch by name. So a role alone would let one
//! node's agent delete or rewrite another node's address claims, or one
//! kubelet delete every pod. kube-apiserver closes that gap with the Node
//! authorizer and the NodeRestriction admission plugin; this is the same
//! gap closed the same way, as an admission step after RBAC allowed the
//! request:
//!
//! | identity | may write only |
//! |---|---|
//! | `cozyplane:agent:<node>` in group `cozyplane:agents` | FabricIPs and Ports whose `spec.node` is `<node>` (before and after the write); only the `vpc-ip`/`vpc-mac` annotations of pods with `spec.nodeName` `<node>`; its own Node |
//! | `system:node:<node>` in group `system:nodes` (kube's kubelet identity) | pods with `spec.nodeName` `<node>` (no creates: kube's mirror pods are not served); its own Node |
//!
//! Reads are narrowed too where RBAC cannot: both list and watch pods only
//! with the field selector `spec.nodeName=<node>` ([`check_read`]).
//!
//! Both the name prefix and the group are required, as in kube: a user
//! called `system:node:x` without the group is an ordinary user that RBAC
//! alone governs. An object that cannot be decoded cannot be shown to be
//! the node's, so a restricted identity cannot delete it.

use serde_json::Value;

use super::bootstrap::AGENTS_GROUP;
use super::UserInfo;

/// kube's group of kubelets.
pub const NODES_GROUP: &str = "system:nodes";
/// kube's kubelet user prefix (`system:node:<name>`).
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The agent user prefix (`cozyplane:agent:<name>`).
pub const AGENT_USER_PREFIX: &str = "cozyplane:agent:";

/// A per-node identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIdentity {
    /// The cozyplane agent of the node.
    Agent(String),
    /// The kubelet of the node.
    Kubelet(String),
}

impl NodeIdentity {
    /// The node identity of `user`, if it has one.
    pub fn of(user: &UserInfo) -> Option<Self> {
        let named = |prefix: &str, group: &str| {
            user.name
                .strip_prefix(prefix)
                .filter(|n| !n.is_empty() && user.in_group(group))
                .map(str::to_string)
        };
        named(AGENT_USER_PREFIX, AGENTS_GROUP)
            .map(NodeIdentity::Agent)
            .or_else(|| named(NODE_USER_PREFIX, NODES_GROUP).map(NodeIdentity::Kubelet))
    }

    fn node(&self) -> &str {
        match self {
            NodeIdentity::Agent(n) | NodeIdentity::Kubelet(n) => n,
        }
    }
}

/// Whether `id` may list or watch (`group`, `plural`) with `field_selector`.
/// Pods are listed and watched by a node only with the requirement
/// `spec.nodeName=<node>` (kube's node authorizer does the same with
/// `AuthorizeNodeWithSelectors`): an agent or kubelet learns nothing of the
/// pods (names, labels, annotations of other tenants) of other nodes.
/// Other requirements may be added; they only narrow the result.
pub fn check_read(
    id: &NodeIdentity,
    group: &str,
    plural: &str,
    field_selector: Option<&str>,
) -> Result<(), String> {
    if (group, plural) != ("", "pods") {
        return Ok(());
    }
    let node = id.node();
    let own = field_selector.unwrap_or("").split(',').any(|req| {
        let req = req.trim();
        let value = req
            .strip_prefix("spec.nodeName==")
            .or_else(|| req.strip_prefix("spec.nodeName="));
        value == Some(node)
    });
    if own {
        Ok(())
    } else {
        Err(format!(
            "node {node:?} may list and watch pods only with the field selector spec.nodeName={node}"
        ))
    }
}

/// Whether `id` may write an object of (`group`, `plural`): `new` is what
/// would be stored (`None` for a delete), `old` what is stored (`None` for
/// a create; for a delete of an undecodable object both are `None`).
/// `Err` is the reason for the 403.
pub fn check(
    id: &NodeIdentity,
    group: &str,
    plural: &str,
    new: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), String> {
    let node = id.node();
    let field = |v: &Value, ptr: &str| v.pointer(ptr).and_then(Value::as_str).map(str::to_string);
    let all_on = |ptr: &str, what: &str| -> Result<(), String> {
        if new.is_none() && old.is_none() {
            return Err(format!(
                "node {node:?} may only write {what} it can be shown to own"
            ));
        }
        for v in new.into_iter().chain(old) {
            let on = field(v, ptr).unwrap_or_default();
            if on != node {
                return Err(format!(
                    "node {node:?} may only write {what} of its own node, not of {on:?}"
                ));
            }
        }
        Ok(())
    };
    match (id, group, plural) {
        (_, "", "nodes") => all_on("/metadata/name", "the Node"),
        (NodeIdentity::Agent(_), cozyplane_api::labels::LOCAL_GROUP, "fabricips") => {
            all_on("/spec/node", "FabricIPs")
        }
        (NodeIdentity::Agent(_), cozyplane_api::labels::SDN_GROUP, "ports") => {
            all_on("/spec/node", "Ports")
        }
        (NodeIdentity::Agent(_), "", "pods") => {
            let (Some(new), Some(old)) = (new, old) else {
                return Err(format!("node {node:?} may not create or delete pods"));
            };
            all_on("/spec/nodeName", "pods")?;
            if without_vpc_annotations(new) != without_vpc_annotations(old) {
                return Err(format!(
                    "node {node:?} may only change a pod's {} and {} annotations",
                    cozyplane_api::labels::ANNOTATION_VPC_IP,
                    cozyplane_api::labels::ANNOTATION_VPC_MAC
                ));
            }
            Ok(())
        }
        (NodeIdentity::Kubelet(_), "", "pods") => {
            if old.is_none() && new.is_some() {
                return Err(format!("node {node:?} may not create pods"));
            }
            all_on("/spec/nodeName", "pods")
        }
        _ => Ok(()),
    }
}

/// A pod without what an agent may write (its VPC self-discovery
/// annotations) and what every write changes (resourceVersion,
/// managedFields, generation).
fn without_vpc_annotations(pod: &Value) -> Value {
    let mut pod = pod.clone();
    if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in ["resourceVersion", "managedFields", "generation"] {
            meta.remove(f);
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(cozyplane_api::labels::ANNOTATION_VPC_IP);
            a.remove(cozyplane_api::labels::ANNOTATION_VPC_MAC);
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nodes_list_and_watch_only_their_own_pods() {
        for id in [
            NodeIdentity::Agent("n1".into()),
            NodeIdentity::Kubelet("n1".into()),
        ] {
            for own in [
                "spec.nodeName=n1",
                "spec.nodeName==n1",
                "metadata.namespace=app,spec.nodeName=n1",
            ] {
                assert!(check_read(&id, "", "pods", Some(own)).is_ok(), "{own}");
            }
            for other in [
                None,
                Some(""),
                Some("spec.nodeName=n2"),
                Some("spec.nodeName!=n1"),
                Some("spec.nodeName=n10"),
                Some("spec.nodeName=n"),
                Some("metadata.namespace=app"),
            ] {
                let err = check_read(&id, "", "pods", other).unwrap_err();
                assert!(err.contains("spec.nodeName=n1"), "{other:?}: {err}");
            }
            // Other kinds are RBAC's alone.
            assert!(check_read(&id, "", "nodes", None).is_ok());
            assert!(check_read(&id, "sdn.cozystack.io", "ports", None).is_ok());
        }
    }

    #[test]
    fn identities_need_both_the_name_and_the_group() {
        let agent = UserInfo::new("cozyplane:agent:n1", &[AGENTS_GROUP]);
        assert_eq!(
            NodeIdentity::of(&agent),
            Some(NodeIdentity::Agent("n1".into()))
        );
        let kubelet = UserInfo::new("system:node:n2", &[NODES_GROUP]);
        assert_eq!(
            NodeIdentity::of(&kubelet),
            Some(NodeIdentity::Kubelet("n2".into()))
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("system:node:n2", &[])),
            None
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("cozyplane:agent:", &[AGENTS_GROUP])),
            None
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("alice", &[AGENTS_GROUP, NODES_GROUP])),
            None
        );
    }

    #[test]
    fn agents_write_only_their_own_claims_and_node() {
        let a = NodeIdentity::Agent("n1".into());
        let fip = |node: &str| json!({"metadata": {"name": "x"}, "spec": {"node": node}});
        let sdn = cozyplane_api::labels::LOCAL_GROUP;
        assert!(check(&a, sdn, "fabricips", Some(&fip("n1")), None).is_ok());
        assert!(check(&a, sdn, "fabricips", None, Some(&fip("n1"))).is_ok());
        assert!(check(&a, sdn, "fabricips", Some(&fip("n2")), None).is_err());
        assert!(check(&a, sdn, "fabricips", None, Some(&fip("n2"))).is_err());
        // Moving another node's claim to itself, or its own away.
        assert!(check(&a, sdn, "fabricips", Some(&fip("n1")), Some(&fip("n2"))).is_err());
        assert!(check(&a, sdn, "fabricips", Some(&fip("n2")), Some(&fip("n1"))).is_err());
        assert!(check(&a, sdn, "fabricips", Some(&json!({"spec": {}})), None).is_err());
        assert!(check(&a, sdn, "fabricips", None, None).is_err());
        let node = |n: &str| json!({"metadata": {"name": n}});
        assert!(check(&a, "", "nodes", Some(&node("n1")), Some(&node("n1"))).is_ok());
        assert!(check(&a, "", "nodes", Some(&node("n2")), Some(&node("n2"))).is_err());
        // Other kinds are RBAC's alone.
        assert!(check(
            &a,
            cozyplane_api::labels::SDN_GROUP,
            "vpcs",
            Some(&node("x")),
            None
        )
        .is_ok());
        // Pods: on its node, only the VPC self-discovery annotations.
        let pod = |n: &str, ann: serde_json::Value| {
            json!({"metadata": {"name": "p", "resourceVersion": "1", "annotations": ann},
                   "spec": {"nodeName": n}})
        };
        let stamped = json!({"sdn.cozystack.io/vpc": "t1/net",
                             "sdn.cozystack.io/vpc-ip": "10.0.0.2",
                             "sdn.cozystack.io/vpc-mac": "0a:58:0a:00:00:02"});
        let plain = json!({"sdn.cozystack.io/vpc": "t1/net"});
        let on = |n: &str, new: serde_json::Value, old: serde_json::Value| {
            check(&a, "", "pods", Some(&pod(n, new)), Some(&pod(n, old)))
        };
        assert!(on("n1", stamped.clone(), plain.clone()).is_ok());
        assert!(on("n2", stamped.clone(), plain.clone()).is_err());
        // any other change: the VPC it asks for, a label, the spec
        let moved = json!({"sdn.cozystack.io/vpc": "t2/net",
                           "sdn.cozystack.io/vpc-ip": "10.0.0.2"});
        assert!(on("n1", moved, plain.clone()).is_err());
        let mut relabelled = pod("n1", stamped.clone());
        relabelled["metadata"]["labels"] = json!({"role": "web"});
        assert!(check(
            &a,
            "",
            "pods",
            Some(&relabelled),
            Some(&pod("n1", plain.clone()))
        )
        .is_err());
        assert!(check(&a, "", "pods", Some(&pod("n1", plain.clone())), None).is_err());
        assert!(check(&a, "", "pods", None, Some(&pod("n1", plain))).is_err());
        // Ports: only its own node's
        let port = |n: &str| json!({"metadata": {"name": "v100.10.0.0.2"}, "spec": {"node": n}});
        let sdn = cozyplane_api::labels::SDN_GROUP;
        assert!(check(&a, sdn, "ports", Some(&port("n1")), None).is_ok());
        assert!(check(&a, sdn, "ports", None, Some(&port("n1"))).is_ok());
        assert!(check(&a, sdn, "ports", Some(&port("n2")), None).is_err());
        assert!(check(&a, sdn, "ports", None, Some(&port("n2"))).is_err());
    }

    #[test]
    fn kubelets_write_only_their_own_pods_and_node() {
        let k = NodeIdentity::Kubelet("n1".into());
        let pod = |n: &str| json!({"metadata": {"name": "p"}, "spec": {"nodeName": n}});
        assert!(check(&k, "", "pods", Some(&pod("n1")), Some(&pod("n1"))).is_ok());
        assert!(check(&k, "", "pods", None, Some(&pod("n1"))).is_ok());
        assert!(check(&k, "", "pods", None, Some(&pod("n2"))).is_err());
        assert!(check(&k, "", "pods", Some(&pod("n2")), Some(&pod("n2"))).is_err());
        assert!(check(&k, "", "pods", Some(&pod("n1")), None).is_err());
        assert!(check(
            &k,
            "",
            "nodes",
            None,
            Some(&json!({"metadata": {"name": "n2"}}))
        )
        .is_err());
        // FabricIPs are not the kubelet's to narrow (RBAC grants it none).
        let fip = json!({"spec": {"node": "n2"}});
        assert!(check(
            &k,
            cozyplane_api::labels::LOCAL_GROUP,
            "fabricips",
            None,
            Some(&fip)
        )
        .is_ok());
    }
}

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

/// The user extra kube-apiserver puts in a bound ServiceAccount token's
/// identity: the node the token's pod runs on (Kubernetes >= 1.30).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

impl NodeIdentity {
    /// The node identity of `user`, if it has one. `agent_accounts` are the
    /// agents' ServiceAccount users (`system:serviceaccount:<ns>:<name>`,
    /// `--agent-service-account`): behind kube-apiserver an agent is its
    /// DaemonSet's ServiceAccount, and its node is the one its bound token
    /// names ([`NODE_NAME_EXTRA`], forwarded as a front-proxy extra). Such a
    /// user without that extra is an agent of no node: it may write nothing
    /// node-scoped.
    pub fn of(user: &UserInfo, agent_accounts: &[String]) -> Option<Self> {
        if agent_accounts.contains(&user.name) {
            let node = match user.extra.get(NODE_NAME_EXTRA).map(Vec::as_slice) {
                Some([n]) => n.clone(),
                _ => String::new(),
            };
            return Some(NodeIdentity::Agent(node));
        }
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
    if node.is_empty() {
        return Err(NO_NODE.to_string());
    }
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
    let node_scoped = matches!(
        (group, plural),
        ("", "nodes" | "pods")
            | (cozyplane_api::labels::LOCAL_GROUP, "fabricips")
            | (cozyplane_api::labels::SDN_GROUP, "ports")
    );
    if node.is_empty() && node_scoped {
        return Err(NO_NODE.to_string());
    }
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

const NO_NODE: &str = "the agent's identity names no node (a bound ServiceAccount token, Kubernetes >= 1.30, carries it)";

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
            NodeIdentity::of(&agent, &[]),
            Some(NodeIdentity::Agent("n1".into()))
        );
        let kubelet = UserInfo::new("system:node:n2", &[NODES_GROUP]);
        assert_eq!(
            NodeIdentity::of(&kubelet, &[]),
            Some(NodeIdentity::Kubelet("n2".into()))
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("system:node:n2", &[]), &[]),
            None
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("cozyplane:agent:", &[AGENTS_GROUP]), &[]),
            None
        );
        assert_eq!(
            NodeIdentity::of(&UserInfo::new("alice", &[AGENTS_GROUP, NODES_GROUP]), &[]),
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

    #[test]
    fn an_agent_service_account_is_the_node_its_token_names() {
        let sa = "system:serviceaccount:cozy-cozyplane:cozyplane-agent".to_string();
        let accounts = [sa.clone()];
        let mut user = UserInfo::new(sa.as_str(), &["system:serviceaccounts"]);
        // without the node extra: an agent of no node, which writes nothing node-scoped
        let none = NodeIdentity::of(&user, &accounts).unwrap();
        let port = json!({"spec": {"node": ""}});
        let err = check(&none, "sdn.cozystack.io", "ports", Some(&port), None).unwrap_err();
        assert!(err.contains("names no node"), "{err}");
        assert!(check_read(&none, "", "pods", Some("spec.nodeName=")).is_err());
        // with it: that node's agent
        user.extra.insert(NODE_NAME_EXTRA.into(), vec!["n1".into()]);
        let id = NodeIdentity::of(&user, &accounts).unwrap();
        assert_eq!(id, NodeIdentity::Agent("n1".into()));
        let mine = json!({"spec": {"node": "n1"}});
        let theirs = json!({"spec": {"node": "n2"}});
        assert!(check(&id, "sdn.cozystack.io", "ports", Some(&mine), None).is_ok());
        assert!(check(&id, "sdn.cozystack.io", "ports", None, Some(&theirs)).is_err());
        // two node names: no node
        user.extra
            .insert(NODE_NAME_EXTRA.into(), vec!["n1".into(), "n2".into()]);
        assert_eq!(
            NodeIdentity::of(&user, &accounts),
            Some(NodeIdentity::Agent(String::new()))
        );
        // another ServiceAccount (the controller's) with a node extra is no node identity
        let mut ctl = UserInfo::new(
            "system:serviceaccount:cozy-cozyplane:cozyplane-controller",
            &[],
        );
        ctl.extra.insert(NODE_NAME_EXTRA.into(), vec!["n1".into()]);
        assert_eq!(NodeIdentity::of(&ctl, &accounts), None);
    }
}

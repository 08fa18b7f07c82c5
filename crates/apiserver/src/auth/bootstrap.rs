//! The default RBAC policy standalone mode creates at start, as
//! kube-apiserver's bootstrap policy does: `cluster-admin` for
//! `system:masters`, discovery and health for everyone authenticated,
//! health for everyone, the self-review kinds, and the user-facing roles
//! `admin`, `edit` and `view` aggregated from `system:aggregate-to-*`
//! roles, which cozyplane extends with its tenant kinds
//! (`cozyplane:aggregate-to-*`).
//!
//! Objects are created when missing and never overwritten, so an operator
//! may change them (kube reconciles additively; we only fill gaps).
//!
//! The cozyplane components' own roles are here too, because every
//! deployment needs them (the lab, and the Helm chart binds its
//! ServiceAccounts to the same roles): `cozyplane:agent` (bound to the group
//! `cozyplane:agents`), `cozyplane:controller` (bound to
//! `cozyplane:controllers`) and `cozyplane:controller:leader-election`,
//! which is bound by a RoleBinding in the Lease's namespace (namespaced, so
//! not here). Each grants exactly the requests the component's code makes.
//!
//! Not granted to `admin` yet: Roles and RoleBindings. kube lets a
//! namespace admin write them because it checks escalation (a binding may
//! grant only what its author holds); until that check exists here, only
//! `cluster-admin` can write RBAC.

use serde_json::{json, Value};

use super::rbac::GROUP;

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

fn meta(name: &str, labels: Value) -> Value {
    let mut m = json!({"name": name, "annotations": {AUTOUPDATE: "true"},
                       "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}});
    if let Some(extra) = labels.as_object() {
        for (k, v) in extra {
            m["labels"][k] = v.clone();
        }
    }
    m
}

fn cluster_role(name: &str, labels: Value, rules: Value) -> (&'static str, Value) {
    (
        "clusterroles",
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "ClusterRole", "metadata": meta(name, labels), "rules": rules}),
    )
}

fn aggregated(name: &str, labels: Value, selects: &str) -> (&'static str, Value) {
    (
        "clusterroles",
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "ClusterRole", "metadata": meta(name, labels),
               "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {selects: "true"}}]}, "rules": []}),
    )
}

fn cluster_binding(name: &str, role: &str, groups: &[&str]) -> (&'static str, Value) {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
        .collect();
    (
        "clusterrolebindings",
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "ClusterRoleBinding", "metadata": meta(name, json!({})),
               "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role}, "subjects": subjects}),
    )
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

/// The cozyplane kinds a tenant works with in its namespaces.
pub const TENANT_KINDS: &[&str] = &[
    "vpcs",
    "vpcbindings",
    "vpcpeerings",
    "vpcgateways",
    "securitygroups",
    "floatingips",
];

/// The bootstrap Roles and RoleBindings, as (plural, namespace, object).
pub fn namespaced_objects() -> Vec<(&'static str, &'static str, Value)> {
    vec![(
        "roles",
        "kube-system",
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Role",
               "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system",
                            "annotations": {AUTOUPDATE: "true"}, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": READ,
                          "resourceNames": ["extension-apiserver-authentication"]}]}),
    )]
}

/// The group the agents' identities are in (`cozyplane:agent:<node>`).
pub const AGENTS_GROUP: &str = "cozyplane:agents";
/// The group the controllers' identities are in.
pub const CONTROLLERS_GROUP: &str = "cozyplane:controllers";
/// The agent's role: read every Node (the overlay needs each node's
/// endpoint: no resourceNames can narrow a list or watch) and claim
/// addresses (FabricIPs and VPC Ports: create, read, and delete its own
/// with a UID precondition); read VPCs and VPCBindings (the attach check)
/// and read a pod to learn the VPC it asks for. Node restriction
/// (`auth/node.rs`) narrows the writes to its own node's claims and to the
/// two VPC self-discovery annotations of its own node's pods. Services and
/// EndpointSlices are read (list, watch) for the socket-level load balancer.
pub const AGENT_ROLE: &str = "cozyplane:agent";
/// The controller's role: read Pods (cache and the live confirmation read)
/// and collect orphaned FabricIPs (list, watch, delete); give VPCs their VNIs
/// (VNIClaims create/delete, VPC finalizers by patch, VPC status), see what
/// uses a VPC (Ports, VPCBindings), report peerings (VPCPeering status), and
/// sever a deleted binding's pods (VPCBinding finalizer, Port delete).
pub const CONTROLLER_ROLE: &str = "cozyplane:controller";
/// The controller's leader election, bound per namespace (RoleBinding):
/// create a Lease (create cannot be narrowed by name), read and renew only
/// the Lease named `cozyplane-controller`.
pub const CONTROLLER_ELECTION_ROLE: &str = "cozyplane:controller:leader-election";
/// The Lease the controller elects on (its `--lease-name` default).
pub const CONTROLLER_LEASE: &str = "cozyplane-controller";

/// The bootstrap objects, as (plural, object), cluster-scoped.
pub fn objects() -> Vec<(&'static str, Value)> {
    let agg =
        |role: &str| json!({format!("rbac.authorization.k8s.io/aggregate-to-{role}"): "true"});
    let sdn = cozyplane_api::labels::SDN_GROUP;
    let local = cozyplane_api::labels::LOCAL_GROUP;
    vec![
        cluster_role(
            "cluster-admin",
            json!({}),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                   {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        ),
        cluster_role(
            "system:discovery",
            json!({}),
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                                        "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                    "verbs": ["get"]}]),
        ),
        cluster_role(
            "system:public-info-viewer",
            json!({}),
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        cluster_role(
            "system:basic-user",
            json!({}),
            json!([{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                   {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
        ),
        cluster_role(
            "system:auth-delegator",
            json!({}),
            json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                   {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]),
        ),
        aggregated(
            "admin",
            json!({}),
            "rbac.authorization.k8s.io/aggregate-to-admin",
        ),
        aggregated(
            "edit",
            agg("admin"),
            "rbac.authorization.k8s.io/aggregate-to-edit",
        ),
        aggregated(
            "view",
            agg("edit"),
            "rbac.authorization.k8s.io/aggregate-to-view",
        ),
        // Roles and bindings, as kube's admin: safe to hand a tenant
        // because a write can grant only what the writer holds
        // (`escalation.rs`).
        cluster_role(
            "system:aggregate-to-admin",
            agg("admin"),
            json!([{"apiGroups": [GROUP], "resources": ["roles", "rolebindings"], "verbs": READ.iter().chain(WRITE).collect::<Vec<_>>()}]),
        ),
        cluster_role(
            "system:aggregate-to-view",
            agg("view"),
            json!([{"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "services", "services/status", "namespaces", "namespaces/status", "resourcequotas", "resourcequotas/status", "configmaps", "serviceaccounts", "events"], "verbs": READ},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": READ}]),
        ),
        cluster_role(
            "system:aggregate-to-edit",
            agg("edit"),
            json!([{"apiGroups": [""], "resources": ["pods", "services", "configmaps", "serviceaccounts"], "verbs": WRITE},
                   {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": WRITE}]),
        ),
        cluster_role(
            "cozyplane:aggregate-to-view",
            agg("view"),
            json!([{"apiGroups": [sdn], "resources": TENANT_KINDS.iter().flat_map(|k| [k.to_string(), format!("{k}/status")]).collect::<Vec<_>>(), "verbs": READ}]),
        ),
        cluster_role(
            "cozyplane:aggregate-to-edit",
            agg("edit"),
            json!([{"apiGroups": [sdn], "resources": TENANT_KINDS, "verbs": WRITE},
                   {"apiGroups": [sdn], "resources": ["vpcs"], "verbs": ["export", "peer"]}]),
        ),
        cluster_role(
            AGENT_ROLE,
            json!({}),
            json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": READ},
                   {"apiGroups": [local], "resources": ["fabricips"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                   {"apiGroups": [sdn], "resources": ["ports"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
                   {"apiGroups": [sdn], "resources": ["vpcs", "vpcbindings", "vpcpeerings", "securitygroups", "hostfirewalls"], "verbs": READ},
                   // NetworkPolicy (docs/policy.md): the policies and the
                   // namespaces' labels their selectors read
                   {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": READ},
                   {"apiGroups": [""], "resources": ["namespaces"], "verbs": READ},
                   // the Cilium policy subset Cozystack writes (same file)
                   {"apiGroups": ["cilium.io"], "resources": ["ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies"], "verbs": READ},
                   // Services without kube-proxy (docs/services.md): read
                   // only, and Events about a Service it cannot program
                   // (as kube-proxy's system:node-proxier records events).
                   {"apiGroups": [""], "resources": ["services"], "verbs": READ},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "create", "patch"]}]),
        ),
        cluster_role(
            CONTROLLER_ROLE,
            json!({}),
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": READ},
                   {"apiGroups": [local], "resources": ["fabricips"], "verbs": ["list", "watch", "delete"]},
                   {"apiGroups": [sdn], "resources": ["vpcs"], "verbs": ["get", "list", "watch", "patch"]},
                   {"apiGroups": [sdn], "resources": ["vpcs/status"], "verbs": ["get", "update"]},
                   {"apiGroups": [sdn], "resources": ["vniclaims"], "verbs": ["get", "list", "watch", "create", "delete"]},
                   {"apiGroups": [sdn], "resources": ["ports", "vpcbindings", "vpcpeerings"], "verbs": ["list", "watch"]},
                   {"apiGroups": [sdn], "resources": ["ports"], "verbs": ["delete"]},
                   {"apiGroups": [sdn], "resources": ["vpcbindings"], "verbs": ["get", "patch"]},
                   {"apiGroups": [sdn], "resources": ["vpcpeerings/status"], "verbs": ["update"]}]),
        ),
        cluster_role(
            CONTROLLER_ELECTION_ROLE,
            json!({}),
            json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                   {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [CONTROLLER_LEASE], "verbs": ["get", "update"]}]),
        ),
        cluster_binding("cluster-admin", "cluster-admin", &["system:masters"]),
        cluster_binding(AGENT_ROLE, AGENT_ROLE, &[AGENTS_GROUP]),
        cluster_binding(CONTROLLER_ROLE, CONTROLLER_ROLE, &[CONTROLLERS_GROUP]),
        cluster_binding(
            "system:discovery",
            "system:discovery",
            &["system:authenticated"],
        ),
        cluster_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
        cluster_binding(
            "system:basic-user",
            "system:basic-user",
            &["system:authenticated"],
        ),
    ]
}

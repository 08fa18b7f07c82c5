//! The core Kubernetes kinds served in standalone mode, described as
//! [`KindInfo`] values like any other kind. Schemas come from k8s-openapi's
//! schemars implementation (the upstream OpenAPI, descriptions included),
//! inlined into self-contained OpenAPI v3 schemas.
//!
//! Standalone mode stores these objects and serves the API conventions for
//! them; it runs none of their controllers (no scheduler, no namespace
//! controller: deleting a namespace leaves its objects): it exists so the
//! agent, controller, kpr and the lab can run on one machine without a
//! cluster. Two admission rules of kube-apiserver do apply, in the
//! registry's create path: creates into a namespace that does not exist or
//! is being deleted are refused, and ResourceQuota `count/…` limits are
//! enforced ([`crate::quota`]).

use cozyplane_api::kinds::FieldErrorType;
use cozyplane_api::kinds::{FieldError, KindInfo, PrinterColumn};
use k8s_openapi::api::{coordination, core, discovery, networking, rbac};
use serde_json::Value;

use crate::hooks::KindHooks;
use crate::schema::inline_refs;

fn schema_of<T: schemars::JsonSchema>() -> Value {
    let root = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    inline_refs(&root.to_value())
}

fn no_errors(_: &Value) -> Vec<FieldError> {
    Vec::new()
}

fn no_update_errors(_: &Value, _: &Value) -> Vec<FieldError> {
    Vec::new()
}

const fn col(
    name: &'static str,
    type_: &'static str,
    json_path: &'static str,
    description: &'static str,
    priority: i32,
) -> PrinterColumn {
    PrinterColumn {
        name,
        type_,
        format: "",
        json_path,
        description,
        priority,
    }
}

#[allow(clippy::too_many_arguments)]
fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    status_subresource: bool,
    schema: fn() -> Value,
    printer_columns: &'static [PrinterColumn],
    field_selectors: &'static [&'static str],
) -> KindInfo {
    KindInfo {
        group,
        version,
        kind,
        plural,
        singular,
        short_names,
        categories: if namespaced { &["all"] } else { &[] },
        namespaced,
        status_subresource,
        schema,
        printer_columns,
        field_selectors,
        validate_create: no_errors,
        validate_update: no_update_errors,
    }
}

/// core/v1 Namespace.
pub fn namespaces() -> KindInfo {
    const COLS: &[PrinterColumn] = &[col(
        "Status",
        "string",
        ".status.phase",
        "The namespace phase.",
        0,
    )];
    let mut k = kind(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        &["ns"],
        false,
        true,
        schema_of::<core::v1::Namespace>,
        COLS,
        &["status.phase"],
    );
    k.categories = &[];
    k
}

/// core/v1 Node.
pub fn nodes() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col(
            "Version",
            "string",
            ".status.nodeInfo.kubeletVersion",
            "Kubelet version.",
            0,
        ),
        col(
            "Internal-IP",
            "string",
            ".status.addresses[0].address",
            "First node address.",
            1,
        ),
        col("Pod-CIDR", "string", ".spec.podCIDR", "Pod CIDR.", 1),
    ];
    kind(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        &["no"],
        false,
        true,
        schema_of::<core::v1::Node>,
        COLS,
        &["spec.unschedulable"],
    )
}

/// core/v1 Pod.
pub fn pods() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col("Status", "string", ".status.phase", "The pod phase.", 0),
        col("IP", "string", ".status.podIP", "The pod IP.", 1),
        col(
            "Node",
            "string",
            ".spec.nodeName",
            "The node the pod runs on.",
            1,
        ),
    ];
    kind(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        &["po"],
        true,
        true,
        schema_of::<core::v1::Pod>,
        COLS,
        &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    )
}

/// core/v1 Service.
pub fn services() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col("Type", "string", ".spec.type", "Service type.", 0),
        col("Cluster-IP", "string", ".spec.clusterIP", "Cluster IP.", 0),
        col("Selector", "string", ".spec.selector", "Pod selector.", 1),
    ];
    let mut k = kind(
        "",
        "v1",
        "Service",
        "services",
        "service",
        &["svc"],
        true,
        true,
        schema_of::<core::v1::Service>,
        COLS,
        &["spec.clusterIP", "spec.type"],
    );
    k.validate_create = crate::services::validate::validate_service;
    k.validate_update = crate::services::validate::validate_service_update;
    k
}

/// networking.k8s.io/v1 IPAddress: one per allocated cluster IP, named by
/// the IP, naming its Service in `spec.parentRef` (kube 1.33's allocator;
/// see [`crate::services`]).
pub fn ip_addresses() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col(
            "ParentRef",
            "string",
            ".spec.parentRef.name",
            "The object the IP is allocated to.",
            0,
        ),
        col(
            "Namespace",
            "string",
            ".spec.parentRef.namespace",
            "The namespace of that object.",
            1,
        ),
    ];
    let mut k = kind(
        "networking.k8s.io",
        "v1",
        "IPAddress",
        "ipaddresses",
        "ipaddress",
        &["ip"],
        false,
        false,
        schema_of::<networking::v1::IPAddress>,
        COLS,
        &[],
    );
    k.validate_create = crate::services::validate::validate_ip_address;
    k.validate_update = crate::services::validate::validate_ip_address_update;
    k
}

/// networking.k8s.io/v1 ServiceCIDR: only `kubernetes`, the ranges of
/// `--service-cluster-ip-range`, written by the server at start.
pub fn service_cidrs() -> KindInfo {
    const COLS: &[PrinterColumn] = &[col("CIDRs", "string", ".spec.cidrs", "The ranges.", 0)];
    let mut k = kind(
        "networking.k8s.io",
        "v1",
        "ServiceCIDR",
        "servicecidrs",
        "servicecidr",
        &[],
        false,
        false,
        schema_of::<networking::v1::ServiceCIDR>,
        COLS,
        &[],
    );
    k.categories = &[];
    k.validate_create = crate::services::validate::validate_service_cidr;
    k.validate_update = crate::services::validate::validate_service_cidr_update;
    k
}

/// discovery.k8s.io/v1 EndpointSlice.
pub fn endpoint_slices() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col(
            "AddressType",
            "string",
            ".addressType",
            "Address family.",
            0,
        ),
        col("Ports", "string", ".ports[*].port", "Ports.", 0),
    ];
    kind(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        &[],
        true,
        false,
        schema_of::<discovery::v1::EndpointSlice>,
        COLS,
        &["addressType"],
    )
}

/// networking.k8s.io/v1 NetworkPolicy.
pub fn network_policies() -> KindInfo {
    const COLS: &[PrinterColumn] = &[col(
        "Pod-Selector",
        "string",
        ".spec.podSelector.matchLabels",
        "Selected pods.",
        0,
    )];
    kind(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        &["netpol"],
        true,
        false,
        schema_of::<networking::v1::NetworkPolicy>,
        COLS,
        &[],
    )
}

/// The schema of a `cilium.io/v2` policy kind: metadata as any object's,
/// the rules kept as written (the agent reads the subset it enforces and
/// reports the rest on the policy, `docs/policy.md`).
fn cilium_policy_schema() -> Value {
    let open = serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    serde_json::json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": schema_of::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(),
            "spec": open,
            "specs": {"type": "array", "items": open},
            "status": open,
        }
    })
}

fn cilium_errors<T: serde::de::DeserializeOwned + serde::Serialize>(
    new: &Value,
) -> Vec<FieldError> {
    cozyplane_api::validation::decode_only::<T>(new)
}

fn cilium_update_errors<T: serde::de::DeserializeOwned + serde::Serialize>(
    new: &Value,
    _old: &Value,
) -> Vec<FieldError> {
    cilium_errors::<T>(new)
}

/// cilium.io/v2 CiliumNetworkPolicy, served so Cozystack's policies (and
/// the lab's) apply; the agent enforces the subset in `docs/policy.md`.
pub fn cilium_network_policies() -> KindInfo {
    use cozyplane_api::cilium::CiliumNetworkPolicy;
    let mut k = kind(
        "cilium.io",
        "v2",
        "CiliumNetworkPolicy",
        "ciliumnetworkpolicies",
        "ciliumnetworkpolicy",
        &["cnp", "ciliumnp"],
        true,
        false,
        cilium_policy_schema,
        &[],
        &[],
    );
    k.categories = &["cilium", "ciliumpolicy"];
    k.validate_create = cilium_errors::<CiliumNetworkPolicy>;
    k.validate_update = cilium_update_errors::<CiliumNetworkPolicy>;
    k
}

/// cilium.io/v2 CiliumClusterwideNetworkPolicy (cluster-scoped).
pub fn cilium_clusterwide_network_policies() -> KindInfo {
    use cozyplane_api::cilium::CiliumClusterwideNetworkPolicy;
    let mut k = kind(
        "cilium.io",
        "v2",
        "CiliumClusterwideNetworkPolicy",
        "ciliumclusterwidenetworkpolicies",
        "ciliumclusterwidenetworkpolicy",
        &["ccnp"],
        false,
        false,
        cilium_policy_schema,
        &[],
        &[],
    );
    k.categories = &["cilium", "ciliumpolicy"];
    k.validate_create = cilium_errors::<CiliumClusterwideNetworkPolicy>;
    k.validate_update = cilium_update_errors::<CiliumClusterwideNetworkPolicy>;
    k
}

/// coordination.k8s.io/v1 Lease.
pub fn leases() -> KindInfo {
    const COLS: &[PrinterColumn] = &[col(
        "Holder",
        "string",
        ".spec.holderIdentity",
        "Current holder.",
        0,
    )];
    let mut k = kind(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        &[],
        true,
        false,
        schema_of::<coordination::v1::Lease>,
        COLS,
        &[],
    );
    k.categories = &[];
    k
}

/// core/v1 ConfigMap (the lab and delegated authentication read
/// `kube-system/extension-apiserver-authentication`).
pub fn config_maps() -> KindInfo {
    let mut k = kind(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        &["cm"],
        true,
        false,
        schema_of::<core::v1::ConfigMap>,
        &[],
        &[],
    );
    k.categories = &[];
    k
}

/// core/v1 Event: what the lab kubelet reports about a pod (a sandbox that
/// cannot be created, say), for `kubectl get events` and `kubectl describe`.
/// Unlike kube-apiserver's, events here have no TTL: they go with their
/// namespace.
pub fn events() -> KindInfo {
    const COLS: &[PrinterColumn] = &[
        col(
            "Last Seen",
            "date",
            ".lastTimestamp",
            "When it last happened.",
            0,
        ),
        col("Type", "string", ".type", "Normal or Warning.", 0),
        col("Reason", "string", ".reason", "Why, in one word.", 0),
        col(
            "Object",
            "string",
            ".involvedObject.name",
            "What it is about.",
            0,
        ),
        col("Count", "integer", ".count", "How often.", 1),
        col("Message", "string", ".message", "What happened.", 0),
    ];
    let mut k = kind(
        "",
        "v1",
        "Event",
        "events",
        "event",
        &["ev"],
        true,
        false,
        schema_of::<core::v1::Event>,
        COLS,
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "reason",
            "type",
        ],
    );
    k.categories = &[];
    k
}

/// core/v1 ServiceAccount.
pub fn service_accounts() -> KindInfo {
    let mut k = kind(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        &["sa"],
        true,
        false,
        schema_of::<core::v1::ServiceAccount>,
        &[],
        &[],
    );
    k.categories = &[];
    k
}

/// core/v1 ResourceQuota. The server enforces its `count/…` keys itself
/// and keeps `status.used` (see [`crate::quota`]).
pub fn resource_quotas() -> KindInfo {
    let mut k = kind(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        &["quota"],
        true,
        true,
        schema_of::<core::v1::ResourceQuota>,
        &[],
        &[],
    );
    k.categories = &[];
    k.validate_create = crate::quota::validate_quota;
    k.validate_update = |n, _| crate::quota::validate_quota(n);
    k
}

/// `serviceaccounts/token`: the TokenRequest subresource.
pub const SERVICE_ACCOUNT_TOKEN: crate::hooks::ComputedSubresource =
    crate::hooks::ComputedSubresource {
        name: "token",
        group: "authentication.k8s.io",
        version: "v1",
        kind: "TokenRequest",
    };

fn rbac_kind(
    kind_name: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    schema: fn() -> Value,
) -> KindInfo {
    let mut k = kind(
        crate::auth::rbac::GROUP,
        "v1",
        kind_name,
        plural,
        singular,
        &[],
        namespaced,
        false,
        schema,
        &[],
        &[],
    );
    k.categories = &[];
    k
}

/// rbac.authorization.k8s.io/v1 ClusterRole.
pub fn cluster_roles() -> KindInfo {
    rbac_kind(
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        schema_of::<rbac::v1::ClusterRole>,
    )
}

/// rbac.authorization.k8s.io/v1 Role.
pub fn roles() -> KindInfo {
    rbac_kind("Role", "roles", "role", true, schema_of::<rbac::v1::Role>)
}

/// rbac.authorization.k8s.io/v1 ClusterRoleBinding.
pub fn cluster_role_bindings() -> KindInfo {
    let mut k = rbac_kind(
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        schema_of::<rbac::v1::ClusterRoleBinding>,
    );
    k.validate_create = |o| binding_errors(o, false);
    k.validate_update = |n, o| binding_update_errors(n, o, false);
    k
}

/// rbac.authorization.k8s.io/v1 RoleBinding.
pub fn role_bindings() -> KindInfo {
    let mut k = rbac_kind(
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        schema_of::<rbac::v1::RoleBinding>,
    );
    k.validate_create = |o| binding_errors(o, true);
    k.validate_update = |n, o| binding_update_errors(n, o, true);
    k
}

/// kube's binding validation: a role reference in the RBAC group to a
/// Role (RoleBindings only) or ClusterRole, and subjects of known kinds.
fn binding_errors(obj: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let role_ref = obj.get("roleRef").cloned().unwrap_or(Value::Null);
    if s(&role_ref, "apiGroup") != crate::auth::rbac::GROUP {
        errs.push(FieldError::new(
            FieldErrorType::NotSupported,
            "roleRef.apiGroup",
            format!("supported values: \"{}\"", crate::auth::rbac::GROUP),
        ));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    if !kinds.contains(&s(&role_ref, "kind").as_str()) {
        errs.push(FieldError::new(
            FieldErrorType::NotSupported,
            "roleRef.kind",
            format!(
                "supported values: {}",
                kinds
                    .iter()
                    .map(|k| format!("\"{k}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if s(&role_ref, "name").is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "roleRef.name",
            "Required value",
        ));
    }
    for (i, sub) in obj
        .get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if s(sub, "name").is_empty() {
            errs.push(FieldError::new(
                FieldErrorType::Required,
                format!("subjects[{i}].name"),
                "Required value",
            ));
        }
        match s(sub, "kind").as_str() {
            "User" | "Group" => {}
            "ServiceAccount" => {
                if !namespaced && s(sub, "namespace").is_empty() {
                    errs.push(FieldError::new(
                        FieldErrorType::Required,
                        format!("subjects[{i}].namespace"),
                        "Required value",
                    ));
                }
            }
            _ => errs.push(FieldError::new(
                FieldErrorType::NotSupported,
                format!("subjects[{i}].kind"),
                "supported values: \"ServiceAccount\", \"User\", \"Group\"",
            )),
        }
    }
    errs
}

fn binding_update_errors(new: &Value, old: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errs = binding_errors(new, namespaced);
    if new.get("roleRef") != old.get("roleRef") {
        errs.push(FieldError::new(
            FieldErrorType::Invalid,
            "roleRef",
            "cannot change roleRef",
        ));
    }
    errs
}

/// Every core kind of standalone mode with its hooks: pods get graceful
/// deletion and `pods/binding` ([`crate::pod_strategy`]), services their
/// defaulting ([`crate::services`]; the server adds their allocator); the
/// others behave generically.
pub fn standalone_kinds_with_hooks() -> Vec<(KindInfo, KindHooks)> {
    standalone_kinds_with_service_hooks(crate::services::hooks(None))
}

/// [`standalone_kinds_with_hooks`] with the given Service hooks (the
/// server's carry its allocator).
pub fn standalone_kinds_with_service_hooks(service_hooks: KindHooks) -> Vec<(KindInfo, KindHooks)> {
    let plain = KindHooks::default;
    let path_segment_names = || KindHooks {
        names: crate::meta::NameRule::PathSegment,
        ..plain()
    };
    vec![
        (namespaces(), plain()),
        (nodes(), plain()),
        (pods(), crate::pod_strategy::hooks()),
        (services(), service_hooks),
        (endpoint_slices(), plain()),
        (network_policies(), plain()),
        (cilium_network_policies(), plain()),
        (cilium_clusterwide_network_policies(), plain()),
        (leases(), plain()),
        (config_maps(), plain()),
        (events(), plain()),
        (
            service_accounts(),
            KindHooks {
                computed_subresources: &[SERVICE_ACCOUNT_TOKEN],
                ..plain()
            },
        ),
        (resource_quotas(), plain()),
        (cluster_roles(), path_segment_names()),
        (roles(), path_segment_names()),
        (cluster_role_bindings(), path_segment_names()),
        (role_bindings(), path_segment_names()),
        (ip_addresses(), path_segment_names()),
        (service_cidrs(), plain()),
    ]
}

/// Every core kind of standalone mode.
pub fn standalone_kinds() -> Vec<KindInfo> {
    standalone_kinds_with_hooks()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_schema_is_self_contained_and_described() {
        let s = (pods().schema)();
        let text = s.to_string();
        assert!(!text.contains("$ref"), "schema still has refs");
        let node_name = &s["properties"]["spec"]["properties"]["nodeName"];
        assert_eq!(node_name["type"], "string");
        assert!(node_name["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty()));
        let containers = &s["properties"]["spec"]["properties"]["containers"];
        assert_eq!(containers["items"]["properties"]["name"]["type"], "string");
    }

    #[test]
    fn every_kind_has_a_schema_with_metadata() {
        for k in standalone_kinds() {
            let s = (k.schema)();
            assert!(
                s["properties"]["metadata"]["properties"]["name"].is_object(),
                "{}",
                k.kind
            );
        }
    }
}

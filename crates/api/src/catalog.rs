//! The registry's view of every kind: [`sdn_kinds`] and [`local_kinds`].
//!
//! The Rust types (with their `#[kube(...)]` attributes) are the source of the
//! schema; printer columns and field selectors are repeated here as static data
//! because [`KindInfo`] is `'static`. The tests check that both copies agree with
//! the CRD the derive generates, so they cannot drift apart.

use kube::core::CustomResourceExt;
use serde_json::{json, Value};

use crate::kinds::{FieldError, KindInfo, PrinterColumn};
use crate::labels::{LOCAL_GROUP, SDN_GROUP, VERSION};
use crate::local::FabricIP;
use crate::sdn::{
    FloatingIP, HostFirewall, Port, SecurityGroup, ServiceVIP, VNIClaim, VPCBinding, VPCGateway,
    VPCPeering, VPC,
};
use crate::validation::{claims, decode_only, hostfw, vpc};

/// The category every cozyplane kind is in (`kubectl get cozyplane`).
pub const CATEGORIES: &[&str] = &["cozyplane"];

/// The openAPIV3Schema of the whole object, from the CRD the derive generates.
///
/// The derive leaves `apiVersion`, `kind` and `metadata` out (kube-apiserver adds
/// them to CRD schemas itself); we serve the schema ourselves, so they are added
/// here with the standard descriptions, `metadata` as a plain `object` (the
/// server may publish it as a reference to `ObjectMeta`).
/// `Value::Null` only if the derive produced no schema, which a test rules out.
pub fn schema_of<K: CustomResourceExt>() -> Value {
    let mut schema = K::crd()
        .spec
        .versions
        .into_iter()
        .next()
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null);
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "apiVersion".into(),
            json!({"type": "string", "description": API_VERSION_DOC}),
        );
        props.insert(
            "kind".into(),
            json!({"type": "string", "description": KIND_DOC}),
        );
        props.insert(
            "metadata".into(),
            json!({"type": "object", "description": METADATA_DOC}),
        );
    }
    schema
}

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object. \
Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. \
More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents. \
Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. \
More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DOC: &str = "Standard object's metadata. \
More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn no_update_rules<K: serde::de::DeserializeOwned + serde::Serialize>(
    new: &Value,
    _old: &Value,
) -> Vec<FieldError> {
    decode_only::<K>(new)
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

const AGE: PrinterColumn = col(
    "Age",
    "date",
    ".metadata.creationTimestamp",
    "Time since creation",
    0,
);

const VPC_COLUMNS: &[PrinterColumn] = &[
    col(
        "VNI",
        "integer",
        ".status.vni",
        "Virtual network id (Geneve VNI) assigned by the controller",
        0,
    ),
    col(
        "CIDRs",
        "string",
        ".spec.cidrs",
        "Address ranges of the VPC",
        0,
    ),
    col("MTU", "integer", ".spec.mtu", "MTU inside the VPC", 0),
    col("Phase", "string", ".status.phase", "Pending or Ready", 0),
    AGE,
];
const VPC_BINDING_COLUMNS: &[PrinterColumn] = &[
    col(
        "VPC-Namespace",
        "string",
        ".spec.vpcRef.namespace",
        "Namespace of the bound VPC",
        0,
    ),
    col(
        "VPC",
        "string",
        ".spec.vpcRef.name",
        "Name of the bound VPC",
        0,
    ),
    AGE,
];
const VPC_PEERING_COLUMNS: &[PrinterColumn] = &[
    col("VPC", "string", ".spec.vpcRef.name", "Local VPC", 0),
    col(
        "Peer-Namespace",
        "string",
        ".spec.peerRef.namespace",
        "Namespace of the peer VPC",
        0,
    ),
    col(
        "Peer",
        "string",
        ".spec.peerRef.name",
        "Name of the peer VPC",
        0,
    ),
    col(
        "Peer-VNI",
        "integer",
        ".status.peerVNI",
        "VNI of the peer VPC",
        1,
    ),
    col("Phase", "string", ".status.phase", "Peering phase", 0),
    AGE,
];
const VPC_GATEWAY_COLUMNS: &[PrinterColumn] = &[
    col(
        "VPC",
        "string",
        ".spec.vpcRef.name",
        "The VPC this gateway serves",
        0,
    ),
    col(
        "NAT-Address",
        "string",
        ".status.natAddress",
        "IPv4 egress NAT address",
        0,
    ),
    col(
        "NAT-Address6",
        "string",
        ".status.natAddress6",
        "IPv6 egress NAT address",
        1,
    ),
    col("Phase", "string", ".status.phase", "Gateway phase", 0),
    AGE,
];
const PORT_COLUMNS: &[PrinterColumn] = &[
    col("VPC", "string", ".spec.vpcRef.name", "VPC of the port", 0),
    col("IP", "string", ".spec.ip", "Address in the VPC", 0),
    col("Node", "string", ".spec.node", "Node hosting the pod", 0),
    col("Pod", "string", ".spec.podName", "Claimant pod", 0),
    col(
        "VPC-Namespace",
        "string",
        ".spec.vpcRef.namespace",
        "Namespace of the VPC",
        1,
    ),
    col(
        "Pod-Namespace",
        "string",
        ".spec.podNamespace",
        "Namespace of the claimant pod",
        1,
    ),
    col(
        "MAC",
        "string",
        ".spec.mac",
        "MAC address of the pod interface",
        1,
    ),
    AGE,
];
const VNI_CLAIM_COLUMNS: &[PrinterColumn] = &[
    col(
        "VPC-Namespace",
        "string",
        ".spec.vpcRef.namespace",
        "Namespace of the VPC holding the VNI",
        0,
    ),
    col(
        "VPC",
        "string",
        ".spec.vpcRef.name",
        "VPC holding the VNI",
        0,
    ),
    AGE,
];
const SERVICE_VIP_COLUMNS: &[PrinterColumn] = &[
    col("VPC", "string", ".spec.vpcRef.name", "VPC of the VIP", 0),
    col("IP", "string", ".spec.ip", "Virtual IP in the VPC", 0),
    col(
        "Service-Namespace",
        "string",
        ".spec.serviceRef.namespace",
        "Namespace of the Service",
        0,
    ),
    col(
        "Service",
        "string",
        ".spec.serviceRef.name",
        "The Service",
        0,
    ),
    col("Phase", "string", ".status.phase", "VIP phase", 0),
    AGE,
];
const SECURITY_GROUP_COLUMNS: &[PrinterColumn] = &[
    col("VPC", "string", ".spec.vpcRef.name", "VPC of the group", 0),
    col(
        "ID",
        "integer",
        ".status.id",
        "Group id in the VPC (1..62)",
        0,
    ),
    col("Phase", "string", ".status.phase", "Group phase", 0),
    AGE,
];
const HOST_FIREWALL_COLUMNS: &[PrinterColumn] = &[
    col(
        "Policy-Types",
        "string",
        ".spec.policyTypes",
        "Directions enforced",
        0,
    ),
    AGE,
];
const FLOATING_IP_COLUMNS: &[PrinterColumn] = &[
    col("VPC", "string", ".spec.vpcRef.name", "VPC of the target", 0),
    col(
        "Target",
        "string",
        ".spec.target",
        "VPC address the floating IP maps to",
        0,
    ),
    col(
        "Address",
        "string",
        ".status.address",
        "Assigned public address",
        0,
    ),
    col("Phase", "string", ".status.phase", "Floating IP phase", 0),
    AGE,
];
const FABRIC_IP_COLUMNS: &[PrinterColumn] = &[
    col(
        "Address",
        "string",
        ".spec.address",
        "The claimed fabric address",
        0,
    ),
    col(
        "Node",
        "string",
        ".spec.node",
        "Node of the claimant pod",
        0,
    ),
    col("Pod", "string", ".spec.podName", "Claimant pod", 0),
    col(
        "Pod-Namespace",
        "string",
        ".spec.podNamespace",
        "Namespace of the claimant pod",
        1,
    ),
    AGE,
];

/// Every kind of `sdn.cozystack.io/v1alpha1`.
pub fn sdn_kinds() -> Vec<KindInfo> {
    let base = |kind, plural, singular, short_names, namespaced| KindInfo {
        group: SDN_GROUP,
        version: VERSION,
        kind,
        plural,
        singular,
        short_names,
        categories: CATEGORIES,
        namespaced,
        status_subresource: true,
        schema: || Value::Null,
        printer_columns: &[],
        field_selectors: &[],
        validate_create: |_| Vec::new(),
        validate_update: |_, _| Vec::new(),
    };
    vec![
        KindInfo {
            schema: schema_of::<VPC>,
            printer_columns: VPC_COLUMNS,
            field_selectors: &["status.phase"],
            validate_create: vpc::validate_vpc,
            validate_update: vpc::validate_vpc_update,
            ..base("VPC", "vpcs", "vpc", &[], true)
        },
        KindInfo {
            status_subresource: false,
            schema: schema_of::<VPCBinding>,
            printer_columns: VPC_BINDING_COLUMNS,
            field_selectors: &["spec.vpcRef.namespace", "spec.vpcRef.name"],
            validate_create: decode_only::<VPCBinding>,
            validate_update: no_update_rules::<VPCBinding>,
            ..base("VPCBinding", "vpcbindings", "vpcbinding", &["vpcb"], true)
        },
        KindInfo {
            schema: schema_of::<VPCPeering>,
            printer_columns: VPC_PEERING_COLUMNS,
            field_selectors: &["spec.vpcRef.name"],
            validate_create: decode_only::<VPCPeering>,
            validate_update: no_update_rules::<VPCPeering>,
            ..base("VPCPeering", "vpcpeerings", "vpcpeering", &["vpcp"], true)
        },
        KindInfo {
            schema: schema_of::<VPCGateway>,
            printer_columns: VPC_GATEWAY_COLUMNS,
            field_selectors: &["spec.vpcRef.name"],
            validate_create: decode_only::<VPCGateway>,
            validate_update: no_update_rules::<VPCGateway>,
            ..base("VPCGateway", "vpcgateways", "vpcgateway", &["vpcgw"], true)
        },
        KindInfo {
            schema: schema_of::<Port>,
            printer_columns: PORT_COLUMNS,
            field_selectors: &[
                "spec.node",
                "spec.vpcRef.namespace",
                "spec.vpcRef.name",
                "spec.podNamespace",
                "spec.podName",
            ],
            validate_create: claims::validate_port,
            validate_update: claims::validate_port_update,
            ..base("Port", "ports", "port", &["vport"], false)
        },
        KindInfo {
            schema: schema_of::<ServiceVIP>,
            printer_columns: SERVICE_VIP_COLUMNS,
            field_selectors: &["spec.vpcRef.namespace", "spec.vpcRef.name"],
            validate_create: claims::validate_service_vip,
            validate_update: claims::validate_service_vip_update,
            ..base("ServiceVIP", "servicevips", "servicevip", &["svip"], false)
        },
        KindInfo {
            schema: schema_of::<SecurityGroup>,
            printer_columns: SECURITY_GROUP_COLUMNS,
            field_selectors: &["spec.vpcRef.name"],
            validate_create: decode_only::<SecurityGroup>,
            validate_update: no_update_rules::<SecurityGroup>,
            ..base(
                "SecurityGroup",
                "securitygroups",
                "securitygroup",
                &["sg"],
                true,
            )
        },
        KindInfo {
            schema: schema_of::<HostFirewall>,
            printer_columns: HOST_FIREWALL_COLUMNS,
            validate_create: hostfw::validate_host_firewall,
            validate_update: hostfw::validate_host_firewall_update,
            ..base(
                "HostFirewall",
                "hostfirewalls",
                "hostfirewall",
                &["hfw"],
                false,
            )
        },
        KindInfo {
            schema: schema_of::<FloatingIP>,
            printer_columns: FLOATING_IP_COLUMNS,
            field_selectors: &["spec.vpcRef.name", "spec.target"],
            validate_create: decode_only::<FloatingIP>,
            validate_update: no_update_rules::<FloatingIP>,
            ..base("FloatingIP", "floatingips", "floatingip", &["flip"], true)
        },
        KindInfo {
            status_subresource: false,
            schema: schema_of::<VNIClaim>,
            printer_columns: VNI_CLAIM_COLUMNS,
            field_selectors: &["spec.vpcRef.namespace", "spec.vpcRef.name", "spec.vpcUID"],
            validate_create: claims::validate_vni_claim,
            validate_update: claims::validate_vni_claim_update,
            ..base("VNIClaim", "vniclaims", "vniclaim", &[], false)
        },
    ]
}

/// Every kind of `local.sdn.cozystack.io/v1alpha1` (served in standalone mode;
/// a CRD on a real cluster, see [`FabricIP`]'s `crd()`).
pub fn local_kinds() -> Vec<KindInfo> {
    vec![KindInfo {
        group: LOCAL_GROUP,
        version: VERSION,
        kind: "FabricIP",
        plural: "fabricips",
        singular: "fabricip",
        short_names: &["fip"],
        categories: CATEGORIES,
        namespaced: false,
        status_subresource: false,
        schema: schema_of::<FabricIP>,
        printer_columns: FABRIC_IP_COLUMNS,
        field_selectors: &[
            "spec.node",
            "spec.podNamespace",
            "spec.podName",
            "spec.podUID",
        ],
        validate_create: claims::validate_fabric_ip,
        validate_update: claims::validate_fabric_ip_update,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use std::collections::HashSet;

    fn all() -> Vec<KindInfo> {
        sdn_kinds().into_iter().chain(local_kinds()).collect()
    }

    /// The CRD the derive generates for each kind, paired by kind name.
    fn crds() -> Vec<CustomResourceDefinition> {
        vec![
            VPC::crd(),
            VPCBinding::crd(),
            VPCPeering::crd(),
            VPCGateway::crd(),
            Port::crd(),
            ServiceVIP::crd(),
            SecurityGroup::crd(),
            HostFirewall::crd(),
            FloatingIP::crd(),
            VNIClaim::crd(),
            FabricIP::crd(),
        ]
    }

    #[test]
    fn the_expected_kinds_and_scopes() {
        let got: Vec<(&str, &str, bool, bool)> = all()
            .iter()
            .map(|k| (k.group, k.kind, k.namespaced, k.status_subresource))
            .collect();
        assert_eq!(
            got,
            [
                ("sdn.cozystack.io", "VPC", true, true),
                ("sdn.cozystack.io", "VPCBinding", true, false),
                ("sdn.cozystack.io", "VPCPeering", true, true),
                ("sdn.cozystack.io", "VPCGateway", true, true),
                ("sdn.cozystack.io", "Port", false, true),
                ("sdn.cozystack.io", "ServiceVIP", false, true),
                ("sdn.cozystack.io", "SecurityGroup", true, true),
                ("sdn.cozystack.io", "HostFirewall", false, true),
                ("sdn.cozystack.io", "FloatingIP", true, true),
                ("sdn.cozystack.io", "VNIClaim", false, false),
                ("local.sdn.cozystack.io", "FabricIP", false, false),
            ]
        );
        assert!(all().iter().all(|k| k.version == "v1alpha1"));
    }

    #[test]
    fn names_are_lower_case_and_unique() {
        let mut names = HashSet::new();
        for k in all() {
            for n in [k.plural, k.singular].iter().chain(k.short_names) {
                assert!(
                    !n.is_empty()
                        && n.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                    "{}: {n:?}",
                    k.kind
                );
            }
            assert_eq!(k.singular, k.kind.to_ascii_lowercase());
            assert_eq!(k.plural, format!("{}s", k.singular));
            // No short name may equal another kind's (or its own kind's) resource names.
            for n in [k.plural, k.singular] {
                assert!(names.insert(n.to_string()), "{n} used twice");
            }
            for n in k.short_names {
                assert!(names.insert(n.to_string()), "short name {n} used twice");
            }
            assert_eq!(k.categories, ["cozyplane"]);
        }
    }

    #[test]
    fn kind_info_agrees_with_the_derived_crd() {
        for (k, crd) in all().iter().zip(crds()) {
            let s = &crd.spec;
            assert_eq!((s.group.as_str(), s.names.kind.as_str()), (k.group, k.kind));
            assert_eq!(s.names.plural, k.plural);
            assert_eq!(s.names.singular.as_deref(), Some(k.singular));
            assert_eq!(
                s.names.short_names.clone().unwrap_or_default(),
                k.short_names,
                "{}",
                k.kind
            );
            assert_eq!(s.names.categories.clone().unwrap_or_default(), k.categories);
            assert_eq!(s.scope == "Namespaced", k.namespaced, "{}", k.kind);
            let v = &s.versions[0];
            assert_eq!(v.name, k.version);
            let has_status = v
                .subresources
                .as_ref()
                .and_then(|r| r.status.as_ref())
                .is_some();
            assert_eq!(has_status, k.status_subresource, "{}", k.kind);
            let cols: Vec<(String, String, String, String, i32)> = v
                .additional_printer_columns
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|c| {
                    (
                        c.name,
                        c.type_,
                        c.json_path,
                        c.description.unwrap_or_default(),
                        c.priority.unwrap_or(0),
                    )
                })
                .collect();
            let mine: Vec<(String, String, String, String, i32)> = k
                .printer_columns
                .iter()
                .map(|c| {
                    (
                        c.name.into(),
                        c.type_.into(),
                        c.json_path.into(),
                        c.description.into(),
                        c.priority,
                    )
                })
                .collect();
            assert_eq!(cols, mine, "{}", k.kind);
            let sel: Vec<String> = v
                .selectable_fields
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|f| f.json_path)
                .collect();
            let mine: Vec<String> = k.field_selectors.iter().map(|f| format!(".{f}")).collect();
            assert_eq!(sel, mine, "{}", k.kind);
        }
    }

    /// `kube::Api<VPC>` etc. must address exactly the resource the server registers.
    #[test]
    fn kube_resource_impls_agree() {
        use kube::Resource;
        fn ids<K: Resource<DynamicType = ()>>() -> (String, String, String, String) {
            (
                K::group(&()).into(),
                K::version(&()).into(),
                K::kind(&()).into(),
                K::plural(&()).into(),
            )
        }
        let got = [
            ids::<VPC>(),
            ids::<VPCBinding>(),
            ids::<VPCPeering>(),
            ids::<VPCGateway>(),
            ids::<Port>(),
            ids::<ServiceVIP>(),
            ids::<SecurityGroup>(),
            ids::<HostFirewall>(),
            ids::<FloatingIP>(),
            ids::<VNIClaim>(),
            ids::<FabricIP>(),
        ];
        for (k, g) in all().iter().zip(got) {
            assert_eq!(
                g,
                (
                    k.group.into(),
                    k.version.into(),
                    k.kind.into(),
                    k.plural.into()
                )
            );
        }
    }

    #[test]
    fn every_kind_has_a_useful_printer_column_set() {
        for k in all() {
            let last = k
                .printer_columns
                .last()
                .map(|c| (c.name, c.type_, c.json_path));
            assert_eq!(
                last,
                Some(("Age", "date", ".metadata.creationTimestamp")),
                "{}",
                k.kind
            );
            assert!(k.printer_columns.len() >= 2, "{}", k.kind);
            for c in k.printer_columns {
                assert!(
                    ["string", "integer", "number", "boolean", "date"].contains(&c.type_),
                    "{}",
                    c.name
                );
                assert!(
                    c.json_path.starts_with('.') && !c.description.is_empty(),
                    "{}",
                    c.name
                );
            }
        }
        let vpc = &sdn_kinds()[0];
        let vni = vpc
            .printer_columns
            .iter()
            .find(|c| c.name == "VNI")
            .map(|c| c.json_path);
        assert_eq!(vni, Some(".status.vni"));
    }

    /// Walk `path` (dot-separated property names) through a schema.
    fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
        path.split('.').fold(schema, |s, p| &s["properties"][p])
    }

    /// Every property in the schema (recursively) has a type and a description.
    fn assert_complete(kind: &str, path: &str, s: &Value) {
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (name, p) in props {
                let here = format!("{path}.{name}");
                assert!(
                    p.get("type").and_then(Value::as_str).is_some(),
                    "{kind}{here} has no type: {p}"
                );
                assert!(
                    p.get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| !d.is_empty()),
                    "{kind}{here} has no description"
                );
                assert_complete(kind, &here, p);
            }
        }
        if let Some(items) = s.get("items") {
            assert!(items.get("type").is_some(), "{kind}{path}[] has no type");
            assert_complete(kind, &format!("{path}[]"), items);
        }
        assert!(
            s.get("$ref").is_none() && s.get("anyOf").is_none() && s.get("oneOf").is_none(),
            "{kind}{path} is not structural: {s}"
        );
    }

    #[test]
    fn schemas_are_complete_objects() {
        for k in all() {
            let s = (k.schema)();
            assert_eq!(s["type"], "object", "{}", k.kind);
            for f in ["apiVersion", "kind"] {
                assert_eq!(at(&s, f)["type"], "string", "{} {f}", k.kind);
            }
            assert_eq!(at(&s, "metadata")["type"], "object", "{}", k.kind);
            assert_eq!(at(&s, "spec")["type"], "object", "{}", k.kind);
            assert_eq!(
                s["properties"].get("status").is_some(),
                k.status_subresource,
                "{}",
                k.kind
            );
            assert_complete(k.kind, "", &s);
        }
    }

    #[test]
    fn vpc_schema_shape() {
        let s = (sdn_kinds()[0].schema)();
        let cidrs = at(&s, "spec.cidrs");
        assert_eq!(cidrs["type"], "array");
        assert_eq!(cidrs["items"]["type"], "string");
        assert!(cidrs["description"]
            .as_str()
            .is_some_and(|d| d.contains("canonical")));
        assert_eq!(at(&s, "spec.mtu")["type"], "integer");
        assert_eq!(at(&s, "status.vni")["type"], "integer");
        assert_eq!(s["properties"]["spec"]["required"], json!(["cidrs"]));
    }

    #[test]
    fn field_names_match_the_prior_api() {
        let port = (sdn_kinds()[4].schema)();
        for f in [
            "vpcRef",
            "ip",
            "mac",
            "node",
            "nodeIP",
            "podNamespace",
            "podName",
            "gateway",
        ] {
            assert!(
                at(&port, "spec")
                    .get("properties")
                    .and_then(|p| p.get(f))
                    .is_some(),
                "Port spec.{f}"
            );
        }
        let fab = (local_kinds()[0].schema)();
        for f in ["address", "node", "podNamespace", "podName", "podUID"] {
            assert!(
                at(&fab, "spec")["properties"].get(f).is_some(),
                "FabricIP spec.{f}"
            );
        }
        let peering = (sdn_kinds()[2].schema)();
        assert!(at(&peering, "status")["properties"]
            .get("peerVNI")
            .is_some());
        let gw = (sdn_kinds()[3].schema)();
        assert!(at(&gw, "spec.nat")["properties"]
            .get("addressClaimName6")
            .is_some());
        assert!(at(&gw, "status")["properties"].get("natAddress6").is_some());
    }

    #[test]
    fn well_formed_objects_of_rule_less_kinds_are_accepted_and_malformed_refused() {
        let binding = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCBinding",
            "metadata": {"name": "b", "namespace": "consumer"}, "spec": {"vpcRef": {"namespace": "owner", "name": "blue"}}});
        let k = &sdn_kinds()[1];
        assert_eq!((k.validate_create)(&binding), vec![]);
        assert_eq!((k.validate_update)(&binding, &binding), vec![]);
        let bad = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCBinding",
            "metadata": {"name": "b", "namespace": "consumer"}, "spec": {"vpcRef": {"name": 7}}});
        let e = (k.validate_create)(&bad);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.vpcRef.name");
        assert_eq!((k.validate_update)(&bad, &binding).len(), 1);

        let sg = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "SecurityGroup",
            "metadata": {"name": "web", "namespace": "owner"},
            "spec": {"vpcRef": {"name": "blue"}, "podSelector": {"matchLabels": {"app": "web"}},
                     "ingress": [{"from": {"cidr": "0.0.0.0/0"}, "ports": [{"protocol": "TCP", "port": 443}]}]}});
        assert_eq!((sdn_kinds()[6].validate_create)(&sg), vec![]);
        let mut bad_sg = sg.clone();
        bad_sg["spec"]["ingress"][0]["ports"][0]["port"] = json!("https");
        let e = (sdn_kinds()[6].validate_create)(&bad_sg);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.ingress[0].ports[0].port");
    }

    #[test]
    fn typed_objects_round_trip_through_json() {
        let obj = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port",
            "metadata": {"name": "v100.10.0.0.5"},
            "spec": {"vpcRef": {"namespace": "a", "name": "blue"}, "ip": "10.0.0.5", "nodeIP": "192.168.1.10", "gateway": true},
            "status": {"groups": [1, 3]}});
        let port: Port = serde_json::from_value(obj.clone()).unwrap();
        assert_eq!(port.spec.node_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(serde_json::to_value(&port).unwrap(), obj);
    }
}

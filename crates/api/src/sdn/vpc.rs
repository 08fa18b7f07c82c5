//! VPC and the kinds that hang off it: VPCBinding, VPCPeering, VPCGateway.

// `#[kube(printcolumn(...), printcolumn(...))]` repeats `type_ = "string"` by design;
// clippy's duplicated_attributes lint misreads those as duplicate attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::refs::{Condition, LocalVPCRef, ObjectRef, VPCRef};

/// Desired state of a VPC, a tenant virtual network: an isolated address space
/// (IPv4 and/or IPv6) owned by its namespace. CIDRs may overlap other VPCs'; the
/// VNI keeps them apart.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "VPC",
    plural = "vpcs",
    singular = "vpc",
    namespaced,
    status = "VPCStatus",
    derive = "PartialEq",
    category = "cozyplane",
    doc = "VPC is a tenant virtual network: an isolated IPv4 and/or IPv6 address space owned by its namespace.",
    printcolumn(
        name = "VNI",
        type_ = "integer",
        json_path = ".status.vni",
        description = "Virtual network id (Geneve VNI) assigned by the controller"
    ),
    printcolumn(
        name = "CIDRs",
        type_ = "string",
        json_path = ".spec.cidrs",
        description = "Address ranges of the VPC"
    ),
    printcolumn(
        name = "MTU",
        type_ = "integer",
        json_path = ".spec.mtu",
        description = "MTU inside the VPC"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending or Ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".status.phase"
)]
#[serde(rename_all = "camelCase")]
pub struct VPCSpec {
    /// Address ranges of the VPC in canonical CIDR form (host bits zero, IPv6 in
    /// RFC 5952 text): at most one IPv4 (/8 to /30) and one IPv6 (/48 to /126).
    pub cidrs: Vec<String>,
    /// MTU of pod interfaces in this VPC (576 to 9000; at least 1280 with an IPv6
    /// CIDR). Unset means the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i32>,
}

/// Observed state of a VPC, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCStatus {
    /// Virtual network id (also the Geneve VNI), unique in the cluster, >= 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<i32>,
    /// Lifecycle phase: Pending until a VNI is assigned, then Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Desired state of a VPCBinding, which grants the namespace it lives in the right
/// to attach pods and Services to a VPC (default deny). Creating one requires verb
/// `export` on the target VPC.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "VPCBinding",
    plural = "vpcbindings",
    singular = "vpcbinding",
    namespaced,
    derive = "PartialEq",
    shortname = "vpcb",
    category = "cozyplane",
    doc = "VPCBinding lets pods and Services of its namespace attach to a VPC (needs verb export on the VPC).",
    printcolumn(
        name = "VPC-Namespace",
        type_ = "string",
        json_path = ".spec.vpcRef.namespace",
        description = "Namespace of the bound VPC"
    ),
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "Name of the bound VPC"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.vpcRef.namespace",
    selectable = ".spec.vpcRef.name"
)]
#[serde(rename_all = "camelCase")]
pub struct VPCBindingSpec {
    /// The VPC to bind; its namespace defaults to the binding's.
    pub vpc_ref: VPCRef,
}

/// Desired state of a VPCPeering, one half of a peering between two VPCs; it is
/// live only while the peer VPC's owner has created the mirror half (reciprocity
/// is consent).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "VPCPeering",
    plural = "vpcpeerings",
    singular = "vpcpeering",
    namespaced,
    status = "VPCPeeringStatus",
    derive = "PartialEq",
    shortname = "vpcp",
    category = "cozyplane",
    doc = "VPCPeering is one half of a mutual, non-transitive peering between two VPCs.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "Local VPC"
    ),
    printcolumn(
        name = "Peer-Namespace",
        type_ = "string",
        json_path = ".spec.peerRef.namespace",
        description = "Namespace of the peer VPC"
    ),
    printcolumn(
        name = "Peer",
        type_ = "string",
        json_path = ".spec.peerRef.name",
        description = "Name of the peer VPC"
    ),
    printcolumn(
        name = "Peer-VNI",
        type_ = "integer",
        json_path = ".status.peerVNI",
        description = "VNI of the peer VPC",
        priority = 1
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Peering phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.vpcRef.name"
)]
#[serde(rename_all = "camelCase")]
pub struct VPCPeeringSpec {
    /// The local VPC (in this namespace). Requires verb `peer` on it.
    pub vpc_ref: LocalVPCRef,
    /// The remote VPC; the peering is live only when it references this VPC back.
    pub peer_ref: ObjectRef,
}

/// Observed state of a peering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCPeeringStatus {
    /// Lifecycle phase of the peering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// VNI of the peer VPC once the peering is matched.
    #[serde(default, rename = "peerVNI", skip_serializing_if = "Option::is_none")]
    pub peer_vni: Option<i32>,
    /// Conditions: PeerMatched, VPCReady, PeerVPCReady, CIDRsDisjoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Desired state of a VPCGateway, the north-south boundary of a VPC: egress NAT
/// and optional LoadBalancer ingress. A VPC has exactly one effective gateway, the
/// oldest (ties broken by name).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "VPCGateway",
    plural = "vpcgateways",
    singular = "vpcgateway",
    namespaced,
    status = "VPCGatewayStatus",
    derive = "PartialEq",
    shortname = "vpcgw",
    category = "cozyplane",
    doc = "VPCGateway is the north-south boundary of a VPC: egress NAT and optional LoadBalancer ingress.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "The VPC this gateway serves"
    ),
    printcolumn(
        name = "NAT-Address",
        type_ = "string",
        json_path = ".status.natAddress",
        description = "IPv4 egress NAT address"
    ),
    printcolumn(
        name = "NAT-Address6",
        type_ = "string",
        json_path = ".status.natAddress6",
        description = "IPv6 egress NAT address",
        priority = 1
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Gateway phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.vpcRef.name"
)]
#[serde(rename_all = "camelCase")]
pub struct VPCGatewaySpec {
    /// The VPC (in this namespace) this gateway serves.
    pub vpc_ref: LocalVPCRef,
    /// `loadBalancerClass` of the Services the gateway owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// Egress NAT settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<VPCGatewayNAT>,
    /// Ingress settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<VPCGatewayIngress>,
}

/// Egress NAT of a VPC gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCGatewayNAT {
    /// Masquerade VPC egress behind one public address per family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Optional IPv4 address claim passed to the address-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_claim_name: Option<String>,
    /// Optional IPv6 address claim passed to the address-controller.
    #[serde(
        default,
        rename = "addressClaimName6",
        skip_serializing_if = "Option::is_none"
    )]
    pub address_claim_name6: Option<String>,
}

/// Ingress of a VPC gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCGatewayIngress {
    /// Admit LoadBalancer traffic into the VPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<bool>,
}

/// Observed state of a VPC gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCGatewayStatus {
    /// Assigned IPv4 egress NAT address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_address: Option<String>,
    /// Assigned IPv6 egress NAT address.
    #[serde(
        default,
        rename = "natAddress6",
        skip_serializing_if = "Option::is_none"
    )]
    pub nat_address6: Option<String>,
    /// Lifecycle phase of the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Conditions: VPCResolved, NATReady, Exclusive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Desired state of a VNIClaim: the claim of one VPC id (VNI) for one VPC.
/// The object name is `vni-<vni>`, so creating it atomically reserves the VNI:
/// two controllers (or one restarted) can never hand one VNI to two VPCs. Written
/// by the controller only; the VPC's `status.vni` names the claim it holds.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "VNIClaim",
    plural = "vniclaims",
    singular = "vniclaim",
    derive = "PartialEq",
    category = "cozyplane",
    doc = "VNIClaim reserves one VPC id (VNI) for one VPC; its name vni-<vni> is the claim.",
    printcolumn(
        name = "VPC-Namespace",
        type_ = "string",
        json_path = ".spec.vpcRef.namespace",
        description = "Namespace of the VPC holding the VNI"
    ),
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "VPC holding the VNI"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.vpcRef.namespace",
    selectable = ".spec.vpcRef.name",
    selectable = ".spec.vpcUID"
)]
#[serde(rename_all = "camelCase")]
pub struct VNIClaimSpec {
    /// The VPC holding the VNI.
    pub vpc_ref: ObjectRef,
    /// The UID of that VPC: a VPC deleted and re-created under the same name is
    /// another VPC and does not inherit the claim.
    #[serde(rename = "vpcUID")]
    pub vpc_uid: String,
}

//! Policy kinds: SecurityGroup (tenant, per VPC) and HostFirewall (operator, per node).

// `#[kube(printcolumn(...), printcolumn(...))]` repeats `type_ = "string"` by design;
// clippy's duplicated_attributes lint misreads those as duplicate attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::refs::{Condition, LabelSelector, LocalVPCRef, ObjectRef};

/// Desired state of a SecurityGroup, a cloud-style security group: Ports selected
/// by `podSelector` become members, and the rules admit traffic from/to other
/// groups or CIDRs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "SecurityGroup",
    plural = "securitygroups",
    singular = "securitygroup",
    namespaced,
    status = "SecurityGroupStatus",
    derive = "PartialEq",
    shortname = "sg",
    category = "cozyplane",
    doc = "SecurityGroup admits traffic to and from its member Ports by group or CIDR.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "VPC of the group"
    ),
    printcolumn(
        name = "ID",
        type_ = "integer",
        json_path = ".status.id",
        description = "Group id in the VPC (1..62)"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Group phase"
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
pub struct SecurityGroupSpec {
    /// The VPC (in this namespace) the group belongs to. Immutable.
    pub vpc_ref: LocalVPCRef,
    /// Selects member pods (and so their Ports) by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Inbound rules; traffic matching any rule is admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<SecurityGroupIngressRule>,
    /// Outbound rules; traffic matching any rule is admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<SecurityGroupEgressRule>,
}

/// An inbound security group rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupIngressRule {
    /// The allowed source.
    pub from: SecurityGroupPeer,
    /// Allowed destination ports; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<SecurityGroupPort>,
}

/// An outbound security group rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupEgressRule {
    /// The allowed destination.
    pub to: SecurityGroupPeer,
    /// Allowed destination ports; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<SecurityGroupPort>,
}

/// The other side of a security group rule: exactly one of `group` or `cidr`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupPeer {
    /// Name of a SecurityGroup whose members are the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// A CIDR (off-VPC addresses) as the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// For `group`: the peered VPC the group lives in (namespace and name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc: Option<ObjectRef>,
}

/// A protocol and port (range) of a security group rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupPort {
    /// TCP, UDP or ICMP.
    pub protocol: String,
    /// Destination port (for ICMP: the ICMP type); 0 means any.
    #[serde(default)]
    pub port: i32,
    /// Last port of a range starting at `port` (inclusive, any length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i32>,
}

/// Observed state of a SecurityGroup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupStatus {
    /// Not used: the datapath identifies a group by an id each agent derives
    /// from the group's uid (docs/datapath.md, "SecurityGroups"). Kept for
    /// compatibility with the prior implementation's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i32>,
    /// Lifecycle phase of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Conditions: VPCReady, IDAllocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Desired state of a HostFirewall, the operator's firewall for the nodes
/// themselves (not pods), enforced in the datapath.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "HostFirewall",
    plural = "hostfirewalls",
    singular = "hostfirewall",
    status = "HostFirewallStatus",
    derive = "PartialEq",
    shortname = "hfw",
    category = "cozyplane",
    doc = "HostFirewall filters traffic to and from the selected nodes themselves.",
    printcolumn(
        name = "Policy-Types",
        type_ = "string",
        json_path = ".spec.policyTypes",
        description = "Directions enforced"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallSpec {
    /// Nodes this firewall applies to; empty selects all nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// `Ingress` and/or `Egress`. Defaults to Ingress, plus Egress when egress rules exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_types: Vec<String>,
    /// Inbound allow rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<HostFirewallIngressRule>,
    /// Outbound allow rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<HostFirewallEgressRule>,
}

/// An inbound host firewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallIngressRule {
    /// Allowed sources; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<HostFirewallPeer>,
    /// Allowed ports; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<HostFirewallPort>,
}

/// An outbound host firewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallEgressRule {
    /// Allowed destinations; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<HostFirewallPeer>,
    /// Allowed ports; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<HostFirewallPort>,
}

/// An address block of a host firewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallPeer {
    /// The block.
    pub cidr: String,
    /// Sub-blocks excluded from `cidr`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
}

/// A port (range) of a host firewall rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallPort {
    /// TCP (the default), UDP or SCTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Port (0-65535); unset means all ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Last port of a range starting at `port` (any length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i32>,
}

/// Observed state of a HostFirewall.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFirewallStatus {
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

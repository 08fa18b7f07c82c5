//! Address claims inside a VPC: Port (a pod's VPC address) and ServiceVIP (a
//! Service's virtual IP). Both are cluster-scoped and named by the claim, see
//! [`crate::names`].

// `#[kube(printcolumn(...), printcolumn(...))]` repeats `type_ = "string"` by design;
// clippy's duplicated_attributes lint misreads those as duplicate attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::refs::{Condition, ObjectRef, VPCRef};

/// Desired state of a Port, a pod's (or VM's) address in a VPC. The object name is
/// the claim `v<vni>.<escaped ip>`, so creating it atomically reserves the address.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "Port",
    plural = "ports",
    singular = "port",
    status = "PortStatus",
    derive = "PartialEq",
    shortname = "vport",
    category = "cozyplane",
    doc = "Port is a pod's address in a VPC; its name v<vni>.<escaped ip> is the address claim.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "VPC of the port"
    ),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".spec.ip",
        description = "Address in the VPC"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.node",
        description = "Node hosting the pod"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.podName",
        description = "Claimant pod"
    ),
    printcolumn(
        name = "VPC-Namespace",
        type_ = "string",
        json_path = ".spec.vpcRef.namespace",
        description = "Namespace of the VPC",
        priority = 1
    ),
    printcolumn(
        name = "Pod-Namespace",
        type_ = "string",
        json_path = ".spec.podNamespace",
        description = "Namespace of the claimant pod",
        priority = 1
    ),
    printcolumn(
        name = "MAC",
        type_ = "string",
        json_path = ".spec.mac",
        description = "MAC address of the pod interface",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.node",
    selectable = ".spec.vpcRef.namespace",
    selectable = ".spec.vpcRef.name",
    selectable = ".spec.podNamespace",
    selectable = ".spec.podName"
)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    /// The VPC the address belongs to. Immutable.
    pub vpc_ref: VPCRef,
    /// The address, in canonical text; must match the object name. Immutable.
    pub ip: String,
    /// MAC address of the pod-side interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Node hosting the claimant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Tunnel endpoint address of that node.
    #[serde(default, rename = "nodeIP", skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<String>,
    /// Namespace of the claimant pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// Name of the claimant pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// True for the VPC leg (the `.1` address) of a gateway pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<bool>,
}

/// Observed state of a Port, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    /// Ids (1..62, per VPC) of the SecurityGroups this port is a member of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<i32>,
}

/// Desired state of a ServiceVIP, a Service's virtual IP inside a VPC, created by
/// the controller for a Service annotated with `sdn.cozystack.io/vpc`. Named by the
/// claim `sv<vni>.<escaped ip>`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "ServiceVIP",
    plural = "servicevips",
    singular = "servicevip",
    status = "ServiceVIPStatus",
    derive = "PartialEq",
    shortname = "svip",
    category = "cozyplane",
    doc = "ServiceVIP is a Service's virtual IP inside a VPC; its name sv<vni>.<escaped ip> is the address claim.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "VPC of the VIP"
    ),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".spec.ip",
        description = "Virtual IP in the VPC"
    ),
    printcolumn(
        name = "Service-Namespace",
        type_ = "string",
        json_path = ".spec.serviceRef.namespace",
        description = "Namespace of the Service"
    ),
    printcolumn(
        name = "Service",
        type_ = "string",
        json_path = ".spec.serviceRef.name",
        description = "The Service"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "VIP phase"
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
pub struct ServiceVIPSpec {
    /// The VPC the VIP belongs to. Immutable.
    pub vpc_ref: VPCRef,
    /// The virtual IP, from the VPC's own CIDR; must match the object name. Immutable.
    pub ip: String,
    /// The Service this VIP materializes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_ref: Option<ObjectRef>,
    /// Ports served on the VIP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServiceVIPPort>,
    /// `None` or `ClientIP`, as on the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
}

/// One port of a ServiceVIP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVIPPort {
    /// Port name, as on the Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// TCP or UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The port number on the VIP.
    pub port: i32,
}

/// Observed state of a ServiceVIP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVIPStatus {
    /// Backends (VPC addresses of ready endpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<ServiceVIPBackend>,
    /// Lifecycle phase of the VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One backend of a ServiceVIP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVIPBackend {
    /// The backend's VPC address.
    pub ip: String,
    /// Port mappings of this backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServiceVIPBackendPort>,
}

/// A port mapping of a ServiceVIP backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVIPBackendPort {
    /// TCP or UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The port on the VIP.
    pub port: i32,
    /// The port on the backend.
    pub target_port: i32,
}

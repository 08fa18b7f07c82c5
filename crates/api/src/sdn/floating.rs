//! FloatingIP: a public address mapped one-to-one onto a VPC address.

// `#[kube(printcolumn(...), printcolumn(...))]` repeats `type_ = "string"` by design;
// clippy's duplicated_attributes lint misreads those as duplicate attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::refs::{Condition, LocalVPCRef};

/// Desired state of a FloatingIP, an elastic (public) address mapped one-to-one
/// onto a VPC address, both ways.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sdn.cozystack.io",
    version = "v1alpha1",
    kind = "FloatingIP",
    plural = "floatingips",
    singular = "floatingip",
    namespaced,
    status = "FloatingIPStatus",
    derive = "PartialEq",
    shortname = "flip",
    category = "cozyplane",
    doc = "FloatingIP maps a public address one-to-one onto an address in a VPC.",
    printcolumn(
        name = "VPC",
        type_ = "string",
        json_path = ".spec.vpcRef.name",
        description = "VPC of the target"
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.target",
        description = "VPC address the floating IP maps to"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".status.address",
        description = "Assigned public address"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Floating IP phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.vpcRef.name",
    selectable = ".spec.target"
)]
#[serde(rename_all = "camelCase")]
pub struct FloatingIPSpec {
    /// The VPC (in this namespace) of the target.
    pub vpc_ref: LocalVPCRef,
    /// The VPC address to map.
    pub target: String,
    /// `loadBalancerClass` of the Service that attracts the public address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// Optional address claim passed to the address-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_claim_name: Option<String>,
}

/// Observed state of a FloatingIP.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FloatingIPStatus {
    /// The assigned public address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Conditions: ServiceReady, AddressAssigned, TargetLive, TargetExclusive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

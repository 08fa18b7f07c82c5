//! `local.sdn.cozystack.io/v1alpha1`: FabricIP, a CRD shipped with the CNI (so the
//! default network works before the cozyplane API server exists), served by the
//! API server only in standalone mode.

// `#[kube(printcolumn(...), printcolumn(...))]` repeats `type_ = "string"` by design;
// clippy's duplicated_attributes lint misreads those as duplicate attributes.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a FabricIP, a claim on one underlay (fabric) address. The
/// object name is the claim `f-<escaped address>`, so creation atomically reserves
/// the address.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "local.sdn.cozystack.io",
    version = "v1alpha1",
    kind = "FabricIP",
    plural = "fabricips",
    singular = "fabricip",
    derive = "PartialEq",
    shortname = "fip",
    category = "cozyplane",
    doc = "FabricIP claims one fabric (underlay) address for a pod; its name f-<escaped address> is the claim.",
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".spec.address",
        description = "The claimed fabric address"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.node",
        description = "Node of the claimant pod"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.podName",
        description = "Claimant pod"
    ),
    printcolumn(
        name = "Pod-Namespace",
        type_ = "string",
        json_path = ".spec.podNamespace",
        description = "Namespace of the claimant pod",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since creation"
    ),
    selectable = ".spec.node",
    selectable = ".spec.podNamespace",
    selectable = ".spec.podName",
    selectable = ".spec.podUID"
)]
#[serde(rename_all = "camelCase")]
pub struct FabricIPSpec {
    /// The claimed address in canonical text; must match the object name. Immutable.
    pub address: String,
    /// Node of the claimant pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Namespace of the claimant pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// Name of the claimant pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// UID of the claimant pod; the claim is garbage once no pod has this UID.
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

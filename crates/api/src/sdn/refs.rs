//! Reference and condition types shared by several kinds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};

/// A reference to a VPC in the referring object's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalVPCRef {
    /// Name of the VPC, in the same namespace as this object.
    pub name: String,
}

/// A reference to a VPC that may live in another namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VPCRef {
    /// Namespace of the VPC. Defaults to the referring object's namespace where it
    /// has one; required on cluster-scoped objects (Port, ServiceVIP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the VPC.
    pub name: String,
}

/// A reference to a namespaced object (e.g. the Service behind a ServiceVIP).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// Namespace of the referenced object.
    pub namespace: String,
    /// Name of the referenced object.
    pub name: String,
}

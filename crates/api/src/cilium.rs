//! The `cilium.io/v2` policy kinds Cozystack writes — CiliumNetworkPolicy
//! and CiliumClusterwideNetworkPolicy — as far as cozyplane enforces them
//! (`docs/policy.md`, "The Cilium subset").
//!
//! Only the subset is typed; every other key of a rule, a peer or a port
//! lands in an `other` map, so the compile can report it on the policy
//! instead of silently ignoring it, and a round trip through these types
//! loses nothing the user wrote.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API group.
pub const CILIUM_GROUP: &str = "cilium.io";
/// The version served.
pub const CILIUM_VERSION: &str = "v2";

/// A CiliumNetworkPolicy: rules for the endpoints of its namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumNetworkPolicy {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// One rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CiliumRule>,
    /// More rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub specs: Option<Vec<CiliumRule>>,
    /// Whatever Cilium keeps in status; not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

/// A CiliumClusterwideNetworkPolicy: rules for endpoints of any namespace
/// (`endpointSelector`) or for nodes (`nodeSelector`, host policies).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumClusterwideNetworkPolicy {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// One rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CiliumRule>,
    /// More rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub specs: Option<Vec<CiliumRule>>,
    /// Whatever Cilium keeps in status; not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

macro_rules! cilium_resource {
    ($t:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(CILIUM_GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(CILIUM_VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $t {
            /// Every rule: `spec`, then `specs`.
            pub fn rules(&self) -> impl Iterator<Item = &CiliumRule> {
                self.spec.iter().chain(self.specs.iter().flatten())
            }
        }
    };
}
cilium_resource!(
    CiliumNetworkPolicy,
    "CiliumNetworkPolicy",
    "ciliumnetworkpolicies",
    NamespaceResourceScope
);
cilium_resource!(
    CiliumClusterwideNetworkPolicy,
    "CiliumClusterwideNetworkPolicy",
    "ciliumclusterwidenetworkpolicies",
    ClusterResourceScope
);

/// One policy rule (Cilium's `api.Rule`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumRule {
    /// The endpoints (pods) the rule applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_selector: Option<LabelSelector>,
    /// The nodes the rule applies to (a host policy; clusterwide only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Allowed inbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<CiliumPeerRule>>,
    /// Denied inbound traffic (wins over every allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_deny: Option<Vec<CiliumPeerRule>>,
    /// Allowed outbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<CiliumPeerRule>>,
    /// Denied outbound traffic (wins over every allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_deny: Option<Vec<CiliumPeerRule>>,
    /// Whether the rule isolates its endpoints per direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_default_deny: Option<CiliumDefaultDeny>,
    /// Free-form text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Rule labels (Cilium's own bookkeeping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Value>,
    /// Anything else: outside the subset.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `enableDefaultDeny`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumDefaultDeny {
    /// Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<bool>,
    /// Egress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<bool>,
}

/// An ingress or egress allow rule: peers (`from*` for ingress, `to*` for
/// egress) and ports. The direction's prefix is read by the compile; the
/// other direction's keys are outside the subset there.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumPeerRule {
    /// Ingress peers by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_endpoints: Option<Vec<LabelSelector>>,
    /// Ingress peers by CIDR.
    #[serde(default, rename = "fromCIDR", skip_serializing_if = "Option::is_none")]
    pub from_cidr: Option<Vec<String>>,
    /// Ingress peers by CIDR with exceptions.
    #[serde(
        default,
        rename = "fromCIDRSet",
        skip_serializing_if = "Option::is_none"
    )]
    pub from_cidr_set: Option<Vec<CiliumCidrRule>>,
    /// Ingress peers by entity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_entities: Option<Vec<String>>,
    /// Egress peers by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_endpoints: Option<Vec<LabelSelector>>,
    /// Egress peers by CIDR.
    #[serde(default, rename = "toCIDR", skip_serializing_if = "Option::is_none")]
    pub to_cidr: Option<Vec<String>>,
    /// Egress peers by CIDR with exceptions.
    #[serde(default, rename = "toCIDRSet", skip_serializing_if = "Option::is_none")]
    pub to_cidr_set: Option<Vec<CiliumCidrRule>>,
    /// Egress peers by entity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_entities: Option<Vec<String>>,
    /// Ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_ports: Option<Vec<CiliumPortRule>>,
    /// Anything else (`toFQDNs`, `toServices`, `fromRequires`, `icmps`…):
    /// outside the subset.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A `fromCIDRSet`/`toCIDRSet` entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumCidrRule {
    /// The block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// Sub-blocks excluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
    /// Anything else (`cidrGroupRef`…): outside the subset.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A `toPorts` entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumPortRule {
    /// The ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<CiliumPort>>,
    /// Anything else (L7 `rules`, TLS, `serverNames`…): outside the subset.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A port of a `toPorts` entry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CiliumPort {
    /// A number, a container port's name, or `0`/absent for every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    /// The last port of a range starting at `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i32>,
    /// `TCP`, `UDP`, `SCTP` or `ANY` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Anything else: outside the subset.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_policy_round_trips_with_what_is_outside_the_subset() {
        let v = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {
                "endpointSelector": {"matchLabels": {"app": "web"}},
                "egress": [{
                    "toFQDNs": [{"matchName": "example.com"}],
                    "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}],
                                 "rules": {"http": [{}]}}]
                }]
            },
            "specs": [{"endpointSelector": {}, "ingress": [{}]}]
        });
        let p: CiliumNetworkPolicy = serde_json::from_value(v.clone()).unwrap();
        let rules: Vec<&CiliumRule> = p.rules().collect();
        assert_eq!(rules.len(), 2);
        let egress = &rules[0].egress.as_ref().unwrap()[0];
        assert!(egress.other.contains_key("toFQDNs"));
        let ports = &egress.to_ports.as_ref().unwrap()[0];
        assert!(ports.other.contains_key("rules"));
        assert_eq!(
            ports.ports.as_ref().unwrap()[0].port,
            Some(IntOrString::String("443".into()))
        );
        let mut back = serde_json::to_value(&p).unwrap();
        back.as_object_mut()
            .unwrap()
            .insert("apiVersion".into(), v["apiVersion"].clone());
        back.as_object_mut()
            .unwrap()
            .insert("kind".into(), v["kind"].clone());
        assert_eq!(back, v);
    }

    #[test]
    fn the_kinds_name_their_group_and_plural() {
        use kube::Resource;
        assert_eq!(CiliumNetworkPolicy::api_version(&()), "cilium.io/v2");
        assert_eq!(
            CiliumClusterwideNetworkPolicy::plural(&()),
            "ciliumclusterwidenetworkpolicies"
        );
        assert_eq!(
            CiliumNetworkPolicy::url_path(&(), Some("x")),
            "/apis/cilium.io/v2/namespaces/x/ciliumnetworkpolicies"
        );
    }
}

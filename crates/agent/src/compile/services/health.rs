//! `healthCheckNodePort`: what this node's health-check server answers for each
//! `type: LoadBalancer` Service with `externalTrafficPolicy: Local` (kube-proxy's
//! contract). A cloud load balancer probes every node on that port and sends
//! traffic only to nodes that answer 200, i.e. nodes with a ready endpoint of the
//! Service: the per-packet load balancer drops etp Local traffic on a node without
//! one, so without these answers the load balancer would send clients into a drop.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{ours, slices_by_service, NodeView};

/// One health-check port's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Ready endpoints of the Service on this node (distinct addresses).
    pub local_endpoints: usize,
}

/// The health-check ports this node serves, by port. Pure. A port two Services
/// claim (the API server's allocator prevents it) goes to the first by
/// namespace/name, the same on every node.
pub fn health_checks<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node: &NodeView,
) -> BTreeMap<u16, HealthCheck> {
    let mut out = BTreeMap::new();
    let mut wanted: Vec<(&str, &str, u16)> = Vec::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        if spec.type_.as_deref() != Some("LoadBalancer")
            || spec.external_traffic_policy.as_deref() != Some("Local")
            || !ours(svc, node)
        {
            continue;
        }
        let Some(port) = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0)
        else {
            continue;
        };
        wanted.push((
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default(),
            port,
        ));
    }
    if wanted.is_empty() {
        return out;
    }
    wanted.sort();
    let slices_of = slices_by_service(slices);
    for (ns, name, port) in wanted {
        if out.contains_key(&port) {
            continue;
        }
        let mut local = BTreeSet::new();
        for slice in slices_of.get(&(ns, name)).into_iter().flatten() {
            for ep in slice.endpoints.iter().flatten() {
                // Unset `ready` means ready (the EndpointSlice API's rule).
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if ready && ep.node_name.as_deref() == Some(node.name.as_str()) {
                    local.extend(ep.addresses.iter().cloned());
                }
            }
        }
        out.insert(
            port,
            HealthCheck {
                namespace: ns.to_string(),
                name: name.to_string(),
                local_endpoints: local.len(),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::compile::services::LABEL_SERVICE_NAME;
    use serde_json::json;

    fn node() -> NodeView {
        NodeView {
            name: "n1".into(),
            ..NodeView::default()
        }
    }

    fn svc(name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": name}, "spec": spec
        }))
        .unwrap()
    }

    fn slice(svc: &str, eps: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": format!("{svc}-x"),
                "labels": {LABEL_SERVICE_NAME: svc}},
            "addressType": "IPv4", "endpoints": eps
        }))
        .unwrap()
    }

    #[test]
    fn etp_local_load_balancers_report_their_ready_local_endpoints() {
        let lb = |name: &str, etp: &str, hc: u16| {
            svc(
                name,
                json!({"type": "LoadBalancer", "externalTrafficPolicy": etp,
                    "healthCheckNodePort": hc, "ports": [{"port": 80}]}),
            )
        };
        let services = [
            lb("web", "Local", 31000),
            lb("db", "Local", 31001),
            lb("cluster", "Cluster", 31002),
            svc(
                "np",
                json!({"type": "NodePort", "externalTrafficPolicy": "Local",
                "ports": [{"port": 80}]}),
            ),
        ];
        let slices = [
            slice(
                "web",
                json!([
                    {"addresses": ["10.0.1.5"], "nodeName": "n1"},
                    {"addresses": ["10.0.1.6"], "nodeName": "n1", "conditions": {"ready": false}},
                    {"addresses": ["10.0.2.7"], "nodeName": "n2"},
                    {"addresses": ["10.0.1.5"], "nodeName": "n1", "conditions": {"ready": true}}
                ]),
            ),
            slice("db", json!([{"addresses": ["10.0.2.8"], "nodeName": "n2"}])),
        ];
        let hc = health_checks(&services, &slices, &node());
        assert_eq!(
            hc.keys().copied().collect::<Vec<_>>(),
            [31000, 31001],
            "etp Local LoadBalancers only"
        );
        assert_eq!(
            hc[&31000].local_endpoints, 1,
            "ready, on this node, counted once"
        );
        assert_eq!(hc[&31000].name, "web");
        assert_eq!(hc[&31001].local_endpoints, 0, "none here: 503");
    }

    #[test]
    fn another_proxys_service_is_not_served() {
        let mut s = svc(
            "web",
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                "healthCheckNodePort": 31000, "ports": [{"port": 80}]}),
        );
        s.metadata.labels = Some(
            [(
                super::super::LABEL_SERVICE_PROXY_NAME.to_string(),
                "other".to_string(),
            )]
            .into(),
        );
        assert!(health_checks(&[s], &[], &node()).is_empty());
    }
}

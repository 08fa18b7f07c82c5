//! Keeps the pod-label snapshot on this node's Ports current.
//!
//! SecurityGroups select pods by label, and every node must know the groups
//! of every Port: a source is recognised by its membership on the receiving
//! node. Rather than every agent watching every pod of the cluster, each
//! Port carries its pod's labels (`sdn.cozystack.io/pod-labels`, sorted
//! JSON), written at attach from the live pod; the agent of the pod's node
//! watches only its own node's pods and rewrites the snapshot of its own
//! Ports when a pod's labels change. Remote agents see the change as a Port
//! event. The agent may write only its own node's Ports (node restriction),
//! so a node can never relabel another node's pods.
//!
//! Until the rewrite lands, other nodes judge the pod by its old labels,
//! and the pod's own node by its new ones: a label change takes effect
//! like any other policy change, within a watch round trip.
//!
//! Default-network pods are known the same way for NetworkPolicy: each
//! address claim (FabricIP) carries its pod's labels and named container
//! ports (`sdn.cozystack.io/pod-labels`, `sdn.cozystack.io/pod-ports`),
//! kept current by the agent of the pod's node ([`stale_fabric_snapshots`]).

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

use cozyplane_api::labels::{ANNOTATION_POD_LABELS, ANNOTATION_POD_PORTS, LABEL_POD_UID};
use cozyplane_api::{FabricIP, Port};
use cozyplane_errors::Chain;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::compile::netpol::{named_ports, ports_snapshot};
use crate::tenancy::labels_snapshot;

/// One Port whose snapshot is stale: its name and the snapshot it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleSnapshot {
    /// The Port.
    pub port: String,
    /// The current snapshot ([`labels_snapshot`] of the pod's labels).
    pub labels: String,
}

/// The Ports of `node` whose pod (same namespace, name and UID) is in
/// `pods` and whose snapshot differs from the pod's labels. A Port whose
/// pod is not in `pods` (gone, or not yet seen) is left alone: the snapshot
/// is only ever replaced by the live truth.
pub fn stale_snapshots(ports: &[Port], pods: &[Pod], node: &str) -> Vec<StaleSnapshot> {
    let by_name: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .filter_map(|p| {
            Some((
                (
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?,
                ),
                p,
            ))
        })
        .collect();
    let empty = BTreeMap::new();
    let mut out = Vec::new();
    for port in ports {
        if port.spec.node.as_deref() != Some(node) || port.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(ns), Some(name), Some(port_name)) = (
            port.spec.pod_namespace.as_deref(),
            port.spec.pod_name.as_deref(),
            port.metadata.name.as_deref(),
        ) else {
            continue;
        };
        let Some(pod) = by_name.get(&(ns, name)) else {
            continue;
        };
        let uid = port
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_POD_UID));
        if uid.is_none() || uid != pod.metadata.uid.as_ref() {
            continue; // another pod of that name: not this Port's
        }
        let want = labels_snapshot(pod.metadata.labels.as_ref().unwrap_or(&empty));
        let have = port
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_POD_LABELS));
        if have != Some(&want) {
            out.push(StaleSnapshot {
                port: port_name.to_string(),
                labels: want,
            });
        }
    }
    out
}

/// Writes each snapshot (a merge patch of the one annotation); returns how
/// many were written. A failure is logged and retried by a later pass.
pub async fn refresh(client: &Client, stale: &[StaleSnapshot]) -> usize {
    let api: Api<Port> = Api::all(client.clone());
    let mut written = 0;
    for s in stale {
        let patch = json!({"metadata": {"annotations": {ANNOTATION_POD_LABELS: s.labels}}});
        match api
            .patch(&s.port, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => written += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {} // released meanwhile
            Err(e) => {
                tracing::warn!(port = %s.port, error = %Chain(&e), "could not refresh the pod-label snapshot (retrying)");
            }
        }
    }
    written
}

/// One FabricIP whose pod snapshot is stale: its name and what it should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFabricSnapshot {
    /// The FabricIP.
    pub name: String,
    /// The labels snapshot ([`labels_snapshot`]).
    pub labels: String,
    /// The named-ports snapshot ([`ports_snapshot`]).
    pub ports: String,
}

/// The FabricIPs of `node` whose pod (by UID) is in `pods` and whose
/// snapshots differ from the pod's labels and named ports.
pub fn stale_fabric_snapshots(
    fabric_ips: &[impl Borrow<FabricIP>],
    pods: &[Pod],
    node: &str,
) -> Vec<StaleFabricSnapshot> {
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let empty = BTreeMap::new();
    let mut out = Vec::new();
    for f in fabric_ips {
        let f: &FabricIP = f.borrow();
        if f.spec.node.as_deref() != Some(node) || f.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(name), Some(pod)) = (
            f.metadata.name.as_deref(),
            f.spec.pod_uid.as_deref().and_then(|u| by_uid.get(u)),
        ) else {
            continue;
        };
        let labels = labels_snapshot(pod.metadata.labels.as_ref().unwrap_or(&empty));
        let ports = ports_snapshot(&named_ports(pod));
        let notes = f.metadata.annotations.as_ref();
        if notes.and_then(|a| a.get(ANNOTATION_POD_LABELS)) != Some(&labels)
            || notes.and_then(|a| a.get(ANNOTATION_POD_PORTS)) != Some(&ports)
        {
            out.push(StaleFabricSnapshot {
                name: name.to_string(),
                labels,
                ports,
            });
        }
    }
    out
}

/// Writes each FabricIP snapshot (a merge patch of the two annotations),
/// up to 16 at once: the sync loop waits for this, and a burst of new pods
/// must not hold back the next pass (a new pod's SecurityGroups and
/// NetworkPolicies are programmed by it). Returns how many were written; a
/// failure is logged and retried by a later pass.
pub async fn refresh_fabric(client: &Client, stale: &[StaleFabricSnapshot]) -> usize {
    use futures::StreamExt;
    let api: Api<FabricIP> = Api::all(client.clone());
    // owned items: a stream of borrows does not satisfy the spawned
    // task's higher-ranked bounds
    futures::stream::iter(stale.to_vec())
        .map(move |s| {
            let api = api.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {
                    ANNOTATION_POD_LABELS: s.labels, ANNOTATION_POD_PORTS: s.ports}}});
                match api
                    .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => 1,
                    Err(kube::Error::Api(e)) if e.code == 404 => 0, // released meanwhile
                    Err(e) => {
                        tracing::warn!(fabric_ip = %s.name, error = %Chain(&e), "could not refresh the pod snapshot (retrying)");
                        0
                    }
                }
            }
        })
        .buffer_unordered(16)
        .fold(0usize, |n, w: usize| async move { n + w })
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use cozyplane_api::sdn::{PortSpec, VPCRef};
    use kube::api::ObjectMeta;

    fn pod(ns: &str, name: &str, uid: &str, labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                labels: (!labels.is_empty()).then(|| {
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn port(name: &str, node: &str, pod: (&str, &str, &str), snapshot: Option<&str>) -> Port {
        Port {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(LABEL_POD_UID.into(), pod.2.into())])),
                annotations: snapshot
                    .map(|s| BTreeMap::from([(ANNOTATION_POD_LABELS.into(), s.into())])),
                ..ObjectMeta::default()
            },
            spec: PortSpec {
                vpc_ref: VPCRef {
                    namespace: Some("t1".into()),
                    name: "net".into(),
                },
                ip: "10.0.0.2".into(),
                mac: None,
                node: Some(node.into()),
                node_ip: None,
                pod_namespace: Some(pod.0.into()),
                pod_name: Some(pod.1.into()),
                gateway: None,
            },
            status: None,
        }
    }

    #[test]
    fn only_this_nodes_ports_of_live_pods_with_changed_labels_are_rewritten() {
        let pods = [
            pod("app", "web", "u1", &[("role", "web"), ("tier", "a")]),
            pod("app", "db", "u2", &[("role", "db")]),
            pod("app", "bare", "u3", &[]),
            pod("app", "reborn", "new-uid", &[("role", "web")]),
        ];
        let ports = [
            // labels changed since attach: rewritten, sorted
            port(
                "v100.10.0.0.2",
                "n1",
                ("app", "web", "u1"),
                Some(r#"{"role":"db"}"#),
            ),
            // already current
            port(
                "v100.10.0.0.3",
                "n1",
                ("app", "db", "u2"),
                Some(r#"{"role":"db"}"#),
            ),
            // no snapshot yet, pod without labels: `{}`
            port("v100.10.0.0.4", "n1", ("app", "bare", "u3"), None),
            // another node's Port: never ours to write
            port("v100.10.0.0.5", "n2", ("app", "web", "u1"), Some("{}")),
            // the pod is gone (not in the list): left alone
            port("v100.10.0.0.6", "n1", ("app", "gone", "u9"), Some("{}")),
            // a pod of the same name but another UID: not this Port's pod
            port(
                "v100.10.0.0.7",
                "n1",
                ("app", "reborn", "old-uid"),
                Some("{}"),
            ),
        ];
        let got = stale_snapshots(&ports, &pods, "n1");
        assert_eq!(
            got,
            vec![
                StaleSnapshot {
                    port: "v100.10.0.0.2".into(),
                    labels: r#"{"role":"web","tier":"a"}"#.into()
                },
                StaleSnapshot {
                    port: "v100.10.0.0.4".into(),
                    labels: "{}".into()
                },
            ]
        );
    }
}

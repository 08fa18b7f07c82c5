//! The real cozyplane API server in process (standalone mode, embedded
//! store, TLS) and a kube client from the kubeconfig it writes, plus
//! builders for pods and for FabricIP claims shaped exactly like the
//! agent's IPAM makes them (`Claimant::claim_for` in crates/agent).
//!
//! The embedded-store harness runs everywhere (no root, no system binary);
//! the etcd one needs `/usr/bin/etcd`.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;

use cozyplane_api::labels::{LABEL_FABRIC_NODE, LABEL_FABRIC_POD_NAMESPACE, LABEL_FABRIC_POD_UID};
use cozyplane_api::local::FabricIPSpec;
use cozyplane_api::FabricIP;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;

#[allow(unused_imports)] // each test binary uses a different subset
pub use cozyplane_testkit::apiserver::{
    standalone as start, standalone_on as start_on, TestServer as Harness,
};

/// Creates a pod; returns its server-assigned UID.
pub async fn create_pod(client: &Client, ns: &str, name: &str) -> String {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.k8s.io/pause:3.9".into()),
                ..Container::default()
            }],
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let made = api
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    made.metadata.uid.expect("pod uid")
}

/// Deletes a pod for good, as its kubelet does once it has stopped it
/// (grace 0): there is no kubelet here to finish a graceful deletion, and a
/// bound pod deleted gracefully would stay (Terminating) for its grace period.
pub async fn delete_pod(client: &Client, ns: &str, name: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.delete(
        name,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("delete pod");
}

/// A claim of `10.244.0.<n>` as the agent's IPAM writes it: name
/// `f-10-244-0-<n>`, labels pod-uid / pod-namespace / node, attachment
/// annotation, spec with address, node and the pod's namespace, name, UID.
pub fn claim(n: u8, ns: &str, pod: &str, pod_uid: &str) -> FabricIP {
    let labels = BTreeMap::from([
        (LABEL_FABRIC_POD_UID.to_string(), pod_uid.to_string()),
        (LABEL_FABRIC_POD_NAMESPACE.to_string(), ns.to_string()),
        (LABEL_FABRIC_NODE.to_string(), "node-a".to_string()),
    ]);
    let annotations = BTreeMap::from([(
        "local.sdn.cozystack.io/attachment".to_string(),
        format!("ctr-{pod}/eth0"),
    )]);
    FabricIP {
        metadata: ObjectMeta {
            name: Some(format!("f-10-244-0-{n}")),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: FabricIPSpec {
            address: format!("10.244.0.{n}"),
            node: Some("node-a".into()),
            pod_namespace: Some(ns.into()),
            pod_name: Some(pod.into()),
            pod_uid: Some(pod_uid.into()),
        },
    }
}

/// Creates a claim; returns the stored object.
pub async fn create_claim(client: &Client, claim: &FabricIP) -> FabricIP {
    Api::<FabricIP>::all(client.clone())
        .create(&PostParams::default(), claim)
        .await
        .expect("create claim")
}

pub async fn claim_exists(client: &Client, name: &str) -> bool {
    Api::<FabricIP>::all(client.clone())
        .get_opt(name)
        .await
        .expect("get claim")
        .is_some()
}

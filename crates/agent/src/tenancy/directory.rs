//! [`VpcDirectory`] over the Kubernetes API. Every read that decides
//! whether a pod may join a VPC is live: gets and lists without a
//! `resourceVersion` are answered from storage, never from a watch cache (a
//! binding deleted a moment ago must not admit a pod).
//!
//! One exception, for the ADD latency: the pod itself (its `vpc` annotation
//! and labels) is read from the agent's watch of this node's pods
//! ([`NodePods`]) when the watch holds it with the UID the runtime passed,
//! and from the API otherwise. The scheduler binds a pod before its sandbox
//! starts, so the watch nearly always has it. A cached annotation can be a
//! few milliseconds old only if the pod's owner edited it meanwhile; it is
//! still the owner's choice, and the binding that admits the pod to that
//! VPC is read live, so no tenant gains anything from the lag.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use cozyplane_api::labels::{ANNOTATION_VPC, ANNOTATION_VPC_IP, ANNOTATION_VPC_MAC};
use cozyplane_api::{VPCBinding, VPC};
use cozyplane_errors::Chain;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;

use super::{AttachError, PodFacts, VpcDirectory};
use crate::ipam::StoreError;

/// See the module docs.
#[derive(Clone)]
pub struct KubeDirectory {
    client: Client,
    pods: NodePods,
}

impl KubeDirectory {
    /// A directory over `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            pods: NodePods::default(),
        }
    }

    /// Reads pods from `pods` when it holds them (see the module docs).
    pub fn with_node_pods(mut self, pods: NodePods) -> Self {
        self.pods = pods;
        self
    }
}

/// This node's pods as the agent's watch holds them: empty until the watch
/// has started and hands its store over ([`NodePods::set`]).
#[derive(Clone, Default)]
pub struct NodePods(Arc<OnceLock<Store<Pod>>>);

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("watching", &self.0.get().is_some())
            .finish()
    }
}

impl NodePods {
    /// Hands over the watch's store (the first call wins).
    pub fn set(&self, store: Store<Pod>) {
        let _ = self.0.set(store);
    }

    /// The pod `namespace/name`, if the watch holds it with `uid`.
    pub fn get(&self, namespace: &str, name: &str, uid: &str) -> Option<Arc<Pod>> {
        let pod = self.0.get()?.get(&ObjectRef::new(name).within(namespace))?;
        (pod.metadata.uid.as_deref() == Some(uid)).then_some(pod)
    }
}

fn pod_facts(pod: &Pod) -> PodFacts {
    PodFacts {
        vpc: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_VPC).cloned()),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
    }
}

fn classify(e: kube::Error) -> AttachError {
    let text = Chain(&e).to_string();
    AttachError::Store(match &e {
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => {
            StoreError::Rejected(text)
        }
        _ => StoreError::Unavailable(text),
    })
}

#[async_trait]
impl VpcDirectory for KubeDirectory {
    async fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<PodFacts, AttachError> {
        if let Some(pod) = self.pods.get(namespace, name, uid) {
            return Ok(pod_facts(&pod));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = pods.get_opt(name).await.map_err(classify)?;
        let pod = pod
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
            .ok_or_else(|| AttachError::PodNotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: uid.to_string(),
            })?;
        Ok(pod_facts(&pod))
    }

    async fn bound(
        &self,
        namespace: &str,
        vpc_namespace: &str,
        vpc: &str,
    ) -> Result<bool, AttachError> {
        let api: Api<VPCBinding> = Api::namespaced(self.client.clone(), namespace);
        let list = api.list(&ListParams::default()).await.map_err(classify)?;
        Ok(list.items.iter().any(|b| {
            b.metadata.deletion_timestamp.is_none()
                && b.spec.vpc_ref.name == vpc
                && b.spec.vpc_ref.namespace.as_deref().unwrap_or(namespace) == vpc_namespace
        }))
    }

    async fn vpc(&self, namespace: &str, name: &str) -> Result<Option<VPC>, AttachError> {
        let api: Api<VPC> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(classify)
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        ips: &[IpAddr],
        mac: &str,
    ) -> Result<(), AttachError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        // The UID in the patch is a precondition: a re-created pod of the
        // same name is not annotated with this one's addresses.
        let patch = serde_json::json!({
            "metadata": {
                "uid": uid,
                "annotations": {
                    ANNOTATION_VPC_IP: ips.join(","),
                    ANNOTATION_VPC_MAC: mac,
                }
            }
        });
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn pod(ns: &str, name: &str, uid: &str, vpc: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": ns, "name": name, "uid": uid,
                "labels": {"app": "web"},
                "annotations": vpc.map(|v| serde_json::json!({ANNOTATION_VPC: v})),
            }
        }))
        .unwrap()
    }

    #[test]
    fn node_pods_answer_only_for_the_runtime_s_uid() {
        let pods = NodePods::default();
        assert!(
            pods.get("t", "a", "u1").is_none(),
            "nothing before the watch"
        );
        let (store, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&watcher::Event::Apply(pod("t", "a", "u1", Some("net"))));
        pods.set(store);
        let hit = pods.get("t", "a", "u1").expect("cached");
        let facts = pod_facts(&hit);
        assert_eq!(facts.vpc.as_deref(), Some("net"));
        assert_eq!(facts.labels.get("app").map(String::as_str), Some("web"));
        // a re-created pod of the same name (another UID): not this one
        assert!(pods.get("t", "a", "u2").is_none());
        assert!(pods.get("other", "a", "u1").is_none());
        // the first store stays
        let (empty, _) = reflector::store::<Pod>();
        pods.set(empty);
        assert!(pods.get("t", "a", "u1").is_some());
    }
}

//! [`VpcDirectory`] over the Kubernetes API. Every read is live: gets and
//! lists without a `resourceVersion` are answered from storage, never from
//! a watch cache (a binding deleted a moment ago must not admit a pod).

use std::net::IpAddr;

use async_trait::async_trait;
use cozyplane_api::labels::{ANNOTATION_VPC, ANNOTATION_VPC_IP, ANNOTATION_VPC_MAC};
use cozyplane_api::{VPCBinding, VPC};
use cozyplane_errors::Chain;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::Client;

use super::{AttachError, PodFacts, VpcDirectory};
use crate::ipam::StoreError;

/// See the module docs.
#[derive(Clone)]
pub struct KubeDirectory {
    client: Client,
}

impl KubeDirectory {
    /// A directory over `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
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
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = pods.get_opt(name).await.map_err(classify)?;
        let pod = pod
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
            .ok_or_else(|| AttachError::PodNotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: uid.to_string(),
            })?;
        Ok(PodFacts {
            vpc: pod
                .metadata
                .annotations
                .and_then(|mut a| a.remove(ANNOTATION_VPC)),
            labels: pod.metadata.labels.unwrap_or_default(),
        })
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

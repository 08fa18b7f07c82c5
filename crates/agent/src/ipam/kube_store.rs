//! [`ClaimStore`] over the Kubernetes API (`kube::Api<FabricIP>`).
//!
//! Every call is a live request: lists carry no `resourceVersion`, so the
//! API server answers from its storage (a quorum read), never from a watch
//! cache; creates rely on the server's name uniqueness; deletes carry a UID
//! precondition so a claim re-created by somebody else is never removed.

use async_trait::async_trait;
use cozyplane_api::labels::{LABEL_FABRIC_NODE, LABEL_FABRIC_POD_UID};
use cozyplane_api::FabricIP;
use cozyplane_errors::Chain;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::Client;

use super::store::{ClaimStore, Created, Deleted, StoreError};

/// See the module docs.
#[derive(Clone)]
pub struct KubeClaimStore {
    api: Api<FabricIP>,
}

impl KubeClaimStore {
    /// FabricIPs are cluster-scoped.
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }

    async fn list_by_label(&self, key: &str, value: &str) -> Result<Vec<FabricIP>, StoreError> {
        let lp = ListParams::default().labels(&format!("{key}={value}"));
        self.api.list(&lp).await.map(|l| l.items).map_err(classify)
    }
}

/// Maps a kube error onto the two cases the allocator distinguishes (the
/// text keeps the whole chain: a transport error's cause is in its sources).
fn classify(e: kube::Error) -> StoreError {
    let text = Chain(&e).to_string();
    match &e {
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => {
            StoreError::Rejected(text)
        }
        _ => StoreError::Unavailable(text),
    }
}

#[async_trait]
impl ClaimStore for KubeClaimStore {
    async fn create(&self, claim: &FabricIP) -> Result<Created, StoreError> {
        match self.api.create(&PostParams::default(), claim).await {
            Ok(obj) => Ok(Created::Created(Box::new(obj))),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Created::AlreadyExists),
            Err(e) => Err(classify(e)),
        }
    }

    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(name, &dp).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Deleted::NotFound),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Deleted::UidMismatch),
            Err(e) => Err(classify(e)),
        }
    }

    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.list_by_label(LABEL_FABRIC_POD_UID, pod_uid).await
    }

    async fn list_by_node(&self, node: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.list_by_label(LABEL_FABRIC_NODE, node).await
    }

    async fn get(&self, name: &str) -> Result<Option<FabricIP>, StoreError> {
        self.api.get_opt(name).await.map_err(classify)
    }
}

//! [`ClaimStore`] over the Kubernetes API (`kube::Api<FabricIP>`, `kube::Api<Port>`).
//!
//! Every call is a live request: lists carry no `resourceVersion`, so the
//! API server answers from its storage (a quorum read), never from a watch
//! cache; creates rely on the server's name uniqueness; deletes carry a UID
//! precondition so a claim re-created by somebody else is never removed.

use std::fmt::Debug;

use async_trait::async_trait;
use cozyplane_api::FabricIP;
use cozyplane_errors::Chain;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::ClusterResourceScope;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::store::{ClaimObject, ClaimStore, Created, Deleted, StoreError};

/// What a claim kind must be to live in the API: a cluster-scoped resource
/// (FabricIP and Port both are).
pub trait ApiClaim:
    ClaimObject
    + Resource<DynamicType = (), Scope = ClusterResourceScope>
    + Serialize
    + DeserializeOwned
    + Debug
{
}

impl<O> ApiClaim for O where
    O: ClaimObject
        + Resource<DynamicType = (), Scope = ClusterResourceScope>
        + Serialize
        + DeserializeOwned
        + Debug
{
}

/// See the module docs.
#[derive(Clone)]
pub struct KubeClaimStore<O = FabricIP>
where
    O: ApiClaim,
{
    api: Api<O>,
}

impl<O: ApiClaim> KubeClaimStore<O> {
    /// Claims are cluster-scoped.
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }

    async fn list_by_label(&self, key: &str, value: &str) -> Result<Vec<O>, StoreError> {
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
impl<O: ApiClaim> ClaimStore<O> for KubeClaimStore<O> {
    async fn create(&self, claim: &O) -> Result<Created<O>, StoreError> {
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

    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<O>, StoreError> {
        self.list_by_label(O::POD_UID_LABEL, pod_uid).await
    }

    async fn list_by_node(&self, node: &str) -> Result<Vec<O>, StoreError> {
        self.list_by_label(O::NODE_LABEL, node).await
    }

    async fn get(&self, name: &str) -> Result<Option<O>, StoreError> {
        self.api.get_opt(name).await.map_err(classify)
    }
}

//! Where claims live: the [`ClaimStore`] trait and the claim object's shape.
//!
//! # Why creation is the allocation
//! The object name is the address (`f-<escaped ip>`), and a name exists at most
//! once in the API server, so "create succeeded" *is* "this address is ours".
//! No allocator process, no lock, no read-modify-write of a bitmap: two agents
//! (or two ADDs in one agent) racing for one address get exactly one
//! `Created` and one `AlreadyExists`. Every read the allocator does is a live
//! read through this trait, never an informer cache (the upstream lesson:
//! cache lag produced duplicates and premature garbage collection).
//!
//! # Which claim belongs to which attachment
//! Labels carry the pod UID, namespace and node (the controller's GC and the
//! reverse lookups use them). The CNI attachment (`<containerID>/<ifname>`) is
//! an annotation ([`ANNOTATION_ATTACHMENT`]): it is what makes a retried ADD
//! reuse its claim and what lets DEL and GC tell a sandbox's claim from a
//! newer sandbox's claim of the same pod.

use std::collections::BTreeMap;
use std::net::IpAddr;

use async_trait::async_trait;
use cozyplane_api::labels::{LABEL_FABRIC_NODE, LABEL_FABRIC_POD_NAMESPACE, LABEL_FABRIC_POD_UID};
use cozyplane_api::local::FabricIPSpec;
use cozyplane_api::names::{fabric_ip_name, hex_rfc5952};
use cozyplane_api::FabricIP;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// FabricIP annotation: the CNI attachment holding the claim, `<containerID>/<ifname>`.
pub const ANNOTATION_ATTACHMENT: &str = "local.sdn.cozystack.io/attachment";

/// A store failure. `Unavailable` is worth retrying (the runtime gets "try
/// again later"); `Rejected` is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The API server could not be reached or timed out; the outcome of a
    /// write is unknown.
    #[error("claim store unavailable: {0}")]
    Unavailable(String),
    /// The API server refused the request (forbidden, invalid, …).
    #[error("claim store rejected the request: {0}")]
    Rejected(String),
}

/// The result of a create.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The claim is ours; the stored object (with its server-assigned UID).
    Created(Box<FabricIP>),
    /// Somebody already holds that name (that address).
    AlreadyExists,
}

/// The result of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The object was deleted.
    Deleted,
    /// There was no such object (already released).
    NotFound,
    /// An object of that name exists but has another UID: somebody re-claimed
    /// the address after ours went away; it is not ours to delete.
    UidMismatch,
}

/// The claim operations the allocator needs. Implementations must be live
/// (no cache) and `create` must be atomic on the object name.
#[async_trait]
pub trait ClaimStore: Send + Sync {
    /// Creates `claim`; `AlreadyExists` when its name is taken.
    async fn create(&self, claim: &FabricIP) -> Result<Created, StoreError>;
    /// Deletes `name` only if its `metadata.uid` is `uid`.
    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError>;
    /// Every claim labelled with this pod UID.
    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<FabricIP>, StoreError>;
    /// Every claim labelled with this node (for CNI GC).
    async fn list_by_node(&self, node: &str) -> Result<Vec<FabricIP>, StoreError>;
    /// One claim by name.
    async fn get(&self, name: &str) -> Result<Option<FabricIP>, StoreError>;
}

/// Who asks for an address: the pod and the CNI attachment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claimant {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (required: the controller's GC keys on it).
    pub uid: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// This node.
    pub node: String,
}

impl Claimant {
    /// The value of [`ANNOTATION_ATTACHMENT`] for this claimant.
    pub fn attachment(&self) -> String {
        attachment_key(&self.container_id, &self.ifname)
    }

    /// The FabricIP object that claims `ip` for this claimant.
    pub fn claim_for(&self, ip: IpAddr) -> FabricIP {
        let labels = BTreeMap::from([
            (LABEL_FABRIC_POD_UID.to_string(), self.uid.clone()),
            (
                LABEL_FABRIC_POD_NAMESPACE.to_string(),
                self.namespace.clone(),
            ),
            (LABEL_FABRIC_NODE.to_string(), self.node.clone()),
        ]);
        let annotations = BTreeMap::from([(ANNOTATION_ATTACHMENT.to_string(), self.attachment())]);
        FabricIP {
            metadata: ObjectMeta {
                name: Some(fabric_ip_name(ip)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: FabricIPSpec {
                address: canonical_text(ip),
                node: Some(self.node.clone()),
                pod_namespace: Some(self.namespace.clone()),
                pod_name: Some(self.name.clone()),
                pod_uid: Some(self.uid.clone()),
            },
        }
    }
}

/// `<containerID>/<ifname>`: the CNI spec's primary key of an attachment.
pub fn attachment_key(container_id: &str, ifname: &str) -> String {
    format!("{container_id}/{ifname}")
}

/// The canonical text of an address as the API stores it (pure hex for IPv6,
/// matching the claim name).
pub fn canonical_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => hex_rfc5952(v6),
    }
}

/// The attachment a stored claim is annotated with.
pub fn claim_attachment(claim: &FabricIP) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_ATTACHMENT)
        .map(String::as_str)
}

/// The address a stored claim holds, if its name and spec agree.
pub fn claim_address(claim: &FabricIP) -> Option<IpAddr> {
    let name = claim.metadata.name.as_deref()?;
    let ip = cozyplane_api::names::parse_fabric_ip_name(name).ok()?;
    (claim.spec.address == canonical_text(ip)).then_some(ip)
}

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
use cozyplane_api::labels::{
    LABEL_FABRIC_NODE, LABEL_FABRIC_POD_NAMESPACE, LABEL_FABRIC_POD_UID, LABEL_NODE,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, LABEL_VPC, LABEL_VPC_NAMESPACE,
};
use cozyplane_api::local::FabricIPSpec;
use cozyplane_api::names::{fabric_ip_name, hex_rfc5952, parse_port_name, port_name};
use cozyplane_api::sdn::{PortSpec, VPCRef};
use cozyplane_api::{FabricIP, Port};
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

/// An object whose name is an address claim: a `FabricIP` (net 0) or a
/// `Port` (an address in a VPC). The allocator only needs its metadata, the
/// address it holds and the pod it was made for; the labels it is found by
/// differ per kind.
pub trait ClaimObject: Clone + Send + Sync + 'static {
    /// The label carrying the claimant pod's UID.
    const POD_UID_LABEL: &'static str;
    /// The label carrying the node the claim was made on.
    const NODE_LABEL: &'static str;
    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Mutable metadata (stores assign the UID).
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// The address the claim holds, if its name and spec agree.
    fn address(&self) -> Option<IpAddr>;
    /// The claimant pod's UID as the spec records it.
    fn pod_uid(&self) -> Option<&str>;
}

impl ClaimObject for FabricIP {
    const POD_UID_LABEL: &'static str = LABEL_FABRIC_POD_UID;
    const NODE_LABEL: &'static str = LABEL_FABRIC_NODE;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn address(&self) -> Option<IpAddr> {
        claim_address(self)
    }
    fn pod_uid(&self) -> Option<&str> {
        self.spec.pod_uid.as_deref()
    }
}

/// A Port records its pod by namespace and name in the spec; the UID is the
/// label (the spec has no field for it).
impl ClaimObject for Port {
    const POD_UID_LABEL: &'static str = LABEL_POD_UID;
    const NODE_LABEL: &'static str = LABEL_NODE;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn address(&self) -> Option<IpAddr> {
        port_address(self).map(|(_, ip)| ip)
    }
    fn pod_uid(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(LABEL_POD_UID)
            .map(String::as_str)
    }
}

/// The result of a create.
#[derive(Debug, Clone, PartialEq)]
pub enum Created<O = FabricIP> {
    /// The claim is ours; the stored object (with its server-assigned UID).
    Created(Box<O>),
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
pub trait ClaimStore<O: ClaimObject = FabricIP>: Send + Sync {
    /// Creates `claim`; `AlreadyExists` when its name is taken.
    async fn create(&self, claim: &O) -> Result<Created<O>, StoreError>;
    /// Deletes `name` only if its `metadata.uid` is `uid`.
    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError>;
    /// Every claim labelled with this pod UID ([`super::NodeIndexed`]: of a
    /// pod of its node, each read by name).
    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<O>, StoreError>;
    /// Every claim labelled with this node (for CNI GC).
    async fn list_by_node(&self, node: &str) -> Result<Vec<O>, StoreError>;
    /// One claim by name.
    async fn get(&self, name: &str) -> Result<Option<O>, StoreError>;
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

impl Claimant {
    /// The Port object that claims `ip` in VPC `vpc` (VNI `vni`) for this
    /// claimant; `node_ip` is this node's tunnel endpoint.
    pub fn port_for(&self, vni: u32, vpc: &VPCRef, ip: IpAddr, node_ip: Option<String>) -> Port {
        let labels = BTreeMap::from([
            (LABEL_POD_UID.to_string(), self.uid.clone()),
            (LABEL_POD_NAMESPACE.to_string(), self.namespace.clone()),
            (LABEL_POD_NAME.to_string(), self.name.clone()),
            (LABEL_NODE.to_string(), self.node.clone()),
            (LABEL_VPC.to_string(), vpc.name.clone()),
            (
                LABEL_VPC_NAMESPACE.to_string(),
                vpc.namespace.clone().unwrap_or_default(),
            ),
        ]);
        let annotations = BTreeMap::from([(ANNOTATION_ATTACHMENT.to_string(), self.attachment())]);
        Port {
            metadata: ObjectMeta {
                name: Some(port_name(vni, ip)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: PortSpec {
                vpc_ref: vpc.clone(),
                ip: canonical_text(ip),
                mac: None,
                node: Some(self.node.clone()),
                node_ip,
                pod_namespace: Some(self.namespace.clone()),
                pod_name: Some(self.name.clone()),
                gateway: None,
            },
            status: None,
        }
    }
}

/// The VNI and address a stored Port holds, if its name and spec agree.
pub fn port_address(port: &Port) -> Option<(u32, IpAddr)> {
    let name = port.metadata.name.as_deref()?;
    let (vni, ip) = parse_port_name(name).ok()?;
    (port.spec.ip == canonical_text(ip)).then_some((vni, ip))
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
pub fn claim_attachment<O: ClaimObject>(claim: &O) -> Option<&str> {
    claim
        .meta()
        .annotations
        .as_ref()?
        .get(ANNOTATION_ATTACHMENT)
        .map(String::as_str)
}

/// The address a stored claim holds, if its name and spec agree.
pub fn claim_address(claim: &FabricIP) -> Option<IpAddr> {
    let name = claim.metadata.name.as_deref()?;
    let ip = cozyplane_api::names::parse_fabric_ip_name(name).ok()?;
    let agrees = match ip {
        // canonical text parsed back, no allocation: this runs for every
        // claim of the cluster on every compile
        IpAddr::V4(v4) => cozyplane_api::names::canonical_v4(&claim.spec.address) == Some(v4),
        IpAddr::V6(_) => claim.spec.address == canonical_text(ip),
    };
    agrees.then_some(ip)
}

//! The VPC side of an ADD: which VPC a pod asks for, whether it may join,
//! and its address there.
//!
//! # Who decides, from what
//! A pod asks for a VPC with the annotation `sdn.cozystack.io/vpc:
//! [<owner-ns>/]<vpc>` (no namespace: the pod's own). Whoever can create a
//! pod controls that annotation, so it is only a *request*; the grant is a
//! `VPCBinding` in the pod's namespace that references the VPC (whose
//! creation the API server allowed only to holders of `export` on it). The
//! pod's namespace is the runtime's `K8S_POD_NAMESPACE`, never anything the
//! pod carries. Every fact is a live read at ADD time (pod, bindings, VPC):
//! a binding deleted a moment ago must not admit a new pod from a stale
//! cache.
//!
//! # The checks, in order (each failure names its cause)
//! 1. the pod exists with the runtime's UID (a re-created pod of the same
//!    name is another pod);
//! 2. the annotation parses (`BadAnnotation`);
//! 3. a binding in the pod's namespace references the VPC (`NotBound`);
//! 4. the VPC exists (`UnknownVpc`), is Ready with a VNI (`NotReady`), and
//!    has a CIDR to draw from.
//!
//! # The address
//! A `Port` named `v<vni>.<escaped ip>` is the claim, made with the same
//! allocation walk as the FabricIPs ([`crate::ipam::Allocator`] with
//! [`PortClaims`]): one address per family from the VPC's first CIDR of
//! that family, the first host address (`.1`, `::1`) held back for the
//! VPC's gateway leg.

pub mod directory;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use async_trait::async_trait;
use cozyplane_api::sdn::VPCRef;
use cozyplane_api::{Port, VPC};

use crate::ipam::{
    port_address, Allocator, Cidr, ClaimStore, Claimant, Held, IpamError, Lease, Pool, PoolError,
    Pools, PortClaims, Release, StoreError,
};

/// What the attach path reads of the pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Its `sdn.cozystack.io/vpc` annotation.
    pub vpc: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The value of [`ANNOTATION_POD_LABELS`](cozyplane_api::labels::ANNOTATION_POD_LABELS) for `labels`: their JSON object
/// (keys sorted, so equal label sets give equal text).
pub fn labels_snapshot(labels: &BTreeMap<String, String>) -> String {
    // A map of strings always serialises.
    serde_json::to_string(labels).unwrap_or_else(|_| String::from("{}"))
}

/// A pod's VPC, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpcTarget {
    /// The VPC's namespace.
    pub namespace: String,
    /// The VPC's name.
    pub name: String,
    /// Its VNI, which is also its network id in the datapath.
    pub vni: u32,
    /// The pools pods draw from (first CIDR per family).
    pub pools: Pools,
    /// `spec.mtu`, if set.
    pub mtu: Option<u32>,
    /// The pod's labels at attach, snapshotted on its Ports
    /// ([`ANNOTATION_POD_LABELS`](cozyplane_api::labels::ANNOTATION_POD_LABELS)) so every node's SecurityGroup compile
    /// knows the groups of a remote pod without watching its pod.
    pub pod_labels: BTreeMap<String, String>,
}

impl VpcTarget {
    /// The VPC reference a Port records.
    pub fn vpc_ref(&self) -> VPCRef {
        VPCRef {
            namespace: Some(self.namespace.clone()),
            name: self.name.clone(),
        }
    }
}

/// Why a pod may not join the VPC it asks for, or its lookup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The pod the runtime names does not exist (or is another pod now).
    #[error("pod {namespace}/{name} with UID {uid} not found")]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The runtime's UID.
        uid: String,
    },
    /// The `sdn.cozystack.io/vpc` annotation is malformed.
    #[error("annotation sdn.cozystack.io/vpc={value:?}: {reason}")]
    BadAnnotation {
        /// The value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No VPCBinding in the pod's namespace references the VPC.
    #[error("no VPCBinding in namespace {pod_namespace} references VPC {vpc_namespace}/{vpc} (attachment is denied by default)")]
    NotBound {
        /// The pod's namespace.
        pod_namespace: String,
        /// The VPC's namespace.
        vpc_namespace: String,
        /// The VPC.
        vpc: String,
    },
    /// The VPC does not exist.
    #[error("VPC {namespace}/{name} does not exist")]
    UnknownVpc {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The VPC has no VNI yet or is being deleted.
    #[error("VPC {namespace}/{name} is not Ready ({why})")]
    NotReady {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        why: String,
    },
    /// The VPC's CIDRs give no pool.
    #[error("VPC {namespace}/{name} has no usable CIDR: {reason}")]
    BadCidrs {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A lookup failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AttachError {
    /// Would retrying later plausibly succeed? (A VPC that is not Ready yet
    /// will be; an unreachable API server may be.)
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AttachError::NotReady { .. } | AttachError::Store(StoreError::Unavailable(_))
        )
    }
}

/// The live reads the attach path makes. Implementations must not answer
/// from a cache (see the module docs).
#[async_trait]
pub trait VpcDirectory: Send + Sync {
    /// The pod's `sdn.cozystack.io/vpc` annotation (`vpc: None`: none) and
    /// labels, after checking that the pod exists with UID `uid`.
    async fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<PodFacts, AttachError>;
    /// Does a VPCBinding in `namespace` reference VPC `vpc_namespace/vpc`
    /// (and is it not being deleted)?
    async fn bound(
        &self,
        namespace: &str,
        vpc_namespace: &str,
        vpc: &str,
    ) -> Result<bool, AttachError>;
    /// The VPC.
    async fn vpc(&self, namespace: &str, name: &str) -> Result<Option<VPC>, AttachError>;
    /// Writes `sdn.cozystack.io/vpc-ip` and `vpc-mac` on the pod (a cache
    /// for the tenant's self-discovery; never read back).
    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        ips: &[IpAddr],
        mac: &str,
    ) -> Result<(), AttachError>;
}

/// The VPC operations the CNI handler needs (object-safe, so the handler
/// holds one as `dyn`).
#[async_trait]
pub trait Tenancy: Send + Sync {
    /// The pod's VPC, checked; `None` for a default-network pod.
    async fn resolve(&self, who: &Claimant) -> Result<Option<VpcTarget>, AttachError>;
    /// One Port per pool of the VPC, reusing the attachment's own.
    async fn allocate(&self, target: &VpcTarget, who: &Claimant) -> Result<Vec<Lease>, IpamError>;
    /// Every Port of the attachment: those labelled with its pod UID, plus
    /// `what.addresses` read as addresses of VPC `vni` (the record's;
    /// ignored when `vni` is 0).
    async fn held(&self, vni: u32, what: &Release) -> Result<Vec<Held>, IpamError>;
    /// Deletes Ports [`Tenancy::held`] found, each only if its UID is
    /// unchanged; how many were deleted.
    async fn release_held(&self, held: &[Held]) -> Result<usize, IpamError>;
    /// Releases the attachment's Ports (found as by [`Tenancy::held`]).
    async fn release(&self, vni: u32, what: &Release) -> Result<usize, IpamError> {
        let held = self.held(vni, what).await?;
        self.release_held(&held).await
    }
    /// CHECK: each address of VPC `vni` is claimed by this attachment.
    async fn verify(&self, vni: u32, who: &Claimant, addresses: &[IpAddr])
        -> Result<(), IpamError>;
    /// CNI GC: releases this node's Ports whose attachment is not in `keep`.
    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError>;
    /// Annotates the pod with its VPC addresses and MAC.
    async fn annotate(&self, who: &Claimant, ips: &[IpAddr], mac: &str) -> Result<(), AttachError>;
}

/// [`Tenancy`] over a directory and a Port claim store.
pub struct VpcAttach<D, S> {
    directory: D,
    ports: Allocator<S>,
    node_ip: Option<String>,
}

impl<D, S> VpcAttach<D, S> {
    /// `node_ip` is this node's tunnel endpoint, recorded in every Port.
    pub fn new(directory: D, ports: S, node_ip: Option<String>) -> Self {
        Self {
            directory,
            ports: Allocator::new(ports),
            node_ip,
        }
    }

    /// The directory (tests inspect it).
    pub fn directory(&self) -> &D {
        &self.directory
    }

    /// The Port store (tests inspect it).
    pub fn store(&self) -> &S {
        self.ports.store()
    }

    fn kind(&self, vni: u32, vpc: VPCRef) -> PortClaims {
        PortClaims {
            vni,
            vpc,
            node_ip: self.node_ip.clone(),
            pod_labels: None,
        }
    }
}

#[async_trait]
impl<D: VpcDirectory, S: ClaimStore<Port>> Tenancy for VpcAttach<D, S> {
    async fn resolve(&self, who: &Claimant) -> Result<Option<VpcTarget>, AttachError> {
        let pod = self
            .directory
            .pod(&who.namespace, &who.name, &who.uid)
            .await?;
        let Some(value) = pod.vpc else {
            return Ok(None);
        };
        let (vpc_ns, vpc) = parse_vpc_annotation(&value, &who.namespace)?;
        if !self.directory.bound(&who.namespace, &vpc_ns, &vpc).await? {
            return Err(AttachError::NotBound {
                pod_namespace: who.namespace.clone(),
                vpc_namespace: vpc_ns,
                vpc,
            });
        }
        let obj =
            self.directory
                .vpc(&vpc_ns, &vpc)
                .await?
                .ok_or_else(|| AttachError::UnknownVpc {
                    namespace: vpc_ns.clone(),
                    name: vpc.clone(),
                })?;
        let mut target = target_of(&obj, vpc_ns, vpc)?;
        target.pod_labels = pod.labels;
        Ok(Some(target))
    }

    async fn allocate(&self, target: &VpcTarget, who: &Claimant) -> Result<Vec<Lease>, IpamError> {
        let mut kind = self.kind(target.vni, target.vpc_ref());
        kind.pod_labels = Some(labels_snapshot(&target.pod_labels));
        self.ports.allocate(&kind, &target.pools, who).await
    }

    async fn held(&self, vni: u32, what: &Release) -> Result<Vec<Held>, IpamError> {
        let what = hints_of(vni, what);
        Ok(self
            .ports
            .claims_of(&self.kind(vni, VPCRef::default()), &what)
            .await?
            .iter()
            .filter_map(|port| {
                let (vni, address) = port_address(port)?;
                Some(Held {
                    net: vni,
                    address,
                    claim: port.metadata.name.clone()?,
                    claim_uid: port.metadata.uid.clone()?,
                })
            })
            .collect())
    }

    async fn release_held(&self, held: &[Held]) -> Result<usize, IpamError> {
        self.ports.release_held::<Port>(held).await
    }

    async fn verify(
        &self,
        vni: u32,
        who: &Claimant,
        addresses: &[IpAddr],
    ) -> Result<(), IpamError> {
        self.ports
            .verify(&self.kind(vni, VPCRef::default()), who, addresses)
            .await
    }

    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError> {
        self.ports.gc::<Port>(node, keep).await
    }

    async fn annotate(&self, who: &Claimant, ips: &[IpAddr], mac: &str) -> Result<(), AttachError> {
        self.directory
            .annotate(&who.namespace, &who.name, &who.uid, ips, mac)
            .await
    }
}

/// Address hints name Ports only with a VNI.
fn hints_of(vni: u32, what: &Release) -> Release {
    let mut what = what.clone();
    if vni == 0 {
        what.addresses.clear();
    }
    what
}

/// `[<owner-ns>/]<vpc>` → (namespace, name); no namespace means the pod's.
pub fn parse_vpc_annotation(
    value: &str,
    pod_namespace: &str,
) -> Result<(String, String), AttachError> {
    let bad = |reason: &str| AttachError::BadAnnotation {
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let (ns, name) = match value.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (pod_namespace, value),
    };
    if !is_dns_label(ns) {
        return Err(bad("the namespace is not a DNS-1123 label"));
    }
    if !is_dns_subdomain(name) {
        return Err(bad("the VPC name is not a DNS-1123 subdomain"));
    }
    Ok((ns.to_string(), name.to_string()))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The checked target of a stored VPC.
pub fn target_of(vpc: &VPC, namespace: String, name: String) -> Result<VpcTarget, AttachError> {
    let not_ready = |why: &str| AttachError::NotReady {
        namespace: namespace.clone(),
        name: name.clone(),
        why: why.to_string(),
    };
    if vpc.metadata.deletion_timestamp.is_some() {
        return Err(not_ready("it is being deleted"));
    }
    let status = vpc.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) != Some("Ready") {
        return Err(not_ready("phase is not Ready"));
    }
    let vni = status
        .and_then(|s| s.vni)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v >= cozyplane_api::names::FIRST_VPC_VNI)
        .ok_or_else(|| not_ready("no VNI assigned"))?;
    let pools = vpc_pools(&vpc.spec.cidrs).map_err(|e| AttachError::BadCidrs {
        namespace: namespace.clone(),
        name: name.clone(),
        reason: e.to_string(),
    })?;
    let mtu = vpc.spec.mtu.and_then(|m| u32::try_from(m).ok());
    Ok(VpcTarget {
        namespace,
        name,
        vni,
        pools,
        mtu,
        pod_labels: BTreeMap::new(),
    })
}

/// The first CIDR of each family, each with its first host address held
/// back (the VPC gateway leg's `.1`).
pub fn vpc_pools(cidrs: &[String]) -> Result<Pools, PoolError> {
    let mut pools: Vec<Pool> = Vec::new();
    for text in cidrs {
        let cidr: Cidr = text.parse()?;
        if pools.iter().any(|p| p.is_ipv4() == cidr.addr().is_ipv4()) {
            continue;
        }
        let gateway = Pool::new(cidr, [])?.at(0);
        pools.push(Pool::new(cidr, [gateway])?);
    }
    if pools.is_empty() {
        return Err(PoolError::Syntax(cidrs.join(",")));
    }
    Pools::new(pools)
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

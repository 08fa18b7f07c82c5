//! FabricIP IPAM: every pod address is a `FabricIP` object whose name is the
//! address, drawn from the cluster pod CIDR(s), one pool per family.
//!
//! # The walk
//! For each pool the allocator walks the ring of candidate addresses
//! starting at an offset derived from the pod UID (FNV-1a, 128 bits, so the
//! offset is stable across agent versions and spreads over even a huge IPv6
//! pool), and tries to *create* the claim of each candidate:
//! `Created` ends the walk, `AlreadyExists` moves to the next address, and a
//! store failure aborts the whole allocation. Starting at a UID-derived
//! offset means concurrent ADDs on many nodes rarely race for the same name,
//! and when they do, name uniqueness settles it: one wins, the other moves on.
//! A full lap (or `max_probes` creates) without a free address is
//! [`IpamError::Exhausted`].
//!
//! # Idempotence and atomicity
//! A retried ADD (same pod UID, container and interface) reuses the claims
//! annotated with its attachment, found by a live read of the pod's claims
//! (in the agent, by name through [`NodeIndexed`], so its cost does not grow
//! with the cluster). The read runs concurrently with the first create of each pool (one API
//! round trip for a first ADD instead of two); when the read shows the
//! attachment already holds an address in a pool, that claim is kept and
//! the speculative one deleted. A dual-stack allocation is all-or-nothing: if the second
//! family fails, the first family's new claim is deleted before the error is
//! returned. A create whose outcome is unknown (a timeout) is followed by a
//! read, and the claim is deleted if it turns out to be ours, so a failed
//! ADD leaves no claim behind; whatever still escapes (a crash between two
//! steps) carries the pod UID and is reclaimed by the controller's GC.

pub mod kube_store;
#[cfg(any(test, feature = "test-util"))]
pub mod memory;
pub mod node_index;
pub mod pool;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use async_trait::async_trait;
use cozyplane_api::labels::ANNOTATION_POD_LABELS;
use cozyplane_api::names::{fabric_ip_name, port_name};
use cozyplane_api::sdn::VPCRef;
use cozyplane_api::{FabricIP, Port};
use cozyplane_errors::Chain;

pub use node_index::NodeIndexed;
pub use pool::{Cidr, Pool, PoolError, Pools};
pub use store::{
    attachment_key, claim_address, claim_attachment, port_address, ClaimObject, ClaimStore,
    Claimant, Created, Deleted, StoreError, ANNOTATION_ATTACHMENT,
};

/// Why an IPAM operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The runtime did not pass `K8S_POD_UID`; without it the claim could
    /// never be garbage-collected, so none is made.
    #[error("the pod UID is required to claim an address (CNI_ARGS K8S_POD_UID)")]
    MissingPodUid,
    /// No free address in the pool after `probed` candidates.
    #[error("address pool {pool} exhausted ({probed} candidates taken)")]
    Exhausted {
        /// The pool.
        pool: Cidr,
        /// How many candidates were tried.
        probed: u128,
    },
    /// The claim store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// CHECK: no claim for this address.
    #[error("{0} is not claimed")]
    NotClaimed(IpAddr),
    /// CHECK: the address is claimed by another attachment.
    #[error("{address} is claimed by attachment {holder:?}, not by this one")]
    ClaimedByOther {
        /// The address.
        address: IpAddr,
        /// The holder's attachment annotation (empty when absent).
        holder: String,
    },
}

impl IpamError {
    /// Would retrying later plausibly succeed?
    pub fn is_transient(&self) -> bool {
        matches!(self, IpamError::Store(StoreError::Unavailable(_)))
    }
}

/// One claimed address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The address.
    pub address: IpAddr,
    /// The FabricIP name (the claim).
    pub claim: String,
    /// The FabricIP's `metadata.uid`, the precondition for releasing it.
    pub claim_uid: String,
    /// True when an earlier ADD of the same attachment made the claim.
    pub reused: bool,
}

/// One claim an attachment holds, as a live read found it: what DEL clears
/// in the datapath and then deletes (with its UID as precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The network the address is in: 0 for a FabricIP, the VNI for a Port.
    pub net: u32,
    /// The address.
    pub address: IpAddr,
    /// The claim's name.
    pub claim: String,
    /// The claim's `metadata.uid`.
    pub claim_uid: String,
}

/// What to release: an attachment, plus every hint of what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod UID, when the runtime passed it.
    pub pod_uid: Option<String>,
    /// Addresses the attachment is known to hold (from the plumbing or the
    /// runtime's prevResult); each is released only if its claim is
    /// annotated with this attachment.
    pub addresses: Vec<IpAddr>,
}

/// The IPAM operations the CNI handler needs.
#[async_trait]
pub trait Ipam: Send + Sync {
    /// One address per pool, reusing the attachment's existing claims.
    async fn allocate(&self, who: &Claimant) -> Result<Vec<Lease>, IpamError>;
    /// The claims that belong to the attachment (a live read).
    async fn held(&self, what: &Release) -> Result<Vec<Held>, IpamError>;
    /// Deletes claims [`Ipam::held`] found, each only if its UID is still
    /// the one read; returns how many were deleted.
    async fn release_held(&self, held: &[Held]) -> Result<usize, IpamError>;
    /// Releases the attachment's claims ([`Ipam::held`], then
    /// [`Ipam::release_held`]); returns how many were deleted.
    async fn release(&self, what: &Release) -> Result<usize, IpamError> {
        let held = self.held(what).await?;
        self.release_held(&held).await
    }
    /// CHECK: every address is claimed by this attachment.
    async fn verify(&self, who: &Claimant, addresses: &[IpAddr]) -> Result<(), IpamError>;
    /// CNI GC: releases this node's claims whose attachment is not in `keep`
    /// (claims without an attachment annotation are left to the controller).
    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError>;
}

/// How the claims of one kind are named and made: [`FabricClaims`] for the
/// default network, [`PortClaims`] for one VPC.
pub trait ClaimKind: Send + Sync {
    /// The claim object.
    type Object: ClaimObject;
    /// The claim name of `ip` (the name is the claim).
    fn name(&self, ip: IpAddr) -> String;
    /// The object claiming `ip` for `who`.
    fn build(&self, who: &Claimant, ip: IpAddr) -> Self::Object;
}

/// FabricIP claims: the default network's addresses.
#[derive(Debug, Clone, Copy, Default)]
pub struct FabricClaims;

impl ClaimKind for FabricClaims {
    type Object = FabricIP;
    fn name(&self, ip: IpAddr) -> String {
        fabric_ip_name(ip)
    }
    fn build(&self, who: &Claimant, ip: IpAddr) -> FabricIP {
        who.claim_for(ip)
    }
}

/// Port claims in one VPC (`v<vni>.<escaped ip>`).
#[derive(Debug, Clone, Default)]
pub struct PortClaims {
    /// The VPC's VNI (part of every claim name).
    pub vni: u32,
    /// The VPC (namespace always set).
    pub vpc: VPCRef,
    /// This node's tunnel endpoint, recorded in the Port.
    pub node_ip: Option<String>,
    /// The pod's labels as JSON, recorded in the Port's
    /// `sdn.cozystack.io/pod-labels` annotation (SecurityGroup members).
    pub pod_labels: Option<String>,
}

impl ClaimKind for PortClaims {
    type Object = Port;
    fn name(&self, ip: IpAddr) -> String {
        port_name(self.vni, ip)
    }
    fn build(&self, who: &Claimant, ip: IpAddr) -> Port {
        let mut port = who.port_for(self.vni, &self.vpc, ip, self.node_ip.clone());
        if let Some(labels) = &self.pod_labels {
            port.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ANNOTATION_POD_LABELS.to_string(), labels.clone());
        }
        port
    }
}

/// The allocation walk over a [`ClaimStore`], for any [`ClaimKind`] (see
/// the module docs). [`FabricIpam`] is it with the cluster pools; the VPC
/// attach path uses it with a VPC's CIDRs and [`PortClaims`].
pub struct Allocator<S> {
    store: S,
    max_probes: u128,
}

/// The default bound on creates per pool per allocation: a full lap of a
/// /16 pool. Beyond this an allocation is reported as exhausted rather than
/// hammering the API server.
pub const DEFAULT_MAX_PROBES: u128 = 1 << 16;

/// FNV-1a over 128 bits: a stable, well-spread offset from the pod UID.
pub fn uid_offset(uid: &str) -> u128 {
    const BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    uid.bytes()
        .fold(BASIS, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

impl<S> Allocator<S> {
    /// An allocator over `store`.
    pub fn new(store: S) -> Self {
        Self {
            store,
            max_probes: DEFAULT_MAX_PROBES,
        }
    }

    /// Changes the bound on creates per pool per allocation.
    pub fn with_max_probes(mut self, max_probes: u128) -> Self {
        self.max_probes = max_probes.max(1);
        self
    }

    /// The store (tests inspect it).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Releases every claim of a pod UID (all its attachments).
    pub async fn release_pod<O: ClaimObject>(&self, pod_uid: &str) -> Result<usize, IpamError>
    where
        S: ClaimStore<O>,
    {
        let mut n = 0;
        for claim in self.store.list_by_pod_uid(pod_uid).await? {
            n += usize::from(self.delete_claim(&claim).await?);
        }
        Ok(n)
    }

    /// The stored claims annotated with the attachment: those labelled with
    /// its pod UID plus those of the hinted addresses (live reads).
    pub async fn claims_of<K: ClaimKind>(
        &self,
        kind: &K,
        what: &Release,
    ) -> Result<Vec<K::Object>, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        let attachment = attachment_key(&what.container_id, &what.ifname);
        let mut candidates: BTreeMap<String, K::Object> = BTreeMap::new();
        if let Some(uid) = what.pod_uid.as_deref().filter(|u| !u.is_empty()) {
            for obj in self.store.list_by_pod_uid(uid).await? {
                if let Some(name) = obj.meta().name.clone() {
                    candidates.insert(name, obj);
                }
            }
        }
        for ip in &what.addresses {
            let name = kind.name(*ip);
            if candidates.contains_key(&name) {
                continue;
            }
            if let Some(obj) = self.store.get(&name).await? {
                candidates.insert(name, obj);
            }
        }
        Ok(candidates
            .into_values()
            .filter(|obj| claim_attachment(obj) == Some(attachment.as_str()))
            .collect())
    }

    /// Deletes one stored claim with its UID as precondition; true if deleted.
    async fn delete_claim<O: ClaimObject>(&self, claim: &O) -> Result<bool, IpamError>
    where
        S: ClaimStore<O>,
    {
        let (Some(name), Some(uid)) = (claim.meta().name.as_deref(), claim.meta().uid.as_deref())
        else {
            return Ok(false);
        };
        Ok(self.store.delete(name, uid).await? == Deleted::Deleted)
    }

    /// Deletes what this call created, newest first. Failures are logged:
    /// the claims carry the pod UID, so the controller's GC is the backstop.
    async fn undo<O: ClaimObject>(&self, made: &[Lease])
    where
        S: ClaimStore<O>,
    {
        for lease in made.iter().rev().filter(|l| !l.reused) {
            if let Err(e) = self.store.delete(&lease.claim, &lease.claim_uid).await {
                tracing::warn!(claim = %lease.claim, error = %Chain(&e), "rolling back a claim failed; the controller will reclaim it");
            }
        }
    }

    /// After a create with an unknown outcome: if the claim exists and is
    /// ours, delete it.
    async fn clean_ambiguous<O: ClaimObject>(&self, who: &Claimant, name: &str)
    where
        S: ClaimStore<O>,
    {
        match self.store.get(name).await {
            Ok(Some(obj)) if is_ours(&obj, who) => {
                if let Err(e) = self.delete_claim(&obj).await {
                    tracing::warn!(claim = name, error = %Chain(&e), "cannot delete a claim whose create timed out");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(claim = name, error = %Chain(&e), "cannot read back a claim whose create timed out")
            }
        }
    }

    /// Tries the walk's next candidate in `pool`: one create, or none when
    /// the walk has used up the ring or its budget.
    async fn probe<K: ClaimKind>(
        &self,
        kind: &K,
        pool: &Pool,
        who: &Claimant,
        walk: &mut Walk,
    ) -> Result<Probe, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        let ring = pool.ring_len();
        let start = uid_offset(&who.uid) % ring;
        let budget = ring.min(self.max_probes);
        while walk.step < ring && walk.probed < budget {
            // start < ring and step < ring, and ring <= 2^127: no overflow.
            let ip = pool.at(start + walk.step);
            walk.step += 1;
            if pool.is_reserved(ip) {
                continue;
            }
            walk.probed += 1;
            let claim = kind.build(who, ip);
            return match self.store.create(&claim).await {
                Ok(Created::Created(obj)) => Ok(Probe::Won(Lease {
                    address: ip,
                    claim: kind.name(ip),
                    claim_uid: obj.meta().uid.clone().unwrap_or_default(),
                    reused: false,
                })),
                Ok(Created::AlreadyExists) => Ok(Probe::Taken),
                Err(e) => {
                    if matches!(e, StoreError::Unavailable(_)) {
                        self.clean_ambiguous::<K::Object>(who, &kind.name(ip)).await;
                    }
                    Err(e.into())
                }
            };
        }
        Ok(Probe::Done)
    }

    /// Walks on in `pool` from where `walk` stands until a create succeeds.
    async fn claim_in<K: ClaimKind>(
        &self,
        kind: &K,
        pool: &Pool,
        who: &Claimant,
        mut walk: Walk,
    ) -> Result<Lease, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        loop {
            match self.probe(kind, pool, who, &mut walk).await? {
                Probe::Won(lease) => return Ok(lease),
                Probe::Taken => continue,
                Probe::Done => {
                    return Err(IpamError::Exhausted {
                        pool: pool.cidr(),
                        probed: walk.probed,
                    })
                }
            }
        }
    }

    /// One address per pool of `pools`, reusing the attachment's existing
    /// claims of this kind.
    ///
    /// The live read of the pod's claims and the first create of each pool
    /// run at once, so a first ADD (the common case: its first candidate is
    /// free) costs one API round trip, not two. A retried ADD whose claim
    /// sits elsewhere in the pool may have won a second address with that
    /// speculative create: the read decides, the older claim is kept and the
    /// speculative one deleted before anything is returned.
    pub async fn allocate<K: ClaimKind>(
        &self,
        kind: &K,
        pools: &Pools,
        who: &Claimant,
    ) -> Result<Vec<Lease>, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        if who.uid.is_empty() {
            return Err(IpamError::MissingPodUid);
        }
        let first = futures::future::join_all(pools.iter().map(|pool| async move {
            let mut walk = Walk::default();
            let probe = self.probe(kind, pool, who, &mut walk).await;
            (walk, probe)
        }));
        let (listed, first) = tokio::join!(self.store.list_by_pod_uid(&who.uid), first);
        // What the speculative creates won, per pool: undone on any failure.
        let mut speculative: Vec<Option<Lease>> = first
            .iter()
            .map(|(_, probe)| match probe {
                Ok(Probe::Won(lease)) => Some(lease.clone()),
                _ => None,
            })
            .collect();
        let failed = first.iter().find_map(|(_, probe)| probe.as_ref().err());
        let listed = match (listed, failed) {
            (Ok(listed), None) => listed,
            (Err(e), _) => {
                self.undo::<K::Object>(&speculative.into_iter().flatten().collect::<Vec<_>>())
                    .await;
                return Err(e.into());
            }
            (Ok(_), Some(e)) => {
                let e = e.clone();
                self.undo::<K::Object>(&speculative.into_iter().flatten().collect::<Vec<_>>())
                    .await;
                return Err(e);
            }
        };
        let won_uids: BTreeSet<&str> = speculative
            .iter()
            .flatten()
            .map(|l| l.claim_uid.as_str())
            .collect();
        // Existing claims of this attachment, per pool (lowest address first).
        let mut existing: BTreeMap<Cidr, Vec<(IpAddr, K::Object)>> = BTreeMap::new();
        for obj in listed {
            if !is_ours(&obj, who) {
                continue;
            }
            // The read may already see this call's own creates.
            if obj
                .meta()
                .uid
                .as_deref()
                .is_some_and(|uid| won_uids.contains(uid))
            {
                continue;
            }
            let Some(ip) = obj.address() else { continue };
            // Another kind's claim of the same UID label (another VPC's
            // Port) is not one of ours here.
            if obj.meta().name.as_deref() != Some(kind.name(ip).as_str()) {
                continue;
            }
            if let Some(pool) = pools.pool_of(ip) {
                existing.entry(pool.cidr()).or_default().push((ip, obj));
            }
        }
        let mut leases = Vec::new();
        for (i, (pool, (walk, _))) in pools.iter().zip(&first).enumerate() {
            let won = speculative[i].take();
            let mut mine = existing.remove(&pool.cidr()).unwrap_or_default();
            mine.sort_by_key(|(ip, _)| *ip);
            let mut mine = mine.into_iter();
            if let Some((ip, obj)) = mine.next() {
                leases.push(Lease {
                    address: ip,
                    claim: kind.name(ip),
                    claim_uid: obj.meta().uid.clone().unwrap_or_default(),
                    reused: true,
                });
                // The speculative create's address is not needed: the
                // attachment already holds one in this pool.
                if let Some(won) = won {
                    self.undo::<K::Object>(&[won]).await;
                }
                // More than one claim of one family for one attachment can
                // only come from an older bug or a manual edit: keep the first.
                for (_, extra) in mine {
                    if let Err(e) = self.delete_claim(&extra).await {
                        tracing::warn!(error = %Chain(&e), "cannot release a duplicate claim");
                    }
                }
                continue;
            }
            let claimed = match won {
                Some(lease) => Ok(lease),
                None => self.claim_in(kind, pool, who, *walk).await,
            };
            match claimed {
                Ok(lease) => leases.push(lease),
                Err(e) => {
                    leases.extend(speculative.into_iter().flatten());
                    self.undo::<K::Object>(&leases).await;
                    return Err(e);
                }
            }
        }
        Ok(leases)
    }

    /// The claims of this kind that belong to the attachment, in network
    /// `net` (0 for FabricIPs, the VNI for Ports).
    pub async fn held<K: ClaimKind>(
        &self,
        kind: &K,
        net: u32,
        what: &Release,
    ) -> Result<Vec<Held>, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        Ok(self
            .claims_of(kind, what)
            .await?
            .iter()
            .filter_map(|obj| {
                Some(Held {
                    net,
                    address: obj.address()?,
                    claim: obj.meta().name.clone()?,
                    claim_uid: obj.meta().uid.clone()?,
                })
            })
            .collect())
    }

    /// Deletes the claims `held` names, each only if its UID is unchanged;
    /// how many were deleted.
    pub async fn release_held<O: ClaimObject>(&self, held: &[Held]) -> Result<usize, IpamError>
    where
        S: ClaimStore<O>,
    {
        let mut n = 0;
        for h in held {
            n += usize::from(self.store.delete(&h.claim, &h.claim_uid).await? == Deleted::Deleted);
        }
        Ok(n)
    }

    /// Releases the attachment's claims of this kind; how many were deleted.
    pub async fn release<K: ClaimKind>(&self, kind: &K, what: &Release) -> Result<usize, IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        let held = self.held(kind, 0, what).await?;
        self.release_held::<K::Object>(&held).await
    }

    /// CHECK: every address is claimed (in this kind) by this attachment.
    pub async fn verify<K: ClaimKind>(
        &self,
        kind: &K,
        who: &Claimant,
        addresses: &[IpAddr],
    ) -> Result<(), IpamError>
    where
        S: ClaimStore<K::Object>,
    {
        for ip in addresses {
            let obj = self
                .store
                .get(&kind.name(*ip))
                .await?
                .ok_or(IpamError::NotClaimed(*ip))?;
            if !is_ours(&obj, who) {
                return Err(IpamError::ClaimedByOther {
                    address: *ip,
                    holder: claim_attachment(&obj).unwrap_or_default().to_string(),
                });
            }
        }
        Ok(())
    }

    /// CNI GC: releases this node's claims (of the store's kind) whose
    /// attachment is not in `keep`.
    pub async fn gc<O: ClaimObject>(
        &self,
        node: &str,
        keep: &BTreeSet<String>,
    ) -> Result<usize, IpamError>
    where
        S: ClaimStore<O>,
    {
        let mut n = 0;
        for obj in self.store.list_by_node(node).await? {
            match claim_attachment(&obj) {
                Some(att) if !keep.contains(att) => {
                    n += usize::from(self.delete_claim(&obj).await?)
                }
                _ => {}
            }
        }
        Ok(n)
    }
}

/// Where a walk over one pool stands: the next ring step, and how many
/// candidates it has tried (the budget counts those).
#[derive(Debug, Clone, Copy, Default)]
struct Walk {
    step: u128,
    probed: u128,
}

/// What one create of a walk found.
#[derive(Debug)]
enum Probe {
    /// The candidate is ours now.
    Won(Lease),
    /// Somebody holds the candidate.
    Taken,
    /// The walk has used up the ring or its budget.
    Done,
}

/// Is `obj` the claim of this claimant's attachment?
fn is_ours<O: ClaimObject>(obj: &O, who: &Claimant) -> bool {
    obj.pod_uid() == Some(who.uid.as_str())
        && claim_attachment(obj) == Some(who.attachment().as_str())
}

/// The FabricIP allocator: an [`Allocator`] over the cluster's pod pools.
pub struct FabricIpam<S> {
    alloc: Allocator<S>,
    pools: Pools,
}

impl<S: ClaimStore<FabricIP>> FabricIpam<S> {
    /// An allocator over `pools`.
    pub fn new(store: S, pools: Pools) -> Self {
        Self {
            alloc: Allocator::new(store),
            pools,
        }
    }

    /// Changes the bound on creates per pool per allocation.
    pub fn with_max_probes(mut self, max_probes: u128) -> Self {
        self.alloc = self.alloc.with_max_probes(max_probes);
        self
    }

    /// The store (tests inspect it).
    pub fn store(&self) -> &S {
        self.alloc.store()
    }

    /// The pools.
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// Releases every claim of a pod UID (all its attachments).
    pub async fn release_pod(&self, pod_uid: &str) -> Result<usize, IpamError> {
        self.alloc.release_pod::<FabricIP>(pod_uid).await
    }
}

#[async_trait]
impl<S: ClaimStore<FabricIP>> Ipam for FabricIpam<S> {
    async fn allocate(&self, who: &Claimant) -> Result<Vec<Lease>, IpamError> {
        self.alloc.allocate(&FabricClaims, &self.pools, who).await
    }

    async fn held(&self, what: &Release) -> Result<Vec<Held>, IpamError> {
        self.alloc.held(&FabricClaims, 0, what).await
    }

    async fn release_held(&self, held: &[Held]) -> Result<usize, IpamError> {
        self.alloc.release_held::<FabricIP>(held).await
    }

    async fn verify(&self, who: &Claimant, addresses: &[IpAddr]) -> Result<(), IpamError> {
        self.alloc.verify(&FabricClaims, who, addresses).await
    }

    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError> {
        self.alloc.gc::<FabricIP>(node, keep).await
    }
}

#[cfg(test)]
mod tests;

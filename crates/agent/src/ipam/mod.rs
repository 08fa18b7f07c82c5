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
//! A retried ADD (same pod UID, container and interface) first looks up the
//! pod's claims with a live list and reuses the ones annotated with its
//! attachment. A dual-stack allocation is all-or-nothing: if the second
//! family fails, the first family's new claim is deleted before the error is
//! returned. A create whose outcome is unknown (a timeout) is followed by a
//! read, and the claim is deleted if it turns out to be ours, so a failed
//! ADD leaves no claim behind; whatever still escapes (a crash between two
//! steps) carries the pod UID and is reclaimed by the controller's GC.

pub mod kube_store;
#[cfg(any(test, feature = "test-util"))]
pub mod memory;
pub mod pool;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use async_trait::async_trait;
use cozyplane_api::names::fabric_ip_name;
use cozyplane_api::FabricIP;
use cozyplane_errors::Chain;

pub use pool::{Cidr, Pool, PoolError, Pools};
pub use store::{
    attachment_key, claim_address, claim_attachment, ClaimStore, Claimant, Created, Deleted,
    StoreError, ANNOTATION_ATTACHMENT,
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
    /// The addresses whose claims belong to the attachment (a live read).
    async fn held(&self, what: &Release) -> Result<Vec<IpAddr>, IpamError>;
    /// Releases the attachment's claims; returns how many were deleted.
    async fn release(&self, what: &Release) -> Result<usize, IpamError>;
    /// CHECK: every address is claimed by this attachment.
    async fn verify(&self, who: &Claimant, addresses: &[IpAddr]) -> Result<(), IpamError>;
    /// CNI GC: releases this node's claims whose attachment is not in `keep`
    /// (claims without an attachment annotation are left to the controller).
    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError>;
}

/// The FabricIP allocator over a [`ClaimStore`].
pub struct FabricIpam<S> {
    store: S,
    pools: Pools,
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

impl<S: ClaimStore> FabricIpam<S> {
    /// An allocator over `pools`.
    pub fn new(store: S, pools: Pools) -> Self {
        Self {
            store,
            pools,
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

    /// The pools.
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// Releases every claim of a pod UID (all its attachments).
    pub async fn release_pod(&self, pod_uid: &str) -> Result<usize, IpamError> {
        let mut n = 0;
        for claim in self.store.list_by_pod_uid(pod_uid).await? {
            n += usize::from(self.delete_claim(&claim).await?);
        }
        Ok(n)
    }

    /// The stored claims annotated with the attachment: those labelled with
    /// its pod UID plus those of the hinted addresses (live reads).
    async fn claims_of(&self, what: &Release) -> Result<Vec<FabricIP>, IpamError> {
        let attachment = attachment_key(&what.container_id, &what.ifname);
        let mut candidates: BTreeMap<String, FabricIP> = BTreeMap::new();
        if let Some(uid) = what.pod_uid.as_deref().filter(|u| !u.is_empty()) {
            for obj in self.store.list_by_pod_uid(uid).await? {
                if let Some(name) = obj.metadata.name.clone() {
                    candidates.insert(name, obj);
                }
            }
        }
        for ip in &what.addresses {
            let name = fabric_ip_name(*ip);
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
    async fn delete_claim(&self, claim: &FabricIP) -> Result<bool, IpamError> {
        let (Some(name), Some(uid)) = (
            claim.metadata.name.as_deref(),
            claim.metadata.uid.as_deref(),
        ) else {
            return Ok(false);
        };
        Ok(self.store.delete(name, uid).await? == Deleted::Deleted)
    }

    /// Deletes what this call created, newest first. Failures are logged:
    /// the claims carry the pod UID, so the controller's GC is the backstop.
    async fn undo(&self, made: &[Lease]) {
        for lease in made.iter().rev().filter(|l| !l.reused) {
            if let Err(e) = self.store.delete(&lease.claim, &lease.claim_uid).await {
                tracing::warn!(claim = %lease.claim, error = %Chain(&e), "rolling back a claim failed; the controller will reclaim it");
            }
        }
    }

    /// After a create with an unknown outcome: if the claim exists and is
    /// ours, delete it.
    async fn clean_ambiguous(&self, who: &Claimant, name: &str) {
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

    /// Walks `pool` from the UID offset until a create succeeds.
    async fn claim_in(&self, pool: &Pool, who: &Claimant) -> Result<Lease, IpamError> {
        let ring = pool.ring_len();
        let start = uid_offset(&who.uid) % ring;
        let budget = ring.min(self.max_probes);
        let mut probed = 0u128;
        let mut step = 0u128;
        while step < ring && probed < budget {
            // start < ring and step < ring, and ring <= 2^127: no overflow.
            let ip = pool.at(start + step);
            step += 1;
            if pool.is_reserved(ip) {
                continue;
            }
            probed += 1;
            let claim = who.claim_for(ip);
            match self.store.create(&claim).await {
                Ok(Created::Created(obj)) => {
                    return Ok(Lease {
                        address: ip,
                        claim: fabric_ip_name(ip),
                        claim_uid: obj.metadata.uid.clone().unwrap_or_default(),
                        reused: false,
                    })
                }
                Ok(Created::AlreadyExists) => continue,
                Err(e) => {
                    if matches!(e, StoreError::Unavailable(_)) {
                        self.clean_ambiguous(who, &fabric_ip_name(ip)).await;
                    }
                    return Err(e.into());
                }
            }
        }
        Err(IpamError::Exhausted {
            pool: pool.cidr(),
            probed,
        })
    }
}

/// Is `obj` the claim of this claimant's attachment?
fn is_ours(obj: &FabricIP, who: &Claimant) -> bool {
    obj.spec.pod_uid.as_deref() == Some(who.uid.as_str())
        && claim_attachment(obj) == Some(who.attachment().as_str())
}

#[async_trait]
impl<S: ClaimStore> Ipam for FabricIpam<S> {
    async fn allocate(&self, who: &Claimant) -> Result<Vec<Lease>, IpamError> {
        if who.uid.is_empty() {
            return Err(IpamError::MissingPodUid);
        }
        // Existing claims of this attachment, per pool (lowest address first).
        let mut existing: BTreeMap<Cidr, Vec<(IpAddr, FabricIP)>> = BTreeMap::new();
        for obj in self.store.list_by_pod_uid(&who.uid).await? {
            if !is_ours(&obj, who) {
                continue;
            }
            if let Some(ip) = claim_address(&obj) {
                if let Some(pool) = self.pools.pool_of(ip) {
                    existing.entry(pool.cidr()).or_default().push((ip, obj));
                }
            }
        }
        let mut leases = Vec::new();
        for pool in self.pools.iter() {
            let mut mine = existing.remove(&pool.cidr()).unwrap_or_default();
            mine.sort_by_key(|(ip, _)| *ip);
            let mut mine = mine.into_iter();
            if let Some((ip, obj)) = mine.next() {
                leases.push(Lease {
                    address: ip,
                    claim: fabric_ip_name(ip),
                    claim_uid: obj.metadata.uid.clone().unwrap_or_default(),
                    reused: true,
                });
                // More than one claim of one family for one attachment can
                // only come from an older bug or a manual edit: keep the first.
                for (_, extra) in mine {
                    if let Err(e) = self.delete_claim(&extra).await {
                        tracing::warn!(error = %Chain(&e), "cannot release a duplicate claim");
                    }
                }
                continue;
            }
            match self.claim_in(pool, who).await {
                Ok(lease) => leases.push(lease),
                Err(e) => {
                    self.undo(&leases).await;
                    return Err(e);
                }
            }
        }
        Ok(leases)
    }

    async fn held(&self, what: &Release) -> Result<Vec<IpAddr>, IpamError> {
        Ok(self
            .claims_of(what)
            .await?
            .iter()
            .filter_map(claim_address)
            .collect())
    }

    async fn release(&self, what: &Release) -> Result<usize, IpamError> {
        let mut n = 0;
        for obj in self.claims_of(what).await? {
            n += usize::from(self.delete_claim(&obj).await?);
        }
        Ok(n)
    }

    async fn verify(&self, who: &Claimant, addresses: &[IpAddr]) -> Result<(), IpamError> {
        for ip in addresses {
            let obj = self
                .store
                .get(&fabric_ip_name(*ip))
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

    async fn gc(&self, node: &str, keep: &BTreeSet<String>) -> Result<usize, IpamError> {
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

#[cfg(test)]
mod tests;

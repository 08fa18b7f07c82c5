use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;

use super::memory::{Faults, MemoryClaimStore};
use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pools(list: &str) -> Pools {
    Pools::parse(list, &[]).unwrap()
}

fn who(uid: &str, container: &str) -> Claimant {
    who_on(uid, container, "node-a")
}

/// A claimant on `node` (the node index's tests use it too).
pub(in crate::ipam) fn who_on(uid: &str, container: &str, node: &str) -> Claimant {
    Claimant {
        namespace: "default".into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        node: node.into(),
    }
}

pub(in crate::ipam) fn release_of(w: &Claimant) -> Release {
    Release {
        container_id: w.container_id.clone(),
        ifname: w.ifname.clone(),
        pod_uid: Some(w.uid.clone()),
        addresses: vec![],
    }
}

fn ipam(list: &str) -> FabricIpam<MemoryClaimStore> {
    FabricIpam::new(MemoryClaimStore::new(), pools(list))
}

#[test]
fn uid_offset_is_fnv1a_128() {
    // published FNV-1a 128-bit vectors: the offset must never change between
    // agent versions, or restarted agents would spread differently
    assert_eq!(uid_offset(""), 0x6c62272e07bb014262b821756295c58d);
    assert_eq!(uid_offset("a"), 0xd228cb696f1a8caf78912b704e4a8964);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_allocations_on_a_27_never_collide() {
    let ipam = Arc::new(ipam("10.1.0.0/27"));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let ipam = Arc::clone(&ipam);
            tokio::spawn(async move { ipam.allocate(&who(&format!("uid-{i}"), "c")).await })
        })
        .collect();
    let mut won = Vec::new();
    let mut exhausted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(leases) => {
                assert_eq!(leases.len(), 1);
                won.push(leases[0].address);
            }
            Err(IpamError::Exhausted { pool, probed }) => {
                assert_eq!(pool.to_string(), "10.1.0.0/27");
                assert_eq!(probed, 30);
                exhausted += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    // a /27 holds 30 pods: every one of them handed out exactly once
    assert_eq!(won.len(), 30);
    assert_eq!(exhausted, 20);
    let distinct: HashSet<_> = won.iter().collect();
    assert_eq!(distinct.len(), 30, "an address was handed out twice");
    assert_eq!(ipam.store().snapshot().len(), 30);
    for a in &won {
        assert!(ipam.pools().pool_of(*a).unwrap().is_allocatable(*a), "{a}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_on_a_roomy_pool_all_succeed_without_duplicates() {
    let ipam = Arc::new(ipam("10.1.0.0/26"));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let ipam = Arc::clone(&ipam);
            tokio::spawn(async move { ipam.allocate(&who(&format!("p{i}"), "c")).await })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in tasks {
        let leases = t.await.unwrap().unwrap();
        assert!(
            seen.insert(leases[0].address),
            "duplicate {}",
            leases[0].address
        );
    }
    assert_eq!(seen.len(), 50);
}

#[tokio::test]
async fn exhaustion_is_a_typed_error_and_makes_no_claim() {
    let ipam = ipam("10.0.0.0/30");
    ipam.allocate(&who("a", "c")).await.unwrap();
    ipam.allocate(&who("b", "c")).await.unwrap();
    let err = ipam.allocate(&who("c", "c")).await.unwrap_err();
    assert_eq!(
        err,
        IpamError::Exhausted {
            pool: "10.0.0.0/30".parse().unwrap(),
            probed: 2
        }
    );
    assert!(!err.is_transient());
    assert_eq!(ipam.store().snapshot().len(), 2);
}

#[tokio::test]
async fn max_probes_bounds_the_walk() {
    let ipam = ipam("10.0.0.0/24").with_max_probes(3);
    let store = ipam.store();
    for i in 1..=254u32 {
        let addr = IpAddr::from([10, 0, 0, i as u8]);
        store.insert_foreign(who("other", "x").claim_for(addr));
    }
    let err = ipam.allocate(&who("a", "c")).await.unwrap_err();
    assert!(
        matches!(err, IpamError::Exhausted { probed: 3, .. }),
        "{err}"
    );
    assert_eq!(store.create_calls(), 3);
}

#[tokio::test]
async fn the_walk_starts_at_the_uid_offset_and_wraps() {
    let ipam = ipam("10.0.0.0/28"); // 14 hosts
    let pool = ipam.pools().iter().next().unwrap().clone();
    let ring = pool.ring_len();
    // a UID whose walk starts on the last address of the ring
    let uid = (0..10_000)
        .map(|i| format!("uid-{i}"))
        .find(|u| uid_offset(u) % ring == ring - 1)
        .unwrap();
    // the first allocation in an empty pool lands exactly on the offset
    let first = ipam.allocate(&who(&uid, "c1")).await.unwrap();
    assert_eq!(first[0].address, ip("10.0.0.14"));
    // with the last address taken, a second attachment of the same pod wraps
    // around to the start of the ring
    let second = ipam.allocate(&who(&uid, "c2")).await.unwrap();
    assert_eq!(second[0].address, ip("10.0.0.1"));
}

#[tokio::test]
async fn offsets_spread_pods_over_the_pool() {
    let ipam = ipam("10.2.0.0/24");
    let mut addrs = HashSet::new();
    for i in 0..64 {
        let l = ipam
            .allocate(&who(&format!("{i:08x}-pod"), "c"))
            .await
            .unwrap();
        addrs.insert(l[0].address);
    }
    // every pod got its own address, and most of them on the first try:
    // without the offset all 64 would have probed from .1 upwards
    // (64 * 65 / 2 = 2080 creates)
    assert_eq!(addrs.len(), 64);
    let creates = ipam.store().create_calls();
    assert!(
        creates < 64 * 3,
        "{creates} creates for 64 pods: offsets do not spread"
    );
    // and the addresses are not a dense block at the start of the pool
    let max = addrs.iter().max().unwrap();
    assert!(*max > ip("10.2.0.128"), "{max}");
}

#[tokio::test]
async fn dual_stack_allocates_one_per_family_with_well_formed_claims() {
    let ipam = ipam("10.244.0.0/16,fd00:10:244::/56");
    let w = who("9f0c-uid", "cont");
    let leases = ipam.allocate(&w).await.unwrap();
    assert_eq!(leases.len(), 2);
    assert!(leases[0].address.is_ipv4());
    assert!(leases[1].address.is_ipv6());
    let snap = ipam.store().snapshot();
    for l in &leases {
        let obj = &snap[&l.claim];
        assert_eq!(l.claim, fabric_ip_name(l.address));
        assert_eq!(claim_address(obj), Some(l.address));
        assert_eq!(obj.metadata.uid.as_deref(), Some(l.claim_uid.as_str()));
        assert_eq!(obj.spec.pod_uid.as_deref(), Some("9f0c-uid"));
        assert_eq!(obj.spec.node.as_deref(), Some("node-a"));
        let labels = obj.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels[cozyplane_api::labels::LABEL_FABRIC_POD_UID],
            "9f0c-uid"
        );
        assert_eq!(labels[cozyplane_api::labels::LABEL_FABRIC_NODE], "node-a");
        assert_eq!(
            labels[cozyplane_api::labels::LABEL_FABRIC_POD_NAMESPACE],
            "default"
        );
        assert_eq!(claim_attachment(obj), Some("cont/eth0"));
        assert!(!l.reused);
    }
    assert!(!ipam.pools().pool_of(leases[1].address).unwrap().is_ipv4());
}

#[tokio::test]
async fn v6_only_pool_and_large_prefix() {
    let ipam = ipam("fd00:10:244::/56");
    let a = ipam.allocate(&who("a", "c")).await.unwrap();
    let b = ipam.allocate(&who("b", "c")).await.unwrap();
    assert_ne!(a[0].address, b[0].address);
    for l in a.iter().chain(&b) {
        assert!("fd00:10:244::/56"
            .parse::<Cidr>()
            .unwrap()
            .contains(l.address));
        assert!(l.claim.starts_with("f-fd00-10-244-"), "{}", l.claim);
    }
}

#[tokio::test]
async fn re_add_reuses_the_attachments_claims() {
    let ipam = ipam("10.244.0.0/16,fd00:10:244::/56");
    let w = who("u1", "c1");
    let first = ipam.allocate(&w).await.unwrap();
    let calls = ipam.store().create_calls();
    let again = ipam.allocate(&w).await.unwrap();
    assert_eq!(
        first.iter().map(|l| l.address).collect::<Vec<_>>(),
        again.iter().map(|l| l.address).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|l| l.reused));
    // the speculative first create of each family finds its own claim there
    assert_eq!(
        ipam.store().create_calls(),
        calls + 2,
        "one create per family on re-ADD"
    );
    assert_eq!(ipam.store().snapshot().len(), 2, "no new claim on re-ADD");
    // a new sandbox of the same pod is a new attachment: new addresses
    let other = ipam.allocate(&who("u1", "c2")).await.unwrap();
    assert_ne!(other[0].address, first[0].address);
    assert_eq!(ipam.store().snapshot().len(), 4);
}

/// A store whose pod-UID list answers only once a create has been issued:
/// an allocation that read before it created would wait forever.
struct ListAfterCreate {
    inner: MemoryClaimStore,
    created: tokio::sync::Notify,
}

#[async_trait]
impl ClaimStore for ListAfterCreate {
    async fn create(&self, claim: &FabricIP) -> Result<Created, StoreError> {
        self.created.notify_one();
        self.inner.create(claim).await
    }
    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
        self.inner.delete(name, uid).await
    }
    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.created.notified().await;
        self.inner.list_by_pod_uid(pod_uid).await
    }
    async fn list_by_node(&self, node: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.inner.list_by_node(node).await
    }
    async fn get(&self, name: &str) -> Result<Option<FabricIP>, StoreError> {
        self.inner.get(name).await
    }
}

#[tokio::test]
async fn the_claims_read_and_the_first_create_run_at_once() {
    let ipam = FabricIpam::new(
        ListAfterCreate {
            inner: MemoryClaimStore::new(),
            created: tokio::sync::Notify::new(),
        },
        pools("10.0.0.0/24"),
    );
    let leases = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        ipam.allocate(&who("u", "c")),
    )
    .await
    .expect("the read waited for a create that came only after it: one round trip after the other")
    .unwrap();
    assert_eq!(leases.len(), 1);
    assert!(!leases[0].reused);
    assert_eq!(ipam.store().inner.snapshot().len(), 1);
}

#[tokio::test]
async fn a_retry_keeps_its_claim_when_an_earlier_candidate_freed_up() {
    let ipam = ipam("10.0.0.0/24,fd00::/120");
    let w = who("u", "c");
    // the pod's first candidates, held by another pod while it first claims
    let first = ipam.allocate(&w).await.unwrap();
    assert_eq!(ipam.release(&release_of(&w)).await.unwrap(), 2);
    let foreign: Vec<(String, String)> = first
        .iter()
        .map(|l| {
            let uid = ipam
                .store()
                .insert_foreign(who("x", "x").claim_for(l.address));
            (l.claim.clone(), uid)
        })
        .collect();
    let held = ipam.allocate(&w).await.unwrap();
    for (h, f) in held.iter().zip(&first) {
        assert_ne!(h.address, f.address);
    }
    // the other pod leaves; the ADD is retried (its answer was lost)
    for (name, uid) in &foreign {
        assert_eq!(ipam.store().delete(name, uid).await, Ok(Deleted::Deleted));
    }
    let again = ipam.allocate(&w).await.unwrap();
    assert_eq!(
        again.iter().map(|l| l.address).collect::<Vec<_>>(),
        held.iter().map(|l| l.address).collect::<Vec<_>>(),
        "the retry must answer the addresses the attachment holds"
    );
    assert!(again.iter().all(|l| l.reused));
    // the speculative claims of the freed first candidates are gone again
    let snap = ipam.store().snapshot();
    let mut names: Vec<&String> = snap.keys().collect();
    names.sort();
    let mut want: Vec<&String> = held.iter().map(|l| &l.claim).collect();
    want.sort();
    assert_eq!(names, want);
}

#[tokio::test]
async fn a_failed_read_undoes_the_speculative_creates() {
    struct ListFails(MemoryClaimStore);
    #[async_trait]
    impl ClaimStore for ListFails {
        async fn create(&self, claim: &FabricIP) -> Result<Created, StoreError> {
            self.0.create(claim).await
        }
        async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
            self.0.delete(name, uid).await
        }
        async fn list_by_pod_uid(&self, _: &str) -> Result<Vec<FabricIP>, StoreError> {
            Err(StoreError::Unavailable("injected list failure".into()))
        }
        async fn list_by_node(&self, node: &str) -> Result<Vec<FabricIP>, StoreError> {
            self.0.list_by_node(node).await
        }
        async fn get(&self, name: &str) -> Result<Option<FabricIP>, StoreError> {
            self.0.get(name).await
        }
    }
    let ipam = FabricIpam::new(
        ListFails(MemoryClaimStore::new()),
        pools("10.0.0.0/24,fd00::/120"),
    );
    let err = ipam.allocate(&who("u", "c")).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(ipam.store().0.create_calls(), 2, "both families were tried");
    assert!(
        ipam.store().0.snapshot().is_empty(),
        "{:?}",
        ipam.store().0.snapshot().keys()
    );
}

#[tokio::test]
async fn a_failed_second_family_rolls_back_the_first() {
    // the v6 "pool" is a single address somebody else already holds
    let ipam = ipam("10.0.0.0/24,fd00::7/128");
    let foreign = ipam
        .store()
        .insert_foreign(who("x", "x").claim_for(ip("fd00::7")));
    let err = ipam.allocate(&who("u", "c")).await.unwrap_err();
    assert!(
        matches!(err, IpamError::Exhausted { probed: 1, .. }),
        "{err}"
    );
    let snap = ipam.store().snapshot();
    assert_eq!(snap.len(), 1, "the v4 claim was not rolled back: {snap:?}");
    assert_eq!(
        snap["f-fd00--7"].metadata.uid.as_deref(),
        Some(foreign.as_str())
    );
}

#[tokio::test]
async fn store_failures_leave_no_claim_even_when_the_create_was_applied() {
    for applied in [false, true] {
        let ipam = ipam("10.0.0.0/24,fd00::/120");
        // the v4 create succeeds, the v6 one fails (before or after commit)
        ipam.store().set_faults(Faults {
            creates_before_failure: Some(1),
            create_applied_then_lost: applied,
            deletes_fail: false,
        });
        let err = ipam.allocate(&who("u", "c")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            ipam.store().snapshot().is_empty(),
            "applied={applied}: {:?}",
            ipam.store().snapshot().keys()
        );
    }
}

#[tokio::test]
async fn missing_pod_uid_is_refused() {
    let ipam = ipam("10.0.0.0/24");
    assert_eq!(
        ipam.allocate(&who("", "c")).await,
        Err(IpamError::MissingPodUid)
    );
    assert_eq!(ipam.store().create_calls(), 0);
}

#[tokio::test]
async fn release_by_attachment_by_address_and_by_pod() {
    let ipam = ipam("10.0.0.0/24,fd00::/120");
    let c1 = ipam.allocate(&who("u", "c1")).await.unwrap();
    let c2 = ipam.allocate(&who("u", "c2")).await.unwrap();
    let other = ipam.allocate(&who("v", "c1")).await.unwrap();
    assert_eq!(ipam.store().snapshot().len(), 6);

    // by attachment + pod UID: only c1's two claims
    let r = Release {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        pod_uid: Some("u".into()),
        addresses: vec![],
    };
    assert_eq!(ipam.release(&r).await.unwrap(), 2);
    assert_eq!(ipam.release(&r).await.unwrap(), 0, "release is idempotent");
    let snap = ipam.store().snapshot();
    assert!(c1.iter().all(|l| !snap.contains_key(&l.claim)));
    assert!(
        other.iter().all(|l| snap.contains_key(&l.claim)),
        "another pod's c1 survives"
    );

    // by address only (DEL without CNI_ARGS): the claims are matched by their
    // attachment annotation; an address held by someone else is left alone
    let r = Release {
        container_id: "c2".into(),
        ifname: "eth0".into(),
        pod_uid: None,
        addresses: c2
            .iter()
            .map(|l| l.address)
            .chain([other[0].address])
            .collect(),
    };
    assert_eq!(ipam.release(&r).await.unwrap(), 2);
    let snap = ipam.store().snapshot();
    assert_eq!(snap.len(), 2);

    // by pod UID: everything of pod v
    assert_eq!(ipam.release_pod("v").await.unwrap(), 2);
    assert!(ipam.store().snapshot().is_empty());
}

#[tokio::test]
async fn memory_store_honours_the_uid_precondition() {
    let ipam = ipam("10.0.0.0/24");
    let mine = ipam.allocate(&who("u", "c")).await.unwrap();
    // our claim vanished (say the controller reclaimed it) and a newer object
    // holds the name: a delete with our old UID must not remove it
    let snap = ipam.store().snapshot();
    let stale = snap[&mine[0].claim].clone();
    ipam.store()
        .delete(&mine[0].claim, &mine[0].claim_uid)
        .await
        .unwrap();
    ipam.store().insert_foreign(stale.clone());
    assert_eq!(
        ipam.store()
            .delete(&mine[0].claim, &mine[0].claim_uid)
            .await
            .unwrap(),
        Deleted::UidMismatch
    );
    assert_eq!(ipam.store().snapshot().len(), 1);
}

#[tokio::test]
async fn verify_and_gc() {
    let ipam = ipam("10.0.0.0/24");
    let a = ipam.allocate(&who("u", "keep")).await.unwrap();
    let b = ipam.allocate(&who("w", "stale")).await.unwrap();
    ipam.verify(&who("u", "keep"), &[a[0].address])
        .await
        .unwrap();
    assert_eq!(
        ipam.verify(&who("u", "keep"), &[b[0].address]).await,
        Err(IpamError::ClaimedByOther {
            address: b[0].address,
            holder: "stale/eth0".into()
        })
    );
    assert_eq!(
        ipam.verify(&who("u", "keep"), &[ip("10.0.0.250")]).await,
        Err(IpamError::NotClaimed(ip("10.0.0.250")))
    );
    // a claim of this node without an attachment annotation is not ours to GC
    let mut legacy = who("z", "z").claim_for(ip("10.0.0.251"));
    legacy.metadata.annotations = None;
    ipam.store().insert_foreign(legacy);
    // another node's claim is never touched
    let mut remote = who("r", "r");
    remote.node = "node-b".into();
    ipam.store()
        .insert_foreign(remote.claim_for(ip("10.0.0.252")));

    let keep = BTreeSet::from(["keep/eth0".to_string()]);
    assert_eq!(ipam.gc("node-a", &keep).await.unwrap(), 1);
    let snap = ipam.store().snapshot();
    assert!(snap.contains_key(&a[0].claim));
    assert!(!snap.contains_key(&b[0].claim));
    assert!(snap.contains_key("f-10-0-0-251"));
    assert!(snap.contains_key("f-10-0-0-252"));
}

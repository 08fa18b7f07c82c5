use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use cozyplane_api::FabricIP;

use super::*;
use crate::ipam::memory::{Faults, MemoryClaimStore};
use crate::ipam::tests::{release_of, who_on as who};
use crate::ipam::{FabricIpam, Ipam, IpamError, Pools};

/// The memory store, counting what reaches it.
#[derive(Default)]
struct Counted {
    store: MemoryClaimStore,
    lists_by_pod: AtomicU64,
    lists_by_node: AtomicU64,
    gets: AtomicU64,
}

impl Counted {
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.lists_by_pod.load(Ordering::SeqCst),
            self.lists_by_node.load(Ordering::SeqCst),
            self.gets.load(Ordering::SeqCst),
        )
    }
}

#[async_trait]
impl ClaimStore for Arc<Counted> {
    async fn create(&self, claim: &FabricIP) -> Result<Created, StoreError> {
        self.store.create(claim).await
    }
    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
        self.store.delete(name, uid).await
    }
    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.lists_by_pod.fetch_add(1, Ordering::SeqCst);
        self.store.list_by_pod_uid(pod_uid).await
    }
    async fn list_by_node(&self, node: &str) -> Result<Vec<FabricIP>, StoreError> {
        self.lists_by_node.fetch_add(1, Ordering::SeqCst);
        self.store.list_by_node(node).await
    }
    async fn get(&self, name: &str) -> Result<Option<FabricIP>, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.store.get(name).await
    }
}

type Indexed = NodeIndexed<Arc<Counted>, FabricIP>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn setup() -> (Arc<Counted>, FabricIpam<Indexed>) {
    let counted = Arc::new(Counted::default());
    let indexed = NodeIndexed::new(Arc::clone(&counted), "node-a");
    let ipam = FabricIpam::new(indexed, Pools::parse("10.0.0.0/24", &[]).unwrap());
    (counted, ipam)
}

fn names(v: &[FabricIP]) -> Vec<String> {
    let mut n: Vec<String> = v.iter().filter_map(|o| o.metadata.name.clone()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn until_seeded_every_lookup_is_a_live_list() {
    let (counted, ipam) = setup();
    assert!(!ipam.store().is_seeded());
    ipam.allocate(&who("u1", "c", "node-a")).await.unwrap();
    assert_eq!(counted.counts(), (1, 0, 0), "one live list by pod");
    let found = ipam.store().list_by_pod_uid("u1").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(counted.counts(), (2, 0, 0));
}

#[tokio::test]
async fn once_seeded_a_new_pod_costs_no_read_and_a_known_one_a_read_per_claim() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let w = who("u1", "c", "node-a");
    let first = ipam.allocate(&w).await.unwrap();
    assert_eq!(
        counted.counts(),
        (0, 1, 0),
        "a new pod: its one create only"
    );
    // a retried ADD reuses the claim, found by name
    let again = ipam.allocate(&w).await.unwrap();
    assert!(again[0].reused);
    assert_eq!(again[0].address, first[0].address);
    assert_eq!(counted.counts(), (0, 1, 1));
    // DEL finds it by name and releases it; the name leaves the index
    assert_eq!(ipam.release(&release_of(&w)).await.unwrap(), 1);
    assert_eq!(counted.counts(), (0, 1, 2));
    assert!(ipam.store().is_empty());
    assert!(counted.store.snapshot().is_empty());
}

#[tokio::test]
async fn a_claim_made_before_the_agent_started_is_found_after_the_seed() {
    let (counted, ipam) = setup();
    let w = who("u1", "c", "node-a");
    // the previous agent process made it
    counted.store.insert_foreign(w.claim_for(ip("10.0.0.77")));
    // another node's claim is not this index's
    counted
        .store
        .insert_foreign(who("u2", "c", "node-b").claim_for(ip("10.0.0.78")));
    assert_eq!(ipam.store().seed().await.unwrap(), 1);
    let again = ipam.allocate(&w).await.unwrap();
    assert_eq!(again[0].address, ip("10.0.0.77"));
    assert!(
        again[0].reused,
        "the retry reuses what the old agent claimed"
    );
    assert_eq!(counted.store.snapshot().len(), 2, "no second claim");
}

#[tokio::test]
async fn a_claim_deleted_behind_the_index_is_a_read_then_forgotten() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let w = who("u1", "c", "node-a");
    let lease = ipam.allocate(&w).await.unwrap().remove(0);
    // the controller's GC deletes it
    assert_eq!(
        counted.store.delete(&lease.claim, &lease.claim_uid).await,
        Ok(Deleted::Deleted)
    );
    assert!(ipam.store().list_by_pod_uid("u1").await.unwrap().is_empty());
    assert!(ipam.store().is_empty(), "the stale name is dropped");
    let gets = counted.counts().2;
    assert!(ipam.store().list_by_pod_uid("u1").await.unwrap().is_empty());
    assert_eq!(counted.counts().2, gets, "and costs no more reads");
}

#[tokio::test]
async fn a_create_with_an_unknown_outcome_sends_its_pod_back_to_live_lists() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let w = who("u1", "c", "node-a");
    // applied, then reported lost; the rollback's read-back is refused too
    counted.store.set_faults(Faults {
        creates_before_failure: Some(0),
        create_applied_then_lost: true,
        deletes_fail: true,
    });
    assert!(ipam.allocate(&w).await.unwrap_err().is_transient());
    assert_eq!(counted.store.snapshot().len(), 1, "the escaped claim");
    counted.store.set_faults(Faults::default());
    // the index never recorded the name; the retry must still find it
    let again = ipam.allocate(&w).await.unwrap();
    assert!(again[0].reused, "{again:?}");
    assert_eq!(counted.store.snapshot().len(), 1);
    assert_eq!(counted.counts().0, 1, "the doubted pod was listed live");
    // that list cleared the doubt and recorded the name
    let lists = counted.counts().0;
    assert_eq!(ipam.store().list_by_pod_uid("u1").await.unwrap().len(), 1);
    assert_eq!(counted.counts().0, lists);
    // other pods never left the index path
    ipam.allocate(&who("u2", "c", "node-a")).await.unwrap();
    assert_eq!(counted.counts().0, lists);
}

#[tokio::test]
async fn a_claim_labelled_for_another_node_is_looked_up_live() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let w = who("u1", "c", "node-b");
    ipam.allocate(&w).await.unwrap();
    // every lookup stays live while the claim exists, not only the first
    for n in 1..=3 {
        let lists = counted.counts().0;
        assert_eq!(
            ipam.store().list_by_pod_uid("u1").await.unwrap().len(),
            1,
            "{n}"
        );
        assert_eq!(counted.counts().0, lists + 1, "lookup {n} was a live list");
    }
    // once it is gone, the pod leaves doubt after one more live list
    assert_eq!(ipam.release(&release_of(&w)).await.unwrap(), 1);
    assert!(ipam.store().list_by_pod_uid("u1").await.unwrap().is_empty());
    let lists = counted.counts().0;
    assert!(ipam.store().list_by_pod_uid("u1").await.unwrap().is_empty());
    assert_eq!(counted.counts().0, lists, "back on the index");
}

#[tokio::test]
async fn a_stale_delete_does_not_drop_the_name_a_newer_claim_holds() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let a = who("a", "c", "node-a");
    let old = ipam.allocate(&a).await.unwrap().remove(0);
    assert_eq!(ipam.release(&release_of(&a)).await.unwrap(), 1);
    // pod b claims the same address (its name) through the index
    let b = who("b", "c", "node-a");
    let claim = b.claim_for(old.address);
    assert!(matches!(
        ipam.store().create(&claim).await.unwrap(),
        Created::Created(_)
    ));
    // a late delete of a's claim (its UID) meets b's
    assert_eq!(
        ipam.store().delete(&old.claim, &old.claim_uid).await,
        Ok(Deleted::UidMismatch)
    );
    let gets = counted.counts().2;
    let found = ipam.store().list_by_pod_uid("b").await.unwrap();
    assert_eq!(names(&found), vec![old.claim.clone()]);
    assert_eq!(counted.counts().2, gets + 1, "found by name, not listed");
    assert_eq!(counted.counts().0, 0);
}

#[tokio::test]
async fn a_reseed_drops_names_of_claims_others_deleted_and_keeps_new_ones() {
    let (counted, ipam) = setup();
    ipam.store().seed().await.unwrap();
    let mut leases = Vec::new();
    for i in 0..5 {
        leases.push(
            ipam.allocate(&who(&format!("u{i}"), "c", "node-a"))
                .await
                .unwrap()
                .remove(0),
        );
    }
    assert_eq!(ipam.store().len(), 5);
    for l in &leases[..3] {
        counted.store.delete(&l.claim, &l.claim_uid).await.unwrap();
    }
    assert_eq!(ipam.store().seed().await.unwrap(), 2);
    // the two left are still found by name
    for (i, l) in leases.iter().enumerate().skip(3) {
        let found = ipam
            .store()
            .list_by_pod_uid(&format!("u{i}"))
            .await
            .unwrap();
        assert_eq!(names(&found), vec![l.claim.clone()]);
    }
    assert_eq!(counted.counts().0, 0);
}

/// The allocator's concurrency guarantees hold through the index: fifty
/// pods on a pool of 29 addresses, each ADD retried once, never share an
/// address and never hold two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_and_retries_through_the_index_never_double_claim() {
    let counted = Arc::new(Counted::default());
    let indexed = NodeIndexed::new(Arc::clone(&counted), "node-a");
    indexed.seed().await.unwrap();
    let ipam = Arc::new(FabricIpam::new(
        indexed,
        Pools::parse("10.1.0.0/27", &[]).unwrap(),
    ));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let ipam = Arc::clone(&ipam);
            tokio::spawn(async move {
                let w = who(&format!("uid-{i}"), "c", "node-a");
                let first = ipam.allocate(&w).await;
                let again = ipam.allocate(&w).await;
                (first, again)
            })
        })
        .collect();
    let mut held = std::collections::BTreeSet::new();
    for t in tasks {
        match t.await.unwrap() {
            (Ok(first), Ok(again)) => {
                assert_eq!(first[0].address, again[0].address);
                assert!(again[0].reused);
                assert!(held.insert(first[0].address), "address handed out twice");
            }
            (Err(IpamError::Exhausted { .. }), Err(IpamError::Exhausted { .. })) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(counted.store.snapshot().len(), held.len(), "one claim each");
    assert_eq!(ipam.store().len(), held.len());
    assert_eq!(counted.counts().0, 0, "no label scan once seeded");
}

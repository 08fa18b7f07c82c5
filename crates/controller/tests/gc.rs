//! FabricIP GC end to end against the real API server (in process, on the
//! embedded store): pods and claims are real objects, the controller
//! watches and deletes through the same HTTP API a cluster would serve.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::FabricIP;
use cozyplane_controller::gc::decide::{Candidate, Reason};
use cozyplane_controller::gc::{Gc, GcConfig, Outcome};
use cozyplane_controller::leader::{ElectionConfig, Leadership};
use cozyplane_controller::metrics::Metrics;
use cozyplane_controller::{Controller, ControllerConfig, RunningController};
use cozyplane_testkit::eventually_async;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use support::{claim, claim_exists, create_claim, create_pod, delete_pod, start, start_on};

const LIMIT: Duration = Duration::from_secs(30);

fn gc_config(grace: Duration) -> GcConfig {
    GcConfig {
        grace,
        // Far beyond the test: every pass here is event- or maturity-driven.
        resync: Duration::from_secs(3600),
        debounce: Duration::from_millis(50),
    }
}

async fn controller(
    client: &kube::Client,
    grace: Duration,
    election: Option<ElectionConfig>,
) -> RunningController {
    Controller::start(
        client.clone(),
        ControllerConfig {
            election,
            gc: gc_config(grace),
            vpc: cozyplane_controller::vpc::VpcConfig::default(),
            metrics_bind: Some("127.0.0.1:0".parse().expect("addr")),
        },
    )
    .await
    .expect("controller start")
}

fn count(c: &impl cozyplane_controller::metrics::CountValue) -> u64 {
    Metrics::get(c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_and_stale_claims_are_collected_live_ones_kept() {
    collect_scenario(start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_and_stale_claims_are_collected_on_etcd() {
    let Some(h) = start_on(true, "controller_gc_etcd").await else {
        return; // skipped outside CI, with a note printed by `require`
    };
    collect_scenario(h).await;
}

/// Pods deleted or re-created without a DEL lose their claims; live pods
/// and young claims keep theirs.
async fn collect_scenario(h: support::Harness) {
    let c = &h.client;
    let alive = create_pod(c, "default", "alive").await;
    let doomed = create_pod(c, "default", "doomed").await;
    let web_old = create_pod(c, "default", "web-0").await;
    create_claim(c, &claim(1, "default", "alive", &alive)).await;
    create_claim(c, &claim(2, "default", "doomed", &doomed)).await;
    create_claim(c, &claim(3, "default", "web-0", &web_old)).await;

    let grace = Duration::from_secs(2);
    let ctrl = controller(c, grace, None).await;
    eventually_async("caches synced and a first pass", LIMIT, || async {
        count(&ctrl.metrics().passes) > 0
    })
    .await;

    // The pod goes away without a DEL; web-0 is re-created with a new UID.
    delete_pod(c, "default", "doomed").await;
    delete_pod(c, "default", "web-0").await;
    let web_new = create_pod(c, "default", "web-0").await;
    assert_ne!(web_new, web_old);

    eventually_async("the orphan f-10-244-0-2 collected", LIMIT, || {
        claim_exists_not(c, "f-10-244-0-2")
    })
    .await;
    eventually_async("the stale f-10-244-0-3 collected", LIMIT, || {
        claim_exists_not(c, "f-10-244-0-3")
    })
    .await;
    assert!(
        claim_exists(c, "f-10-244-0-1").await,
        "a live pod's claim was collected"
    );
    counted(&[&ctrl], 2).await;
    assert_eq!(count(&ctrl.metrics().deletions), 2);

    // The new web-0 claims an address: kept (its UID matches).
    create_claim(c, &claim(4, "default", "web-0", &web_new)).await;

    // An ADD in flight: the claim exists before its pod. It must survive the
    // grace period, then (the pod never came) be collected.
    let young = create_claim(c, &claim(5, "default", "not-yet", "uid-not-yet")).await;
    let created = young
        .metadata
        .creation_timestamp
        .expect("creationTimestamp")
        .0;
    eventually_async("the young orphan collected after its grace", LIMIT, || {
        claim_exists_not(c, "f-10-244-0-5")
    })
    .await;
    let gone_seen = Timestamp::now();
    let grace_signed = SignedDuration::try_from(grace).expect("grace");
    assert!(
        gone_seen >= created.checked_add(grace_signed).expect("ts"),
        "collected at {gone_seen}, inside the grace period of a claim created at {created}"
    );
    assert!(claim_exists(c, "f-10-244-0-1").await);
    assert!(claim_exists(c, "f-10-244-0-4").await);
    counted(&[&ctrl], 3).await;
    assert_eq!(count(&ctrl.metrics().deletions), 3);

    // The metrics endpoint reports the same.
    let addr = ctrl.metrics_addr().expect("metrics bound");
    let text = http_get(addr, "/metrics").await;
    assert!(
        text.contains("\ncozyplane_controller_gc_deletions_total 3\n"),
        "{text}"
    );
    assert!(text.contains("\ncozyplane_controller_leader 1\n"), "{text}");
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));

    ctrl.shutdown().await;
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_inside_the_grace_period_are_kept() {
    let h = start().await;
    let c = &h.client;
    let ctrl = controller(c, Duration::from_secs(3600), None).await;
    eventually_async("caches synced and a first pass", LIMIT, || async {
        count(&ctrl.metrics().passes) > 0
    })
    .await;
    create_claim(c, &claim(9, "default", "ghost", "uid-ghost")).await;
    create_claim(c, &claim(10, "default", "ghost2", "uid-ghost2")).await;
    // A pass has run with both orphans in its cache (the gauges are set by
    // the pass itself), and judged neither.
    eventually_async("a pass that saw both young claims", LIMIT, || async {
        count(&ctrl.metrics().young_claims) == 2 && count(&ctrl.metrics().claims) == 2
    })
    .await;
    assert!(claim_exists(c, "f-10-244-0-9").await);
    assert!(claim_exists(c, "f-10-244-0-10").await);
    assert_eq!(count(&ctrl.metrics().deletions), 0);
    ctrl.shutdown().await;
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_read_and_preconditions_guard_every_delete() {
    let h = start().await;
    let c = &h.client;
    let uid = create_pod(c, "default", "p").await;
    let stored = create_claim(c, &claim(20, "default", "p", &uid)).await;
    let metrics = Arc::new(Metrics::default());
    let gc = Gc::new(
        c.clone(),
        gc_config(Duration::ZERO),
        Arc::clone(&metrics),
        Leadership::unconditional(),
    );
    let candidate = |rv: &str, uid_of_claim: &str| Candidate {
        name: "f-10-244-0-20".into(),
        uid: uid_of_claim.into(),
        resource_version: rv.into(),
        pod_namespace: "default".into(),
        pod_name: "p".into(),
        pod_uid: Some(uid.clone()),
        reason: Reason::PodMissing,
    };
    let rv = stored.metadata.resource_version.clone().expect("rv");
    let claim_uid = stored.metadata.uid.clone().expect("uid");

    // A stale cache said "pod missing"; the live read finds it: kept.
    assert_eq!(
        gc.collect(&candidate(&rv, &claim_uid))
            .await
            .expect("collect"),
        Outcome::Alive
    );
    assert!(claim_exists(c, "f-10-244-0-20").await);
    assert_eq!(Metrics::get(&metrics.saved_by_live_read), 1);

    delete_pod(c, "default", "p").await;
    // The claim changed since it was judged: the resourceVersion refuses.
    let api: Api<FabricIP> = Api::all(c.clone());
    let mut changed = api.get("f-10-244-0-20").await.expect("get");
    changed
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("touched".into(), "yes".into());
    api.replace("f-10-244-0-20", &PostParams::default(), &changed)
        .await
        .expect("update");
    assert_eq!(
        gc.collect(&candidate(&rv, &claim_uid))
            .await
            .expect("collect"),
        Outcome::Conflict
    );
    assert!(claim_exists(c, "f-10-244-0-20").await);

    // The address was released and re-claimed: a new object, another UID.
    api.delete("f-10-244-0-20", &Default::default())
        .await
        .expect("delete");
    let reclaimed = create_claim(c, &claim(20, "default", "p", &uid)).await;
    let new_rv = reclaimed.metadata.resource_version.clone().expect("rv");
    assert_eq!(
        gc.collect(&candidate(&new_rv, &claim_uid))
            .await
            .expect("collect"),
        Outcome::Conflict
    );
    assert!(claim_exists(c, "f-10-244-0-20").await);
    assert_eq!(Metrics::get(&metrics.precondition_conflicts), 2);

    // With the right UID and resourceVersion it goes, once.
    let new_uid = reclaimed.metadata.uid.clone().expect("uid");
    assert_eq!(
        gc.collect(&candidate(&new_rv, &new_uid))
            .await
            .expect("collect"),
        Outcome::Deleted
    );
    assert!(!claim_exists(c, "f-10-244-0-20").await);
    assert_eq!(
        gc.collect(&candidate(&new_rv, &new_uid))
            .await
            .expect("collect"),
        Outcome::AlreadyGone
    );
    assert_eq!(Metrics::get(&metrics.deletions), 1);
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_controllers_only_the_leader_deletes() {
    let h = start().await;
    let c = &h.client;
    let election = |id: &str| {
        let mut e = ElectionConfig::new("kube-system", "gc-test", id);
        // Generous margins: a leadership change mid-test would split the
        // deletions between the two and fail the count below.
        e.lease_duration = Duration::from_secs(6);
        e.renew_interval = Duration::from_secs(2);
        e
    };
    let a = controller(c, Duration::from_secs(1), Some(election("ctrl-a"))).await;
    let b = controller(c, Duration::from_secs(1), Some(election("ctrl-b"))).await;
    eventually_async("a leader", LIMIT, || async {
        a.is_leader() || b.is_leader()
    })
    .await;
    assert!(!(a.is_leader() && b.is_leader()), "two leaders");
    let (leader, follower) = if a.is_leader() { (&a, &b) } else { (&b, &a) };

    for n in 30..35 {
        create_claim(
            c,
            &claim(n, "default", &format!("gone-{n}"), &format!("uid-{n}")),
        )
        .await;
    }
    for n in 30..35 {
        let name = format!("f-10-244-0-{n}");
        eventually_async(&format!("{name} collected"), LIMIT, || {
            claim_exists_not(c, &name)
        })
        .await;
    }
    // Every orphan was deleted exactly once, each by the leader.
    counted(&[leader, follower], 5).await;
    assert_eq!(count(&leader.metrics().deletions), 5);
    assert_eq!(count(&follower.metrics().deletions), 0);
    assert_eq!(
        count(&follower.metrics().passes),
        0,
        "a follower ran GC passes"
    );
    assert!(
        http_get(follower.metrics_addr().expect("bound"), "/metrics")
            .await
            .contains("\ncozyplane_controller_leader 0\n")
    );
    a.shutdown().await;
    b.shutdown().await;
    h.server.shutdown().await;
}

/// Waits until the controllers' deletion counters add up to at least `n`.
///
/// A claim is gone for the test's GET the moment the API server commits
/// its delete, but the deleting controller counts it only after the answer
/// has come back to it: under load the test can look in between (seen as
/// "leader counted 4 of 5 deletions" with the fifth counted a moment
/// later). So the counts are read once they have caught up with what the
/// test saw; the callers then assert them exactly, so a deletion counted
/// twice, or by the wrong controller, still fails.
async fn counted(ctrls: &[&RunningController], n: u64) {
    eventually_async(&format!("{n} deletions counted"), LIMIT, || async {
        ctrls
            .iter()
            .map(|c| count(&c.metrics().deletions))
            .sum::<u64>()
            >= n
    })
    .await;
}

async fn claim_exists_not(c: &kube::Client, name: &str) -> bool {
    !claim_exists(c, name).await
}

/// A minimal HTTP/1.1 GET (the test needs no HTTP client dependency).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

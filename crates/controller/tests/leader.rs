//! Leader election against the real API server's coordination.k8s.io/v1
//! Leases (in process, embedded store): one leader of two, takeover after a
//! crash, release on shutdown, and stepping down when renewal is impossible.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::time::Duration;

use cozyplane_controller::leader::{ElectionConfig, Elector, Leadership};
use cozyplane_testkit::eventually_async;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use support::{start, start_on};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const LIMIT: Duration = Duration::from_secs(30);

struct Candidate {
    identity: String,
    leadership: Leadership,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn spawn(client: &Client, lease: &str, identity: &str) -> Candidate {
    let mut config = ElectionConfig::new("kube-system", lease, identity);
    config.lease_duration = LEASE;
    config.renew_interval = RENEW;
    let (elector, leadership) = Elector::new(client.clone(), config).expect("config");
    let (stop, rx) = watch::channel(false);
    Candidate {
        identity: identity.to_string(),
        leadership,
        stop,
        task: tokio::spawn(elector.run(rx)),
    }
}

async fn lease(client: &Client, name: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get(name)
        .await
        .expect("get lease")
}

fn holder(l: &Lease) -> Option<String> {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

fn transitions(l: &Lease) -> i32 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_one_leader_and_takeover_after_a_crash() {
    pair_scenario(start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_one_leader_and_takeover_on_etcd() {
    let Some(h) = start_on(true, "controller_leader_etcd").await else {
        return; // skipped outside CI, with a note printed by `require`
    };
    pair_scenario(h).await;
}

async fn pair_scenario(h: support::Harness) {
    let c = &h.client;
    let a = spawn(c, "pair", "a");
    let b = spawn(c, "pair", "b");
    eventually_async("a leader", LIMIT, || async {
        a.leadership.is_leader() || b.leadership.is_leader()
    })
    .await;

    // Over several renewals: never two leaders, and the Lease names the one.
    for _ in 0..40 {
        let (la, lb) = (a.leadership.is_leader(), b.leadership.is_leader());
        assert!(!(la && lb), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (leader, follower) = if a.leadership.is_leader() {
        (a, b)
    } else {
        (b, a)
    };
    let held = lease(c, "pair").await;
    assert_eq!(holder(&held), Some(leader.identity.clone()));
    let spec = held.spec.clone().expect("spec");
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
    // Renewals move renewTime, not acquireTime.
    let first_renew = spec.renew_time.clone();
    eventually_async("a renewal", LIMIT, || async {
        let l = lease(c, "pair").await;
        let s = l.spec.expect("spec");
        s.renew_time != first_renew && s.acquire_time == spec.acquire_time
    })
    .await;
    let before = transitions(&held);

    // Kill the leader: no release, the Lease must expire.
    leader.task.abort();
    let _ = leader.task.await;
    let killed = std::time::Instant::now();
    eventually_async("the follower takes over", LIMIT, || async {
        follower.leadership.is_leader()
    })
    .await;
    // A figure, not an assertion: expect about LEASE (+ up to one RENEW).
    eprintln!(
        "takeover {:?} after the leader was killed (lease {LEASE:?}, renew {RENEW:?})",
        killed.elapsed()
    );
    let taken = lease(c, "pair").await;
    assert_eq!(holder(&taken), Some(follower.identity.clone()));
    assert_eq!(transitions(&taken), before + 1);

    follower.stop.send_replace(true);
    follower.task.await.expect("join");
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_lease_for_an_immediate_successor() {
    let h = start().await;
    let c = &h.client;
    let a = spawn(c, "release", "a");
    eventually_async("a leads", LIMIT, || async { a.leadership.is_leader() }).await;
    a.stop.send_replace(true);
    a.task.await.expect("join");
    assert!(!a.leadership.is_leader());
    let released = lease(c, "release").await;
    assert_eq!(holder(&released), None, "the holder was not cleared");

    // A newcomer has never seen this Lease change, yet takes it at once:
    // a released Lease needs no expiry.
    let b = spawn(c, "release", "b");
    eventually_async("b leads", LIMIT, || async { b.leadership.is_leader() }).await;
    assert_eq!(holder(&lease(c, "release").await), Some("b".into()));
    b.stop.send_replace(true);
    b.task.await.expect("join");
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_sees_another_holder_steps_down() {
    let h = start().await;
    let c = &h.client;
    let a = spawn(c, "stolen", "a");
    eventually_async("a leads", LIMIT, || async { a.leadership.is_leader() }).await;

    // Somebody else writes the Lease (an operator, or a peer that judged it
    // expired): a's next renewal sees a live foreign holder.
    let api: Api<Lease> = Api::namespaced(c.clone(), "kube-system");
    let mut l = api.get("stolen").await.expect("get");
    if let Some(s) = l.spec.as_mut() {
        s.holder_identity = Some("intruder".into());
        s.lease_duration_seconds = Some(3600);
        s.renew_time = Some(MicroTime(Timestamp::now()));
    }
    api.replace("stolen", &PostParams::default(), &l)
        .await
        .expect("steal");
    eventually_async("a steps down", LIMIT, || async {
        !a.leadership.is_leader()
    })
    .await;
    // ...and stays down while the intruder's Lease is live.
    for _ in 0..20 {
        assert!(
            !a.leadership.is_leader(),
            "a acted against a live foreign lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(holder(&lease(c, "stolen").await), Some("intruder".into()));
    a.stop.send_replace(true);
    a.task.await.expect("join");
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_acting() {
    let h = start().await;
    let c = h.client.clone();
    let a = spawn(&c, "unreachable", "a");
    eventually_async("a leads", LIMIT, || async { a.leadership.is_leader() }).await;
    // The API server goes away: renewals fail.
    h.server.shutdown().await;
    eventually_async("a stops acting", LIMIT, || async {
        !a.leadership.is_leader()
    })
    .await;
    a.stop.send_replace(true);
    a.task.await.expect("join");
}

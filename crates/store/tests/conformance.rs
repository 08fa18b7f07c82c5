//! The storage conformance suite: every case is written once against
//! `&dyn Storage` and instantiated for the embedded store and for etcd.
//!
//! etcd: one server per test binary (or `COZYPLANE_TEST_ETCD`), a unique key
//! prefix per test so tests run in parallel. Cases that compact get a server
//! of their own, because compaction is global to an etcd. etcd revisions are
//! shared with the other tests, so revisions are only asserted to increase
//! strictly there; "+1 per write" is asserted for the embedded store.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_store::testing::{shared_etcd, unique_prefix, EtcdServer};
use cozyplane_store::{
    EmbeddedOptions, EmbeddedStore, EtcdOptions, EtcdStore, KeyValue, ListOptions, Revision,
    Storage, StoreError, WatchEvent, WatchStream,
};
use cozyplane_testkit::Needs;
use futures::StreamExt;

/// A store under test plus what keeps it alive.
pub struct Fixture {
    store: Arc<dyn Storage>,
    /// Every write advances the revision by exactly one (embedded only).
    contiguous: bool,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

impl Fixture {
    fn s(&self) -> &dyn Storage {
        self.store.as_ref()
    }
}

const PROGRESS: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(15);

fn embedded() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    // A tiny broadcast buffer forces the lag/re-read path in the watch cases.
    let opts = EmbeddedOptions {
        progress_interval: PROGRESS,
        watch_lag: 4,
        watch_buffer: 16,
        ..Default::default()
    };
    let store = EmbeddedStore::open_with(dir.path().join("store.redb"), opts).unwrap();
    Fixture {
        store: Arc::new(store),
        contiguous: true,
        _keep: Box::new(dir),
    }
}

async fn etcd(test: &str, own_server: bool) -> Option<Fixture> {
    // Tiny list chunks make every multi-key list span several etcd range reads.
    let opts = EtcdOptions {
        progress_interval: PROGRESS,
        watch_buffer: 16,
        list_chunk: 4,
        ..Default::default()
    };
    let prefix = unique_prefix(test);
    if own_server {
        let server = Needs::new(test).ready_with(EtcdServer::start())?;
        let store = EtcdStore::connect_with(&[server.endpoint()], &prefix, opts)
            .await
            .unwrap();
        return Some(Fixture {
            store: Arc::new(store),
            contiguous: false,
            _keep: Box::new(server),
        });
    }
    let endpoint = Needs::new(test).ready_with(shared_etcd())?;
    let store = EtcdStore::connect_with(&[endpoint], &prefix, opts)
        .await
        .unwrap();
    Some(Fixture {
        store: Arc::new(store),
        contiguous: false,
        _keep: Box::new(()),
    })
}

/// Instantiate each case for both backends. `own` cases need their own etcd.
macro_rules! conformance {
    (shared: [$($shared:ident),* $(,)?], own: [$($own:ident),* $(,)?] $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    super::cases::$shared(&super::embedded()).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $own() {
                    super::cases::$own(&super::embedded()).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() {
                    if let Some(f) = super::etcd(&cozyplane_testkit::test_name!(), false).await {
                        super::cases::$shared(&f).await;
                    }
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $own() {
                    if let Some(f) = super::etcd(&cozyplane_testkit::test_name!(), true).await {
                        super::cases::$own(&f).await;
                    }
                }
            )*
        }
    };
}

conformance!(
    shared: [
        create_get_and_already_exists,
        revisions_increase_per_write,
        update_compare_and_swap,
        delete_with_and_without_expected,
        list_prefix_isolation_and_order,
        list_pagination,
        list_at_old_revision,
        list_future_revision,
        count_prefix,
        watch_from_now,
        watch_replays_then_goes_live,
        watch_slow_consumer_loses_nothing,
        many_watchers_see_the_same_sequence,
        concurrent_creates_one_wins,
        progress_events_arrive,
        refused_requests_keep_the_store_ready,
    ],
    own: [compaction],
);

fn v(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn keys(items: &[KeyValue]) -> Vec<&str> {
    items.iter().map(|kv| kv.key.as_str()).collect()
}

async fn list(
    s: &dyn Storage,
    prefix: &str,
    revision: Option<Revision>,
) -> Result<Vec<KeyValue>, StoreError> {
    let opts = ListOptions {
        prefix: prefix.into(),
        revision,
        ..Default::default()
    };
    Ok(s.list(&opts).await?.items)
}

/// The next non-progress event, or a panic after [`WAIT`] (progress events
/// do not extend the deadline).
async fn next_change(w: &mut WatchStream) -> WatchEvent {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Ok(WatchEvent::Progress { .. }))) => continue,
            Ok(Some(Ok(e))) => return e,
            Ok(Some(Err(e))) => panic!("watch failed: {e}"),
            Ok(None) => panic!("watch ended"),
            Err(_) => panic!("no watch event within {WAIT:?}"),
        }
    }
}

/// A watch that must fail with Compacted: either at once or as its first item.
async fn expect_watch_compacted(s: &dyn Storage, prefix: &str, after: Revision) {
    match s.watch(prefix, after).await {
        Err(StoreError::Compacted { .. }) => {}
        Err(e) => panic!("watch after {after}: expected Compacted, got {e}"),
        Ok(mut w) => match tokio::time::timeout(WAIT, w.next()).await {
            Ok(Some(Err(StoreError::Compacted { .. }))) => {}
            other => panic!("watch after {after}: expected Compacted, got {other:?}"),
        },
    }
}

fn assert_increasing(revs: &[Revision], contiguous: bool) {
    for pair in revs.windows(2) {
        assert!(pair[1] > pair[0], "revisions not increasing: {revs:?}");
        if contiguous {
            assert_eq!(pair[1], pair[0] + 1, "revisions skip: {revs:?}");
        }
    }
}

mod cases {
    use super::*;

    /// Readiness follows storage faults only (tests/storage_faults.rs in the
    /// API server fills the disk): a request refused on its own merits
    /// (AlreadyExists, Conflict, NotFound) leaves the store ready.
    pub async fn refused_requests_keep_the_store_ready(f: &Fixture) {
        let s = f.s();
        s.ready().await.unwrap();
        let r = s.create("ready/a", v("one")).await.unwrap();
        assert!(matches!(
            s.create("ready/a", v("two")).await,
            Err(StoreError::AlreadyExists { .. })
        ));
        assert!(matches!(
            s.update("ready/a", v("two"), r + 100).await,
            Err(StoreError::Conflict { .. })
        ));
        assert!(matches!(
            s.delete("ready/missing", None).await,
            Err(StoreError::NotFound { .. })
        ));
        s.ready().await.unwrap();
    }

    pub async fn create_get_and_already_exists(f: &Fixture) {
        let s = f.s();
        let before = s.current_revision().await.unwrap();
        let r1 = s.create("a/1", v("one")).await.unwrap();
        assert!(r1 > before);
        if f.contiguous {
            assert_eq!(r1, before + 1);
        }
        let got = s
            .get("a/1")
            .await
            .unwrap()
            .expect("created key is readable");
        assert_eq!(
            got,
            KeyValue {
                key: "a/1".into(),
                value: v("one"),
                create_revision: r1,
                mod_revision: r1
            }
        );

        match s.create("a/1", v("two")).await {
            Err(StoreError::AlreadyExists { key }) => assert_eq!(key, "a/1"),
            other => panic!("second create: {other:?}"),
        }
        assert_eq!(
            s.get("a/1").await.unwrap(),
            Some(got),
            "failed create changed the value"
        );
        assert_eq!(s.get("a/missing").await.unwrap(), None);
        assert!(s.current_revision().await.unwrap() >= r1);
        if f.contiguous {
            assert_eq!(
                s.current_revision().await.unwrap(),
                r1,
                "failed create bumped the revision"
            );
        }
    }

    pub async fn revisions_increase_per_write(f: &Fixture) {
        let s = f.s();
        let mut revs = vec![s.create("r/1", v("a")).await.unwrap()];
        revs.push(s.update("r/1", v("b"), revs[0]).await.unwrap());
        revs.push(s.create("r/2", v("c")).await.unwrap());
        revs.push(s.delete("r/1", None).await.unwrap().1);
        revs.push(s.create("r/1", v("d")).await.unwrap());
        assert_increasing(&revs, f.contiguous);
        let current = s.current_revision().await.unwrap();
        assert!(current >= revs[4]);
        if f.contiguous {
            assert_eq!(current, revs[4]);
        }
        // A recreated key starts a new incarnation.
        let kv = s.get("r/1").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision), (revs[4], revs[4]));
    }

    pub async fn update_compare_and_swap(f: &Fixture) {
        let s = f.s();
        let r1 = s.create("u/1", v("v1")).await.unwrap();
        let r2 = s.update("u/1", v("v2"), r1).await.unwrap();
        assert!(r2 > r1);
        let now = s.get("u/1").await.unwrap().unwrap();
        assert_eq!(
            (now.value.clone(), now.create_revision, now.mod_revision),
            (v("v2"), r1, r2)
        );

        match s.update("u/1", v("stale"), r1).await {
            Err(StoreError::Conflict {
                key,
                expected,
                current,
            }) => {
                assert_eq!((key.as_str(), expected), ("u/1", r1));
                assert_eq!(*current, now, "Conflict must carry the stored value");
            }
            other => panic!("stale update: {other:?}"),
        }
        match s.update("u/missing", v("x"), r1).await {
            Err(StoreError::NotFound { key }) => assert_eq!(key, "u/missing"),
            other => panic!("update of a missing key: {other:?}"),
        }
        // expected = 0 must not create a missing key (etcd reports mod 0 for it).
        assert!(matches!(
            s.update("u/missing", v("x"), 0).await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(s.get("u/missing").await.unwrap(), None);
        assert_eq!(
            s.get("u/1").await.unwrap(),
            Some(now),
            "failed updates changed the value"
        );
    }

    pub async fn delete_with_and_without_expected(f: &Fixture) {
        let s = f.s();
        let r1 = s.create("d/1", v("x")).await.unwrap();
        let r2 = s.update("d/1", v("y"), r1).await.unwrap();
        match s.delete("d/1", Some(r1)).await {
            Err(StoreError::Conflict {
                expected, current, ..
            }) => {
                assert_eq!(expected, r1);
                assert_eq!(
                    (current.value.as_slice(), current.mod_revision),
                    (&b"y"[..], r2)
                );
            }
            other => panic!("stale delete: {other:?}"),
        }
        assert!(
            s.get("d/1").await.unwrap().is_some(),
            "a failed delete removed the key"
        );
        let (prev, rd) = s.delete("d/1", Some(r2)).await.unwrap();
        assert_eq!(
            prev,
            KeyValue {
                key: "d/1".into(),
                value: v("y"),
                create_revision: r1,
                mod_revision: r2
            }
        );
        assert!(rd > r2);
        assert_eq!(s.get("d/1").await.unwrap(), None);
        assert!(matches!(
            s.delete("d/1", None).await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.delete("d/1", Some(rd)).await,
            Err(StoreError::NotFound { .. })
        ));

        s.create("d/2", v("z")).await.unwrap();
        let (prev, _) = s.delete("d/2", None).await.unwrap();
        assert_eq!(prev.value, v("z"));
        assert_eq!(list(s, "d/", None).await.unwrap(), vec![]);
    }

    pub async fn list_prefix_isolation_and_order(f: &Fixture) {
        let s = f.s();
        for k in ["a/3", "a/1", "ab/1", "a/2", "b/1", "a"] {
            s.create(k, v(k)).await.unwrap();
        }
        let r = s
            .list(&ListOptions {
                prefix: "a/".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(keys(&r.items), ["a/1", "a/2", "a/3"]);
        assert_eq!(r.remaining, 0);
        let current = s.current_revision().await.unwrap();
        if f.contiguous {
            assert_eq!(r.revision, current);
        } else {
            // Other writers to a shared etcd may have moved on since.
            assert!(r.revision <= current && r.revision >= r.items[2].mod_revision);
        }
        for kv in &r.items {
            assert_eq!(kv.value, v(&kv.key));
        }
        let all = list(s, "", None).await.unwrap();
        assert_eq!(keys(&all), ["a", "a/1", "a/2", "a/3", "ab/1", "b/1"]);
        assert_eq!(list(s, "c/", None).await.unwrap(), vec![]);
    }

    pub async fn list_pagination(f: &Fixture) {
        let s = f.s();
        let all: Vec<String> = (0..10).map(|i| format!("p/{i:02}")).collect();
        for k in &all {
            s.create(k, v(k)).await.unwrap();
        }
        s.create("pz", v("outside")).await.unwrap();
        let mut opts = ListOptions {
            prefix: "p/".into(),
            limit: Some(3),
            ..Default::default()
        };
        let first = s.list(&opts).await.unwrap();
        // Pin later pages to the first page's revision, as kube's continue does,
        // and change the data in between: the pages must not see it.
        opts.revision = Some(first.revision);
        s.create("p/05x", v("new")).await.unwrap();
        s.delete("p/08", None).await.unwrap();

        let mut seen: Vec<String> = keys(&first.items).iter().map(|k| k.to_string()).collect();
        let mut remaining = vec![first.remaining];
        let mut page = first;
        while page.remaining > 0 {
            opts.start_after = page.items.last().map(|kv| kv.key.clone());
            page = s.list(&opts).await.unwrap();
            assert_eq!(page.revision, opts.revision.unwrap());
            seen.extend(page.items.iter().map(|kv| kv.key.clone()));
            remaining.push(page.remaining);
        }
        assert_eq!(seen, all);
        assert_eq!(remaining, [7, 4, 1, 0]);

        // The current state with a page that ends exactly at the last key.
        let cur = ListOptions {
            prefix: "p/".into(),
            limit: Some(10),
            ..Default::default()
        };
        let r = s.list(&cur).await.unwrap();
        assert_eq!(r.items.len(), 10);
        assert_eq!(r.remaining, 0);
        assert!(keys(&r.items).contains(&"p/05x") && !keys(&r.items).contains(&"p/08"));
        // start_after before the prefix starts at the prefix; limit 0 means all.
        let r = s
            .list(&ListOptions {
                prefix: "p/".into(),
                start_after: Some("a".into()),
                limit: Some(0),
                revision: None,
            })
            .await
            .unwrap();
        assert_eq!(r.items.len(), 10);
    }

    pub async fn list_at_old_revision(f: &Fixture) {
        let s = f.s();
        let r1 = s.create("o/1", v("v1")).await.unwrap();
        let r2 = s.create("o/2", v("two")).await.unwrap();
        let r3 = s.update("o/1", v("v2"), r1).await.unwrap();
        let (_, r4) = s.delete("o/2", None).await.unwrap();
        let r5 = s.create("o/3", v("three")).await.unwrap();
        s.create("other/1", v("x")).await.unwrap();

        let at = |r| async move {
            list(s, "o/", Some(r))
                .await
                .unwrap()
                .into_iter()
                .map(|kv| (kv.key, kv.value, kv.mod_revision))
                .collect::<Vec<_>>()
        };
        let e = |k: &str, val: &str, m| (k.to_string(), v(val), m);
        assert_eq!(at(r1).await, [e("o/1", "v1", r1)]);
        assert_eq!(at(r2).await, [e("o/1", "v1", r1), e("o/2", "two", r2)]);
        assert_eq!(at(r3).await, [e("o/1", "v2", r3), e("o/2", "two", r2)]);
        assert_eq!(at(r4).await, [e("o/1", "v2", r3)]);
        assert_eq!(at(r5).await, [e("o/1", "v2", r3), e("o/3", "three", r5)]);
        assert_eq!(
            at(r5).await,
            list(s, "o/", None)
                .await
                .unwrap()
                .into_iter()
                .map(|kv| (kv.key, kv.value, kv.mod_revision))
                .collect::<Vec<_>>()
        );

        let page = s
            .list(&ListOptions {
                prefix: "o/".into(),
                limit: Some(1),
                revision: Some(r3),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            (keys(&page.items), page.remaining, page.revision),
            (vec!["o/1"], 1, r3)
        );
        assert_eq!(page.items[0].create_revision, r1);
    }

    pub async fn list_future_revision(f: &Fixture) {
        let s = f.s();
        s.create("f/1", v("x")).await.unwrap();
        let current = s.current_revision().await.unwrap();
        let future = current + 1_000_000;
        match s
            .list(&ListOptions {
                prefix: "f/".into(),
                revision: Some(future),
                ..Default::default()
            })
            .await
        {
            Err(StoreError::FutureRevision {
                requested,
                current: c,
            }) => {
                assert_eq!(requested, future);
                assert!(c >= current && c < future);
            }
            other => panic!("future list: {other:?}"),
        }
    }

    pub async fn count_prefix(f: &Fixture) {
        let s = f.s();
        assert_eq!(s.count("c/").await.unwrap(), 0);
        for k in ["c/1", "c/2", "c/3", "cc/1"] {
            s.create(k, v(k)).await.unwrap();
        }
        assert_eq!(s.count("c/").await.unwrap(), 3);
        assert_eq!(s.count("c").await.unwrap(), 4);
        s.delete("c/2", None).await.unwrap();
        assert_eq!(s.count("c/").await.unwrap(), 2);
        assert_eq!(s.count("").await.unwrap(), 3);
    }

    pub async fn watch_from_now(f: &Fixture) {
        let s = f.s();
        s.create("w/old", v("before the watch")).await.unwrap();
        let now = s.current_revision().await.unwrap();
        let mut w = s.watch("w/", now).await.unwrap();
        let r1 = s.create("w/1", v("a")).await.unwrap();
        s.create("x/1", v("other prefix")).await.unwrap();
        let r2 = s.update("w/1", v("b"), r1).await.unwrap();
        let (_, r3) = s.delete("w/1", None).await.unwrap();

        match next_change(&mut w).await {
            WatchEvent::Put { kv, prev } => {
                assert_eq!(
                    (
                        kv.key.as_str(),
                        kv.value.clone(),
                        kv.mod_revision,
                        kv.create_revision
                    ),
                    ("w/1", v("a"), r1, r1)
                );
                assert_eq!(prev, None);
            }
            e => panic!("expected the create, got {e:?}"),
        }
        match next_change(&mut w).await {
            WatchEvent::Put { kv, prev } => {
                assert_eq!((kv.value.clone(), kv.mod_revision), (v("b"), r2));
                let prev = prev.expect("an update carries the previous value");
                assert_eq!((prev.value, prev.mod_revision), (v("a"), r1));
            }
            e => panic!("expected the update, got {e:?}"),
        }
        match next_change(&mut w).await {
            WatchEvent::Delete { prev, revision } => {
                assert_eq!(revision, r3);
                assert_eq!(
                    (prev.key.as_str(), prev.value, prev.mod_revision),
                    ("w/1", v("b"), r2)
                );
            }
            e => panic!("expected the delete, got {e:?}"),
        }
        // Nothing else: the next item (within a progress interval or two) is progress.
        match tokio::time::timeout(WAIT, w.next()).await {
            Ok(Some(Ok(WatchEvent::Progress { revision }))) => assert!(revision >= r3),
            other => panic!("unexpected item after the delete: {other:?}"),
        }
    }

    pub async fn watch_replays_then_goes_live(f: &Fixture) {
        let s = f.s();
        let mut revs = vec![s.create("h/1", v("0")).await.unwrap()];
        for i in 1..5 {
            revs.push(
                s.update("h/1", v(&i.to_string()), revs[i - 1])
                    .await
                    .unwrap(),
            );
        }
        let mut w = s.watch("h/", revs[0]).await.unwrap();
        for i in 5..8 {
            revs.push(
                s.update("h/1", v(&i.to_string()), revs[i - 1])
                    .await
                    .unwrap(),
            );
        }
        let mut got = vec![];
        for _ in 1..8 {
            match next_change(&mut w).await {
                WatchEvent::Put { kv, .. } => got.push((kv.mod_revision, kv.value)),
                e => panic!("unexpected {e:?}"),
            }
        }
        let want: Vec<_> = (1..8).map(|i| (revs[i], v(&i.to_string()))).collect();
        assert_eq!(
            got, want,
            "replay + live must be in order, without gaps or duplicates"
        );
    }

    pub async fn watch_slow_consumer_loses_nothing(f: &Fixture) {
        let s = f.s();
        let now = s.current_revision().await.unwrap();
        let mut w = s.watch("slow/", now).await.unwrap();
        // Write far more than the watch buffers while nobody reads.
        let n = 300;
        let writers: Vec<_> = (0..6)
            .map(|t| {
                let store = f.store.clone();
                tokio::spawn(async move {
                    for i in 0..n / 6 {
                        store
                            .create(&format!("slow/{t}-{i:04}"), vec![0u8; 64])
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for wr in writers {
            wr.await.unwrap();
        }
        let mut revs = vec![];
        let mut seen = std::collections::BTreeSet::new();
        while revs.len() < n {
            match next_change(&mut w).await {
                WatchEvent::Put { kv, .. } => {
                    assert!(
                        seen.insert(kv.key.clone()),
                        "duplicate event for {}",
                        kv.key
                    );
                    revs.push(kv.mod_revision);
                }
                e => panic!("unexpected {e:?}"),
            }
        }
        assert_increasing(&revs, f.contiguous);
        assert_eq!(seen.len(), n);
    }

    pub async fn many_watchers_see_the_same_sequence(f: &Fixture) {
        let s = f.s();
        let now = s.current_revision().await.unwrap();
        let mut watchers = vec![];
        for _ in 0..20 {
            watchers.push(s.watch("m/", now).await.unwrap());
        }
        let n = 40;
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let store = f.store.clone();
                tokio::spawn(async move {
                    for i in 0..n / 4 {
                        store.create(&format!("m/{t}-{i}"), v("x")).await.unwrap();
                    }
                })
            })
            .collect();
        for wr in writers {
            wr.await.unwrap();
        }
        let mut sequences = vec![];
        for w in &mut watchers {
            let mut seq = vec![];
            for _ in 0..n {
                match next_change(w).await {
                    WatchEvent::Put { kv, .. } => seq.push((kv.mod_revision, kv.key)),
                    e => panic!("unexpected {e:?}"),
                }
            }
            sequences.push(seq);
        }
        let revs: Vec<_> = sequences[0].iter().map(|(r, _)| *r).collect();
        assert_increasing(&revs, f.contiguous);
        for seq in &sequences[1..] {
            assert_eq!(seq, &sequences[0], "watchers disagree");
        }
    }

    pub async fn concurrent_creates_one_wins(f: &Fixture) {
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = f.store.clone();
                tokio::spawn(async move {
                    (
                        i,
                        store
                            .create("race/key", format!("writer-{i}").into_bytes())
                            .await,
                    )
                })
            })
            .collect();
        let mut winners = vec![];
        for t in tasks {
            match t.await.unwrap() {
                (i, Ok(rev)) => winners.push((i, rev)),
                (_, Err(StoreError::AlreadyExists { .. })) => {}
                (_, Err(e)) => panic!("unexpected error: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one create must win: {winners:?}");
        let (i, rev) = winners[0];
        let kv = f.s().get("race/key").await.unwrap().unwrap();
        assert_eq!(
            (kv.value, kv.mod_revision),
            (format!("writer-{i}").into_bytes(), rev)
        );
    }

    pub async fn progress_events_arrive(f: &Fixture) {
        let s = f.s();
        s.create("idle-other/1", v("x")).await.unwrap();
        let now = s.current_revision().await.unwrap();
        let mut w = s.watch("idle/", now).await.unwrap();
        let mut progress = vec![];
        while progress.len() < 2 {
            match tokio::time::timeout(WAIT, w.next()).await {
                Ok(Some(Ok(WatchEvent::Progress { revision }))) => progress.push(revision),
                other => panic!("expected progress on an idle watch, got {other:?}"),
            }
        }
        assert!(
            progress[0] >= now && progress[1] >= progress[0],
            "{progress:?} (watch from {now})"
        );
        // Progress follows writes elsewhere in the store.
        let r = s.create("idle-other/2", v("y")).await.unwrap();
        loop {
            match tokio::time::timeout(WAIT, w.next()).await {
                Ok(Some(Ok(WatchEvent::Progress { revision }))) if revision >= r => break,
                Ok(Some(Ok(WatchEvent::Progress { .. }))) => continue,
                other => panic!("expected progress past {r}, got {other:?}"),
            }
        }
    }

    pub async fn compaction(f: &Fixture) {
        let s = f.s();
        let mut revs = vec![s.create("k/1", v("0")).await.unwrap()];
        for i in 1..6 {
            revs.push(
                s.update("k/1", v(&i.to_string()), revs[i - 1])
                    .await
                    .unwrap(),
            );
        }
        s.compact(revs[3]).await.unwrap();
        // Compacting again (or lower) is a no-op.
        s.compact(revs[3]).await.unwrap();
        s.compact(revs[1]).await.unwrap();

        match s
            .list(&ListOptions {
                prefix: "k/".into(),
                revision: Some(revs[2]),
                ..Default::default()
            })
            .await
        {
            Err(StoreError::Compacted {
                requested,
                compacted,
            }) => {
                assert_eq!(requested, revs[2]);
                assert!(compacted > revs[2]);
            }
            other => panic!("list below the compaction point: {other:?}"),
        }
        let at = list(s, "k/", Some(revs[3])).await.unwrap();
        assert_eq!((at[0].value.clone(), at[0].mod_revision), (v("3"), revs[3]));
        assert_eq!(list(s, "k/", None).await.unwrap()[0].value, v("5"));

        expect_watch_compacted(s, "k/", revs[1]).await;
        let mut w = s.watch("k/", revs[3]).await.unwrap();
        for want in [4, 5] {
            match next_change(&mut w).await {
                WatchEvent::Put { kv, .. } => assert_eq!(
                    (kv.mod_revision, kv.value),
                    (revs[want], v(&want.to_string()))
                ),
                e => panic!("unexpected {e:?}"),
            }
        }
        let current = s.current_revision().await.unwrap();
        assert!(matches!(
            s.compact(current + 1_000).await,
            Err(StoreError::FutureRevision { .. })
        ));
        // The data itself survives compaction.
        let by_key: BTreeMap<_, _> = list(s, "", None)
            .await
            .unwrap()
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect();
        assert_eq!(by_key.get("k/1"), Some(&v("5")));
    }
}

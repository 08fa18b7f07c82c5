//! Behaviour specific to the embedded store: persistence across reopen,
//! automatic compaction, watches that cannot be served gap-free, and recovery
//! from a full disk.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::time::Duration;

use cozyplane_store::{
    EmbeddedOptions, EmbeddedStore, ListOptions, Storage, StoreError, WatchEvent,
};
use futures::StreamExt;

const WAIT: Duration = Duration::from_secs(15);

fn opts() -> EmbeddedOptions {
    EmbeddedOptions {
        progress_interval: Duration::from_millis(100),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_log_and_revisions_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = EmbeddedStore::open_with(&path, opts()).unwrap();
    let r1 = store.create("a/1", b"one".to_vec()).await.unwrap();
    let r2 = store.update("a/1", b"two".to_vec(), r1).await.unwrap();
    let r3 = store.create("a/2", b"x".to_vec()).await.unwrap();
    store.delete("a/2", Some(r3)).await.unwrap();
    store.compact(r1).await.unwrap();
    store.close().unwrap();

    let store = EmbeddedStore::open_with(&path, opts()).unwrap();
    assert_eq!(store.current_revision().await.unwrap(), 4);
    assert_eq!(store.compacted_revision(), r1);
    let kv = store.get("a/1").await.unwrap().unwrap();
    assert_eq!(
        (kv.value, kv.create_revision, kv.mod_revision),
        (b"two".to_vec(), r1, r2)
    );
    // The log survived too: an old read and a watch resume still work.
    let old = store
        .list(&ListOptions {
            prefix: "a/".into(),
            revision: Some(r3),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(old.items.len(), 2);
    let mut w = store.watch("a/", r2).await.unwrap();
    let mut got = vec![];
    while got.len() < 2 {
        match tokio::time::timeout(WAIT, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Progress { .. } => {}
            e => got.push(e.revision()),
        }
    }
    assert_eq!(got, [3, 4]);
    // Writes continue from the persisted revision.
    assert_eq!(store.create("a/3", vec![]).await.unwrap(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_compaction_keeps_bounded_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open_with(
        dir.path().join("s.redb"),
        EmbeddedOptions {
            history: 10,
            ..opts()
        },
    )
    .unwrap();
    let mut rev = store.create("k", b"0".to_vec()).await.unwrap();
    for i in 1..50 {
        rev = store
            .update("k", i.to_string().into_bytes(), rev)
            .await
            .unwrap();
    }
    assert_eq!(rev, 50);
    assert_eq!(
        store.compacted_revision(),
        40,
        "history of 10 revisions is kept"
    );
    let at = |r| ListOptions {
        prefix: "k".into(),
        revision: Some(r),
        ..Default::default()
    };
    assert_eq!(
        store.list(&at(40)).await.unwrap().items[0].value,
        b"39".to_vec()
    );
    assert!(matches!(
        store.list(&at(39)).await,
        Err(StoreError::Compacted {
            requested: 39,
            compacted: 40
        })
    ));
    assert!(matches!(
        store.watch("k", 39).await,
        Err(StoreError::Compacted { .. })
    ));
    assert!(store.watch("k", 40).await.is_ok());
}

/// A consumer so slow that the history it still needs is compacted away
/// gets `Compacted` and the end of the stream, never a silent gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_watch_past_compaction_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let options = EmbeddedOptions {
        history: 5,
        watch_lag: 2,
        watch_buffer: 1,
        ..opts()
    };
    let store = EmbeddedStore::open_with(dir.path().join("s.redb"), options).unwrap();
    let mut w = store.watch("", 0).await.unwrap();
    for i in 0..200 {
        store.create(&format!("k{i:03}"), vec![]).await.unwrap();
    }
    let mut last = 0;
    let mut ended_with = None;
    while let Ok(Some(item)) = tokio::time::timeout(WAIT, w.next()).await {
        match item {
            Ok(WatchEvent::Progress { .. }) => {}
            Ok(e) => {
                assert_eq!(e.revision(), last + 1, "a gap in the delivered events");
                last = e.revision();
            }
            Err(e) => {
                ended_with = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(ended_with, Some(StoreError::Compacted { .. })),
        "got {ended_with:?} after {last}"
    );
    assert!(last < 200);
    assert!(
        tokio::time::timeout(WAIT, w.next())
            .await
            .unwrap()
            .is_none(),
        "the stream must end after the error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_end_when_the_store_closes() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open_with(dir.path().join("s.redb"), opts()).unwrap();
    let mut w = store.watch("", 0).await.unwrap();
    store.create("k", vec![]).await.unwrap();
    store.close().unwrap();
    let mut items = vec![];
    while let Some(item) = tokio::time::timeout(WAIT, w.next()).await.unwrap() {
        items.push(item.unwrap());
    }
    assert!(items
        .iter()
        .any(|e| matches!(e, WatchEvent::Put { kv, .. } if kv.key == "k")));
}

#[tokio::test]
async fn a_file_that_is_not_a_store_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-store");
    std::fs::write(&path, b"hello, I am a text file, not a database").unwrap();
    match EmbeddedStore::open(&path) {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("cannot open"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a text file opened as a store"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"hello, I am a text file, not a database"
    );
}

#[tokio::test]
async fn two_stores_cannot_share_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let _first = EmbeddedStore::open(&path).unwrap();
    assert!(matches!(
        EmbeddedStore::open(&path),
        Err(StoreError::Backend(_))
    ));
}

#[tokio::test]
async fn oversized_writes_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = EmbeddedOptions {
        max_value_bytes: 1024,
        ..opts()
    };
    let store = EmbeddedStore::open_with(dir.path().join("s.redb"), options).unwrap();
    let rev = store.create("k", vec![1; 100]).await.unwrap();
    match store.create("big", vec![0; 2048]).await {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("exceeds the limit"), "{msg}"),
        other => panic!("oversized create: {other:?}"),
    }
    assert!(matches!(
        store.update("k", vec![0; 2048], rev).await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(store.get("big").await.unwrap(), None);
    assert_eq!(store.get("k").await.unwrap().unwrap().value, vec![1; 100]);
    assert_eq!(store.current_revision().await.unwrap(), rev);
}

/// A full disk: writes fail at once with a typed error and the store is not
/// ready; once space is freed it reopens its file by itself, is ready and
/// takes writes again, and a watch opened before the fault sees every
/// acknowledged write in order, nothing else (the API-level test with
/// `/readyz` is the API server's tests/storage_faults.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_reported_and_recovered_in_place() {
    use std::io::Write;
    const MOUNT: cozyplane_testkit::Tool =
        cozyplane_testkit::Tool::new("mount", &["--version"], "mount");
    if !cozyplane_testkit::needs!().root().tools(&[MOUNT]).ready() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let _tmpfs = cozyplane_testkit::Tmpfs::mount(&data, "16m");
    let options = EmbeddedOptions {
        recovery_free_bytes: 4 << 20,
        ..opts()
    };
    let store = EmbeddedStore::open_with(data.join("s.redb"), options).unwrap();
    store.ready().await.unwrap();
    let mut watch = store.watch("k/", 0).await.unwrap();
    let value = vec![b'v'; 256 << 10];
    let mut acked = vec![store.create("k/first", value.clone()).await.unwrap()];

    let filler = data.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    while f.write_all(&[0x5a; 64 << 10]).is_ok() {}
    drop(f);
    let mut refused = None;
    for i in 0..200 {
        match store.create(&format!("k/{i}"), value.clone()).await {
            Ok(rev) => acked.push(rev),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("a full disk refuses a write");
    assert!(
        refused.to_string().contains("No space left on device"),
        "{refused}"
    );
    match store.ready().await {
        Err(StoreError::Unavailable(fault)) => {
            assert_eq!(fault.backend, "embedded store", "{fault}")
        }
        other => panic!("ready on a full disk: {other:?}"),
    }
    match store.create("k/while-full", value.clone()).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a write while recovering: {other:?}"),
    }

    std::fs::remove_file(&filler).unwrap();
    cozyplane_testkit::eventually_async(
        "the store to be ready after space was freed",
        Duration::from_secs(5),
        || async { store.ready().await.is_ok() },
    )
    .await;
    acked.push(store.create("k/after", value.clone()).await.unwrap());
    assert_eq!(store.get("k/first").await.unwrap().unwrap().value, value);
    // the watch saw exactly the acknowledged writes, in order, no gap
    for rev in &acked {
        let event = loop {
            match tokio::time::timeout(WAIT, watch.next()).await {
                Ok(Some(Ok(WatchEvent::Progress { .. }))) => continue,
                Ok(Some(Ok(event))) => break event,
                other => panic!("watch across the fault: {other:?}"),
            }
        };
        assert_eq!(event.revision(), *rev, "{event:?}");
    }
    assert_eq!(
        store.current_revision().await.unwrap(),
        *acked.last().unwrap()
    );
    store.close().unwrap();
}

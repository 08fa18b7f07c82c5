//! Behaviour specific to the etcd backend: prefixes, large responses and an
//! unreachable server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use cozyplane_store::etcd::ConnectError;
use cozyplane_store::testing::{shared_etcd, unique_prefix};
use cozyplane_store::{EtcdOptions, EtcdStore, ListOptions, Storage};
use cozyplane_testkit::needs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_with_different_prefixes_do_not_see_each_other() {
    let Some(endpoint) = needs!().ready_with(shared_etcd()) else {
        return;
    };
    let base = unique_prefix("prefixes");
    // "/…/x" is a string prefix of "/…/x2": the store prefix must still isolate.
    // (unique_prefix ends in '/', so the two prefixes below do not.)
    let x = EtcdStore::connect(&[&endpoint], &format!("{base}x"))
        .await
        .unwrap();
    let x2 = EtcdStore::connect(&[&endpoint], &format!("{base}x2"))
        .await
        .unwrap();
    x.create("k", b"x".to_vec()).await.unwrap();
    x2.create("k", b"x2".to_vec()).await.unwrap();
    let all = x.list(&ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 1);
    assert_eq!(
        (all.items[0].key.as_str(), all.items[0].value.as_slice()),
        ("k", &b"x"[..])
    );
    assert_eq!(x.count("").await.unwrap(), 1);
    assert_eq!(x2.get("k").await.unwrap().unwrap().value, b"x2".to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_larger_than_the_grpc_default_limit_work() {
    let Some(endpoint) = needs!().ready_with(shared_etcd()) else {
        return;
    };
    let store = EtcdStore::connect(&[endpoint], &unique_prefix("large"))
        .await
        .unwrap();
    // 6 x 1 MiB: one response of 6 MiB, over the client's 4 MiB default.
    for i in 0..6 {
        store
            .create(&format!("big/{i}"), vec![b'a' + i as u8; 1 << 20])
            .await
            .unwrap();
    }
    let all = store
        .list(&ListOptions {
            prefix: "big/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.items.len(), 6);
    assert!(all
        .items
        .iter()
        .enumerate()
        .all(|(i, kv)| kv.value.len() == 1 << 20 && kv.value[0] == b'a' + i as u8));
}

#[tokio::test]
async fn an_unreachable_etcd_is_a_clear_error() {
    // A port nobody listens on: bind, learn the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = EtcdOptions {
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let start = Instant::now();
    match EtcdStore::connect_with(&[format!("http://127.0.0.1:{port}")], "/p/", opts).await {
        Err(e @ ConnectError::Unreachable { .. }) => {
            assert!(e.to_string().starts_with("etcd:"), "{e}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("connected to nothing"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "connect must give up"
    );
    let none: [&str; 0] = [];
    assert!(matches!(
        EtcdStore::connect(&none, "/p/").await,
        Err(ConnectError::NoEndpoint)
    ));
}

/// The per-request timeout must not cut long-lived watch streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_outlive_the_request_timeout() {
    use cozyplane_store::WatchEvent;
    use futures::StreamExt;

    let Some(endpoint) = needs!().ready_with(shared_etcd()) else {
        return;
    };
    let opts = EtcdOptions {
        request_timeout: Duration::from_secs(1),
        progress_interval: Duration::from_millis(300),
        ..Default::default()
    };
    let store = EtcdStore::connect_with(&[endpoint], &unique_prefix("timeout"), opts)
        .await
        .unwrap();
    let now = store.current_revision().await.unwrap();
    let mut w = store.watch("", now).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let rev = store.create("k", b"v".to_vec()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Ok(WatchEvent::Put { kv, .. }))) => {
                assert_eq!(kv.mod_revision, rev);
                break;
            }
            Ok(Some(Ok(WatchEvent::Progress { .. }))) => continue,
            other => panic!("watch broke after the request timeout: {other:?}"),
        }
    }
}

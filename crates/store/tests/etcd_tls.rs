//! The etcd backend over TLS with client certificates, against an etcd
//! started with `--client-cert-auth` (the store's `testing` fixture, with
//! certificates from a test CA).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use cozyplane_store::etcd::{ClientIdentity, ConnectError, EtcdTls, PemKind};
use cozyplane_store::testing::{shared_tls_etcd, unique_prefix, ClientTlsFiles, TestCa};
use cozyplane_store::{EtcdOptions, EtcdStore, ListOptions, Storage, WatchEvent};
use cozyplane_testkit::needs;
use futures::StreamExt;

const CONNECT: Duration = Duration::from_millis(1500);
const REQUEST: Duration = Duration::from_secs(2);

fn opts(tls: Option<EtcdTls>) -> EtcdOptions {
    EtcdOptions {
        connect_timeout: CONNECT,
        request_timeout: REQUEST,
        tls,
        ..Default::default()
    }
}

fn tls_from(files: &ClientTlsFiles) -> EtcdTls {
    EtcdTls::from_files(Some(&files.ca), Some(&files.cert), Some(&files.key))
        .unwrap()
        .expect("files given")
}

/// Connect with `tls`; the failure must be a TLS error, reported well
/// within the connect bound (no hang). Returns its message.
async fn refused(endpoint: &str, tls: EtcdTls) -> String {
    let start = Instant::now();
    let result = EtcdStore::connect_with(&[endpoint], &unique_prefix("tls"), opts(Some(tls))).await;
    let elapsed = start.elapsed();
    let err = match result {
        Err(e @ ConnectError::Tls { .. }) => e.to_string(),
        Err(other) => panic!("expected a TLS error, got {other:?}"),
        Ok(_) => panic!("etcd accepted a client it must refuse"),
    };
    assert!(elapsed <= CONNECT + REQUEST, "took {elapsed:?}: {err}");
    eprintln!("refused after {elapsed:?}: {err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_of_the_trusted_ca_connects_and_round_trips() {
    let Some((endpoint, files)) = needs!().ready_with(shared_tls_etcd()) else {
        return;
    };
    let store = EtcdStore::connect_with(
        &[&endpoint],
        &unique_prefix("tls"),
        opts(Some(tls_from(&files))),
    )
    .await
    .unwrap();
    let now = store.current_revision().await.unwrap();
    let mut watch = store.watch("", now).await.unwrap();
    let created = store.create("a", b"1".to_vec()).await.unwrap();
    let updated = store.update("a", b"2".to_vec(), created).await.unwrap();
    let got = store.get("a").await.unwrap().unwrap();
    assert_eq!(
        (got.value.as_slice(), got.mod_revision),
        (&b"2"[..], updated)
    );
    let all = store.list(&ListOptions::default()).await.unwrap();
    assert_eq!(all.items, vec![got]);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
            Ok(Some(Ok(WatchEvent::Put { kv, .. }))) => seen.push(kv.mod_revision),
            Ok(Some(Ok(WatchEvent::Progress { .. }))) => {}
            other => panic!("watch over TLS broke: {other:?}"),
        }
    }
    assert_eq!(seen, [created, updated]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_client_without_a_certificate() {
    let Some((endpoint, files)) = needs!().ready_with(shared_tls_etcd()) else {
        return;
    };
    let tls = EtcdTls::from_files(Some(&files.ca), None, None)
        .unwrap()
        .unwrap();
    let msg = refused(&endpoint, tls).await;
    assert!(msg.contains("none was given"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_client_certificate_of_another_ca() {
    let Some((endpoint, files)) = needs!().ready_with(shared_tls_etcd()) else {
        return;
    };
    let intruder = TestCa::new("another-ca").unwrap().issue("client").unwrap();
    let tls = EtcdTls {
        client: Some(ClientIdentity {
            cert_pem: intruder.cert_pem.into_bytes(),
            key_pem: intruder.key_pem.into_bytes(),
        }),
        ..tls_from(&files)
    };
    let msg = refused(&endpoint, tls).await;
    assert!(msg.contains("refuses the client certificate"), "{msg}");
}

/// With no CA file an https endpoint is checked against the system's roots
/// only, which do not hold the test CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_ca_file_only_the_system_roots_are_trusted() {
    let Some((endpoint, files)) = needs!().ready_with(shared_tls_etcd()) else {
        return;
    };
    let no_ca = EtcdTls {
        ca_pem: None,
        ..tls_from(&files)
    };
    let msg = refused(&endpoint, no_ca).await;
    assert!(
        msg.contains("not trusted") && msg.contains("system's roots"),
        "{msg}"
    );
    // A server certificate of a CA other than the one given: also refused.
    let other_ca = TestCa::new("another-ca").unwrap();
    let wrong_ca = EtcdTls {
        ca_pem: Some(other_ca.cert_pem().as_bytes().to_vec()),
        ..tls_from(&files)
    };
    let msg = refused(&endpoint, wrong_ca).await;
    assert!(msg.contains("not trusted"), "{msg}");
}

#[tokio::test]
async fn tls_settings_are_checked_before_dialing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let cert = ca.issue("client").unwrap();
    let write = |name: &str, data: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let (ca_file, cert_file, key_file) = (
        write("ca.crt", ca.cert_pem()),
        write("c.crt", &cert.cert_pem),
        write("c.key", &cert.key_pem),
    );
    assert!(EtcdTls::from_files(None, None, None).unwrap().is_none());
    assert!(matches!(
        EtcdTls::from_files(Some(&ca_file), Some(&cert_file), None),
        Err(ConnectError::IncompleteIdentity)
    ));
    assert!(matches!(
        EtcdTls::from_files(None, None, Some(&key_file)),
        Err(ConnectError::IncompleteIdentity)
    ));
    // Files holding the wrong thing, or none.
    assert!(matches!(
        EtcdTls::from_files(Some(&key_file), None, None),
        Err(ConnectError::BadPem {
            kind: PemKind::Certificate,
            ..
        })
    ));
    assert!(matches!(
        EtcdTls::from_files(None, Some(&cert_file), Some(&cert_file)),
        Err(ConnectError::BadPem {
            kind: PemKind::PrivateKey,
            ..
        })
    ));
    assert!(matches!(
        EtcdTls::from_files(Some(&dir.path().join("missing")), None, None),
        Err(ConnectError::ReadFile { .. })
    ));
    // TLS settings with a plain endpoint, or http:// and https:// mixed.
    let tls = EtcdTls::from_files(Some(&ca_file), Some(&cert_file), Some(&key_file))
        .unwrap()
        .unwrap();
    match EtcdStore::connect_with(&["http://127.0.0.1:1"], "/p/", opts(Some(tls))).await {
        Err(ConnectError::PlainEndpoint { endpoint }) => assert_eq!(endpoint, "http://127.0.0.1:1"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    match EtcdStore::connect_with(
        &["https://127.0.0.1:1", "http://127.0.0.1:2"],
        "/p/",
        opts(None),
    )
    .await
    {
        Err(ConnectError::PlainEndpoint { endpoint }) => assert_eq!(endpoint, "http://127.0.0.1:2"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A peer that accepts TCP but never answers the TLS hello: connecting
/// gives up within the connect bound.
#[tokio::test]
async fn a_silent_tls_endpoint_is_given_up_on() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            held.push(sock);
        }
    });
    let ca = TestCa::new("ca").unwrap();
    let tls = EtcdTls {
        ca_pem: Some(ca.cert_pem().as_bytes().to_vec()),
        client: None,
    };
    let start = Instant::now();
    let result =
        EtcdStore::connect_with(&[format!("https://{addr}")], "/p/", opts(Some(tls))).await;
    let elapsed = start.elapsed();
    match result {
        Err(ConnectError::Timeout { .. } | ConnectError::Unreachable { .. }) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(
        elapsed <= CONNECT + REQUEST + Duration::from_millis(500),
        "{elapsed:?}"
    );
    hold.abort();
}

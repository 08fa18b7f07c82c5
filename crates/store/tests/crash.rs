//! Crash tests: kill -9 in the middle of a stream of writes, restart, and
//! check that every acknowledged write is there.
//!
//! * embedded: the writer is a child process (`store-crash-writer`) that
//!   prints each write after its acknowledgement; the test kills the child
//!   and reopens the file, three times over on the same file.
//! * etcd: the writers run here and the etcd *server* is killed; it is
//!   restarted on the same data dir and the acknowledged writes are read back.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cozyplane_store::testing::EtcdServer;
use cozyplane_store::{EmbeddedStore, EtcdOptions, EtcdStore, ListOptions, Storage, StoreError};
use cozyplane_testkit::{eventually_async, needs};

/// What the writers acknowledged: key -> the last acknowledged value.
type Acked = BTreeMap<String, Vec<u8>>;

/// Record one acknowledgement line of the crash writer.
fn record(acked: &mut Acked, line: &str) {
    let (kind, key) = line.split_once(' ').unwrap_or(("", line));
    let n = key.rsplit('/').next().unwrap_or("").trim_start_matches('0');
    let n = if n.is_empty() { "0" } else { n };
    match kind {
        "C" => {
            acked
                .entry(key.to_owned())
                .or_insert_with(|| format!("v{n}").into_bytes());
        }
        "U" => {
            acked.insert(key.to_owned(), format!("u{n}").into_bytes());
        }
        other => panic!("unexpected writer output {other:?} in {line:?}"),
    }
}

async fn assert_all_present(store: &dyn Storage, acked: &Acked) {
    let all = store.list(&ListOptions::default()).await.unwrap();
    let stored: BTreeMap<_, _> = all.items.into_iter().map(|kv| (kv.key, kv.value)).collect();
    for (key, value) in acked {
        let Some(found) = stored.get(key) else {
            panic!("acknowledged key {key} lost")
        };
        // An update may have been applied without its ack reaching us; a
        // create ack only promises the create or anything after it.
        let ok = found == value
            || (value.starts_with(b"v") && found.starts_with(b"u") && found[1..] == value[1..]);
        assert!(
            ok,
            "{key}: acknowledged {:?}, found {:?}",
            String::from_utf8_lossy(value),
            String::from_utf8_lossy(found)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_kill_9_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let mut acked = Acked::new();
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-writer"))
            .arg(&path)
            .arg(format!("r{round}"))
            .arg("8")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        let before = acked.len();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        // Kill after a few hundred acknowledgements, mid-stream.
        while seen < 300 + round * 100 {
            let line = lines.next().expect("writer stopped early").unwrap();
            record(&mut acked, &line);
            seen += 1;
            assert!(Instant::now() < deadline, "writer too slow");
        }
        child.kill().unwrap(); // SIGKILL
                               // Lines already printed were acknowledged before the kill.
        for line in lines {
            let Ok(line) = line else { break };
            record(&mut acked, &line);
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "the writer must have been killed");
        assert!(acked.len() > before, "round {round} acknowledged nothing");

        let store = EmbeddedStore::open(&path).unwrap();
        assert_all_present(&store, &acked).await;
        store.close().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_server_kill_9_loses_no_acknowledged_write() {
    let Some(mut server) = needs!().ready_with(EtcdServer::start()) else {
        return;
    };
    let opts = EtcdOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let store = Arc::new(
        EtcdStore::connect_with(&[server.endpoint()], "/crash/", opts.clone())
            .await
            .unwrap(),
    );
    let acked = Arc::new(Mutex::new(Acked::new()));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, acked) = (store.clone(), acked.clone());
            tokio::spawn(async move {
                for n in 0u64.. {
                    let key = format!("w/{w}/{n:08}");
                    let Ok(rev) = store.create(&key, format!("v{n}").into_bytes()).await else {
                        return;
                    };
                    record(&mut acked.lock().unwrap(), &format!("C {key}"));
                    if store
                        .update(&key, format!("u{n}").into_bytes(), rev)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    record(&mut acked.lock().unwrap(), &format!("U {key}"));
                }
            })
        })
        .collect();
    eventually_async(
        "300 writes acknowledged by etcd",
        Duration::from_secs(60),
        || {
            let n = acked.lock().unwrap().len();
            async move { n >= 300 }
        },
    )
    .await;
    let kill_started = acked.lock().unwrap().len();
    tokio::task::block_in_place(|| server.kill()).unwrap();
    for w in writers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("writers stop once etcd is gone")
            .unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= kill_started);
    match store.get("w/0/00000000").await {
        Err(StoreError::Backend(_)) => {}
        other => panic!("etcd is dead, yet a read answered {other:?}"),
    }

    tokio::task::block_in_place(|| server.restart()).unwrap();
    let store = EtcdStore::connect_with(&[server.endpoint()], "/crash/", opts)
        .await
        .unwrap();
    assert_all_present(&store, &acked).await;
}

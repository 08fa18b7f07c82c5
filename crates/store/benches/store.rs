//! Storage benchmark: `cargo bench -p cozyplane-store --bench store`.
//!
//! For each backend (the embedded store in a temp dir on disk — set
//! `BENCH_DIR` to choose the filesystem — and a fresh etcd from
//! `/usr/bin/etcd`, or `COZYPLANE_TEST_ETCD`) it measures:
//!
//! * creates/s, one writer awaiting each create (every create durable);
//! * creates/s with 16 concurrent writers (group commit for the embedded store);
//! * a full list of 10k keys (~1 KiB values), p50/p99 over repetitions,
//!   in one read and in pages of 500 (kubectl's chunk size);
//! * watch fan-out: 100 watchers, time until all saw 1,000 new writes.
//!
//! Sizes scale with `BENCH_SCALE` (default 1.0). Prints a markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_store::testing::bench::{time_list, Summary};
use cozyplane_store::testing::{shared_etcd, unique_prefix};
use cozyplane_store::{EmbeddedStore, EtcdStore, ListOptions, Storage, WatchEvent};
use cozyplane_testkit::Needs;
use futures::StreamExt;

struct Row {
    backend: &'static str,
    metric: String,
    value: String,
}

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * scale) as usize).max(1)
}

fn value(i: usize) -> Vec<u8> {
    // ~1 KiB, roughly one small API object in JSON.
    let mut v = format!("{{\"metadata\":{{\"name\":\"obj-{i}\"}},\"spec\":\"").into_bytes();
    v.resize(1000, b'x');
    v.extend_from_slice(b"\"}");
    v
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn summary(s: Option<Summary>) -> String {
    match s {
        Some(s) => format!("p50 {} / p99 {} (n={})", ms(s.p50), ms(s.p99), s.samples),
        None => "no samples".into(),
    }
}

async fn creates_sequential(store: &dyn Storage, n: usize) -> f64 {
    let start = Instant::now();
    for i in 0..n {
        if let Err(e) = store.create(&format!("seq/{i:08}"), value(i)).await {
            panic!("create failed: {e}");
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn creates_concurrent(store: Arc<dyn Storage>, writers: usize, n: usize) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..n / writers {
                    if let Err(e) = store.create(&format!("conc/{w:02}/{i:08}"), value(i)).await {
                        panic!("create failed: {e}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            panic!("writer task failed: {e}");
        }
    }
    (n / writers * writers) as f64 / start.elapsed().as_secs_f64()
}

async fn fill(store: Arc<dyn Storage>, n: usize) {
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..n).step_by(16) {
                    if let Err(e) = store.create(&format!("list/{i:08}"), value(i)).await {
                        panic!("fill failed: {e}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            panic!("fill task failed: {e}");
        }
    }
}

async fn watch_fanout(store: Arc<dyn Storage>, watchers: usize, writes: usize) -> Duration {
    let now = match store.current_revision().await {
        Ok(r) => r,
        Err(e) => panic!("current_revision: {e}"),
    };
    let mut receivers = vec![];
    for _ in 0..watchers {
        let mut w = match store.watch("fan/", now).await {
            Ok(w) => w,
            Err(e) => panic!("watch: {e}"),
        };
        receivers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < writes {
                match w.next().await {
                    Some(Ok(WatchEvent::Put { .. })) => got += 1,
                    Some(Ok(_)) => {}
                    other => panic!("watch ended early: {other:?}"),
                }
            }
        }));
    }
    let start = Instant::now();
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..writes).step_by(16) {
                    if let Err(e) = store.create(&format!("fan/{i:08}"), value(i)).await {
                        panic!("create failed: {e}");
                    }
                }
            })
        })
        .collect();
    for t in writers.into_iter().chain(receivers) {
        if let Err(e) = t.await {
            panic!("fan-out task failed: {e}");
        }
    }
    start.elapsed()
}

async fn run(backend: &'static str, store: Arc<dyn Storage>, rows: &mut Vec<Row>) {
    let mut row = |metric: String, value: String| {
        eprintln!("{backend}: {metric}: {value}");
        rows.push(Row {
            backend,
            metric,
            value,
        });
    };
    let n = scaled(if backend == "etcd" { 1000 } else { 2000 });
    let rate = creates_sequential(store.as_ref(), n).await;
    row(
        format!("creates/s, 1 writer ({n} creates)"),
        format!("{rate:.0}"),
    );
    let n = scaled(10_000);
    let rate = creates_concurrent(store.clone(), 16, n).await;
    row(
        format!("creates/s, 16 writers ({n} creates)"),
        format!("{rate:.0}"),
    );

    let keys = scaled(10_000);
    fill(store.clone(), keys).await;
    let reps = scaled(50);
    let all = ListOptions {
        prefix: "list/".into(),
        ..Default::default()
    };
    match time_list(store.as_ref(), &all, reps).await {
        Ok((s, items)) => row(format!("list {items} keys, one read"), summary(s)),
        Err(e) => panic!("list: {e}"),
    }
    let paged = ListOptions {
        limit: Some(500),
        ..all.clone()
    };
    match time_list(store.as_ref(), &paged, reps).await {
        Ok((s, items)) => row(format!("list {items} keys, pages of 500"), summary(s)),
        Err(e) => panic!("list: {e}"),
    }
    let writes = scaled(1000);
    let took = watch_fanout(store.clone(), 100, writes).await;
    let delivered = (100 * writes) as f64 / took.as_secs_f64();
    row(
        format!("watch fan-out: 100 watchers x {writes} writes"),
        format!("{} total, {delivered:.0} events/s delivered", ms(took)),
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let mut rows = vec![];

    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = match tempfile::tempdir_in(&base) {
        Ok(d) => d,
        Err(e) => panic!("cannot create a temp dir in {}: {e}", base.display()),
    };
    let embedded: Arc<dyn Storage> = match EmbeddedStore::open(dir.path().join("bench.redb")) {
        Ok(s) => Arc::new(s),
        Err(e) => panic!("open embedded store: {e}"),
    };
    run("embedded", embedded, &mut rows).await;

    if let Some(endpoint) = Needs::new("store bench (etcd)").ready_with(shared_etcd()) {
        match EtcdStore::connect(&[endpoint], &unique_prefix("bench")).await {
            Ok(s) => run("etcd", Arc::new(s), &mut rows).await,
            Err(e) => panic!("connect to etcd: {e}"),
        }
    }

    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} |", r.backend, r.metric, r.value);
    }
}

//! API server benchmark (not a test): create throughput over HTTP, list of
//! 10k objects (p50/p99) and watch fan-out to 100 watchers, each beside the
//! raw backend doing the same work in the same run.
//!
//! `cargo bench -p cozyplane-apiserver --bench apiserver` (embedded store;
//! add etcd with `COZYPLANE_BENCH_ETCD=1`, which uses the store crate's
//! throw-away etcd or `$COZYPLANE_TEST_ETCD`). Sizes: `COZYPLANE_BENCH_N`
//! (default 10000 objects).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_store::{ListOptions, Storage};
use futures::StreamExt;
use support::{vpc, vpcs, Backend, Harness};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

async fn creates_via_http(h: &Harness, ns: &str, n: usize, concurrency: usize) -> f64 {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = h.client.clone();
        let next = next.clone();
        let ns = ns.to_string();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let body = vpc(&format!("o{i:06}"), "10.70.0.0/16")
                    .to_string()
                    .into_bytes();
                let Ok(req) = http::Request::post(vpcs(&ns))
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body))
                else {
                    return;
                };
                match client.send(req).await {
                    Ok(r) if r.status().as_u16() == 201 => {}
                    Ok(r) => panic!("create: HTTP {}", r.status()),
                    Err(e) => panic!("create: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn raw_creates(store: &Arc<dyn Storage>, n: usize, concurrency: usize) -> f64 {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let store = store.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let v = vpc(&format!("r{i:06}"), "10.70.0.0/16")
                    .to_string()
                    .into_bytes();
                if let Err(e) = store.create(&format!("/bench-raw/{i:06}"), v).await {
                    panic!("raw create: {e}");
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn list_latencies(h: &Harness, ns: &str, iters: usize, expect: usize) -> Vec<Duration> {
    let r = h.get(&vpcs(ns)).await;
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(expect));
    let mut out = Vec::new();
    for _ in 0..iters {
        // request to last body byte; the client does not parse the JSON,
        // as the raw scan does not decode values either
        let t = Instant::now();
        let (status, _body) = h.get_raw(&vpcs(ns)).await;
        out.push(t.elapsed());
        assert_eq!(status, 200);
    }
    out.sort();
    out
}

async fn raw_list_latencies(
    store: &Arc<dyn Storage>,
    prefix: &str,
    iters: usize,
    expect: usize,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let r = store
            .list(&ListOptions {
                prefix: prefix.to_string(),
                ..Default::default()
            })
            .await;
        out.push(t.elapsed());
        assert_eq!(r.map(|r| r.items.len()).ok(), Some(expect));
    }
    out.sort();
    out
}

/// 100 watchers; `events` creates; time until every watcher saw all.
async fn fan_out_http(h: &Harness, ns: &str, watchers: usize, events: usize) -> Duration {
    let mut readers = Vec::new();
    for _ in 0..watchers {
        readers.push(
            h.stream(&format!(
                "{}?watch=true&resourceVersion={}",
                vpcs(ns),
                h.store.current_revision().await.unwrap_or(0)
            ))
            .await,
        );
    }
    let start = Instant::now();
    let waiters: Vec<_> = readers
        .into_iter()
        .map(|mut r| {
            tokio::spawn(async move {
                for _ in 0..events {
                    if r.next_change(Duration::from_secs(60)).await.is_none() {
                        panic!("watcher starved");
                    }
                }
            })
        })
        .collect();
    creates_via_http(h, ns, events, 8).await;
    for w in waiters {
        let _ = w.await;
    }
    start.elapsed()
}

async fn fan_out_raw(store: &Arc<dyn Storage>, watchers: usize, events: usize) -> Duration {
    let from = store.current_revision().await.unwrap_or(0);
    let mut waiters = Vec::new();
    for _ in 0..watchers {
        let mut s = match store.watch("/bench-fan/", from).await {
            Ok(s) => s,
            Err(e) => panic!("watch: {e}"),
        };
        waiters.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < events {
                match s.next().await {
                    Some(Ok(cozyplane_store::WatchEvent::Put { .. })) => seen += 1,
                    Some(Ok(_)) => {}
                    other => panic!("raw watch ended: {other:?}"),
                }
            }
        }));
    }
    let start = Instant::now();
    for i in 0..events {
        let v = vpc(&format!("f{i}"), "10.0.0.0/8").to_string().into_bytes();
        if let Err(e) = store.create(&format!("/bench-fan/{i:06}"), v).await {
            panic!("create: {e}");
        }
    }
    for w in waiters {
        let _ = w.await;
    }
    start.elapsed()
}

async fn run(backend: Backend, n: usize) {
    let Some(h) = support::start(backend, "bench").await else {
        return;
    };
    let name = format!("{backend:?}");
    let http_cps = creates_via_http(&h, "bench", n, 32).await;
    let raw_cps = raw_creates(&h.store, n, 32).await;
    println!("| {name} | create {n} objects, 32 concurrent | {http_cps:.0} creates/s via HTTP | {raw_cps:.0} creates/s raw backend |");

    let api = list_latencies(&h, "bench", 30, n).await;
    let prefix = "/sdn.cozystack.io/vpcs/bench/";
    let raw = raw_list_latencies(&h.store, prefix, 30, n).await;
    println!(
        "| {name} | list {n} VPCs (30 runs) | p50 {} / p99 {} via HTTP | p50 {} / p99 {} raw scan | ratio p50 {:.2}x |",
        ms(pct(&api, 0.5)), ms(pct(&api, 0.99)), ms(pct(&raw, 0.5)), ms(pct(&raw, 0.99)),
        pct(&api, 0.5).as_secs_f64() / pct(&raw, 0.5).as_secs_f64().max(1e-9)
    );

    let events = 200;
    let http_fan = fan_out_http(&h, "fan", 100, events).await;
    let raw_fan = fan_out_raw(&h.store, 100, events).await;
    println!(
        "| {name} | watch fan-out: {events} creates to 100 watchers | all delivered in {} ({:.0} events/s delivered) via HTTP | {} ({:.0} events/s) raw watch |",
        ms(http_fan), (events * 100) as f64 / http_fan.as_secs_f64(), ms(raw_fan), (events * 100) as f64 / raw_fan.as_secs_f64()
    );
    h.server.shutdown().await;
}

fn main() {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    let n = std::env::var("COZYPLANE_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    println!("| backend | what | API server | raw backend | |");
    println!("|---|---|---|---|---|");
    rt.block_on(run(Backend::Embedded, n));
    if std::env::var("COZYPLANE_BENCH_ETCD").is_ok() {
        rt.block_on(run(Backend::Etcd, n));
    }
}

//! EndpointSlice change → datapath latency on a lab node: the real agent,
//! the project's API server (embedded store), a ClusterIP Service whose
//! EndpointSlice gains a backend and then loses it through the API, round
//! after round. For each change it measures, from the moment the API
//! answered the write:
//! * when a watch in this process saw the event: the floor any controller
//!   of the API meets (the baseline of the same run);
//! * when the node's datapath held the change: the Service's frontend in
//!   `cp_svc_frontends`, read from the node's pinned map every millisecond,
//!   counts the new number of backends.
//!
//! Once with the agent as the lab harness runs it (`--sync-debounce-ms 20`),
//! once restarted with its defaults. Issue #11's goal is p99 ≤ 100 ms for
//! the datapath figure. Measured, never
//! asserted. Needs root (skips otherwise). Run:
//! `cargo bench -p cozyplane-agent --bench service_propagation`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{line, poll};
use cozyplane_datapath::abi::{SvcKey, SVC_SCOPE_INTERNAL};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Api;
use support::{prerequisites, Cluster};

const ROUNDS: usize = 40;
const PORT: u16 = 8080;
const POLL: Duration = Duration::from_millis(1);
const GIVE_UP: Duration = Duration::from_secs(5);

/// The slice's endpoints: one per address, ready.
fn endpoints(ips: &[IpAddr]) -> serde_json::Value {
    serde_json::Value::Array(
        ips.iter()
            .map(|ip| {
                serde_json::json!({
                    "addresses": [ip.to_string()],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                })
            })
            .collect(),
    )
}

/// When the watch saw each resourceVersion of the slice.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// The frontend's backend count in the node's pinned map (0 when absent).
fn backends(dp: &cozyplane_datapath::Datapath, key: &SvcKey) -> u32 {
    dp.svc
        .frontends
        .get(key)
        .expect("read cp_svc_frontends")
        .map_or(0, |f| f.count)
}

/// Polls the frontend until it counts `want` backends; the time from `t0`.
fn wait_backends(
    dp: &cozyplane_datapath::Datapath,
    key: &SvcKey,
    want: u32,
    t0: Instant,
) -> Duration {
    let what = format!("the datapath to follow the EndpointSlice to {want} backends");
    poll(&what, POLL, GIVE_UP, || {
        (backends(dp, key) == want).then(|| t0.elapsed())
    })
}

fn seen_after(seen: &Seen, rv: &str, t0: Instant) -> Duration {
    poll(
        &format!("the watch to see resourceVersion {rv}"),
        POLL,
        GIVE_UP,
        || {
            let at = *seen.lock().unwrap().get(rv)?;
            Some(at.saturating_duration_since(t0))
        },
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of tests
    }
    if !prerequisites(cozyplane_testkit::Needs::new("service_propagation")) {
        return;
    }
    let mut c = Cluster::start("cpsvcprop", 1).await;
    let pods = [c.add_pod(0), c.add_pod(0)];
    let ips: Vec<IpAddr> = pods.iter().map(|p| IpAddr::V4(p.ip)).collect();

    // A Service without a selector: the bench writes its EndpointSlice.
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "prop", "namespace": "default"},
        "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": PORT}]},
    }))
    .expect("service");
    let svc = svcs
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the Service");
    let vip: IpAddr = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .expect("a ClusterIP allocated")
        .parse()
        .expect("ClusterIP");
    let key = SvcKey::new(0, vip, PORT, 6, SVC_SCOPE_INTERNAL);
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "prop-1", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "prop"}},
        "addressType": "IPv4",
        "endpoints": endpoints(&ips[..1]),
        "ports": [{"name": "http", "protocol": "TCP", "port": PORT}],
    }))
    .expect("slice");
    slices
        .create(&PostParams::default(), &slice)
        .await
        .expect("create the EndpointSlice");

    let seen: Seen = Arc::default();
    let recorder = seen.clone();
    let mut events = watcher(slices.clone(), watcher::Config::default()).boxed();
    let watch = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let at = Instant::now();
            let slice = match ev {
                Ok(watcher::Event::Apply(s)) => s,
                _ => continue,
            };
            if let Some(rv) = slice.metadata.resource_version {
                recorder.lock().unwrap().entry(rv).or_insert(at);
            }
        }
    });

    // the node's pinned maps, opened once (the programs load, nothing attaches)
    let dp = cozyplane_datapath::Datapath::load(c.agents[0].bpffs.join("cozyplane"))
        .expect("open the node's pinned datapath");
    tokio::task::block_in_place(|| wait_backends(&dp, &key, 1, Instant::now()));

    let change = |n: usize| {
        let patch = serde_json::json!({"endpoints": endpoints(&ips[..n])});
        let slices = slices.clone();
        async move {
            slices
                .patch("prop-1", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("patch the EndpointSlice")
        }
    };
    // First as the lab harness runs the agent (`--sync-debounce-ms 20`),
    // then with the agent's defaults (a restart keeps the pinned maps).
    for defaults in [false, true] {
        if defaults {
            let args = &mut c.agents[0].args;
            if let Some(i) = args.iter().position(|a| a == "--sync-debounce-ms") {
                args.drain(i..i + 2);
            }
            c.kill_agent(0);
            c.start_agent(0);
            c.wait_ready(0);
        }
        let (mut watch_add, mut watch_del, mut dp_add, mut dp_del) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let patched = change(2).await;
            let t0 = Instant::now();
            dp_add.push(tokio::task::block_in_place(|| {
                wait_backends(&dp, &key, 2, t0)
            }));
            let rv = patched.metadata.resource_version.expect("resourceVersion");
            watch_add.push(seen_after(&seen, &rv, t0));
            tokio::time::sleep(Duration::from_millis(200)).await;

            let patched = change(1).await;
            let t0 = Instant::now();
            dp_del.push(tokio::task::block_in_place(|| {
                wait_backends(&dp, &key, 1, t0)
            }));
            let rv = patched.metadata.resource_version.expect("resourceVersion");
            watch_del.push(seen_after(&seen, &rv, t0));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "EndpointSlice change, from the API's answer (rounds={ROUNDS}, 1 node, a ClusterIP with 1 ↔ 2 backends), agent {}:",
            if defaults { "with its defaults (sync debounce 50 ms)" } else { "as the lab runs it (--sync-debounce-ms 20)" }
        );
        line(
            "API watch sees the added backend (baseline)",
            &mut watch_add,
        );
        line("datapath holds the added backend", &mut dp_add);
        line("API watch sees the removal (baseline)", &mut watch_del);
        line("datapath has dropped the backend", &mut dp_del);
        let mut both: Vec<Duration> = dp_add.iter().chain(&dp_del).copied().collect();
        line("datapath, both kinds of change", &mut both);
    }
    watch.abort();
    drop(pods);
}

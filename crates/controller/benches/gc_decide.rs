//! Cost of one GC pass's pure work at cluster scale, measured (never
//! asserted): index the pod cache and judge every claim. A pass runs after
//! every (debounced) watch event, so this is the controller's steady-state
//! CPU per event. Run: `cargo bench -p cozyplane-controller`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::hint::black_box;
use std::time::{Duration, Instant};

use cozyplane_api::labels::{LABEL_FABRIC_POD_NAMESPACE, LABEL_FABRIC_POD_UID};
use cozyplane_api::local::FabricIPSpec;
use cozyplane_api::FabricIP;
use cozyplane_controller::gc::decide::{garbage, PodIndex};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

const PODS: usize = 50_000;
const ROUNDS: usize = 10;

fn pod(i: usize) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(format!("ns-{}", i % 100)),
            name: Some(format!("pod-{i}")),
            uid: Some(format!("uid-{i}")),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn claim(i: usize, created: Timestamp) -> FabricIP {
    let ns = format!("ns-{}", i % 100);
    // Every 100th claim belongs to a pod that no longer exists.
    let uid = if i.is_multiple_of(100) {
        format!("gone-{i}")
    } else {
        format!("uid-{i}")
    };
    FabricIP {
        metadata: ObjectMeta {
            name: Some(format!("f-10-{}-{}-{}", i >> 16, (i >> 8) & 255, i & 255)),
            uid: Some(format!("c-{i}")),
            resource_version: Some("1".into()),
            creation_timestamp: Some(Time(created)),
            labels: Some(
                [
                    (LABEL_FABRIC_POD_UID.to_string(), uid.clone()),
                    (LABEL_FABRIC_POD_NAMESPACE.to_string(), ns.clone()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: FabricIPSpec {
            address: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            node: Some(format!("node-{}", i % 500)),
            pod_namespace: Some(ns),
            pod_name: Some(format!("pod-{i}")),
            pod_uid: Some(uid),
        },
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let now = Timestamp::now();
    let old = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(3600))
        .unwrap_or(now);
    let pods: Vec<Pod> = (0..PODS).map(pod).collect();
    let claims: Vec<FabricIP> = (0..PODS).map(|i| claim(i, old)).collect();
    let grace = Duration::from_secs(60);

    let mut index_t = Vec::new();
    let mut judge_t = Vec::new();
    let mut found = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let index = PodIndex::from_pods(black_box(&pods));
        index_t.push(t.elapsed());
        let t = Instant::now();
        found = black_box(garbage(black_box(&claims), &index, now, grace)).len();
        judge_t.push(t.elapsed());
    }
    println!("gc_decide: {PODS} pods, {PODS} claims, {found} garbage, median of {ROUNDS}");
    println!(
        "  index pods     {:>8.2} ms",
        median(index_t).as_secs_f64() * 1e3
    );
    println!(
        "  judge claims   {:>8.2} ms",
        median(judge_t).as_secs_f64() * 1e3
    );
}

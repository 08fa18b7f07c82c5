//! NetworkPolicy change → datapath latency on a lab node: the real agent,
//! the project's API server (embedded store), and a policy created and then
//! deleted through the API, round after round. For each change it measures,
//! from the moment the API answered the write:
//! * when a watch in this process saw the event: the floor any controller
//!   of the API meets (the baseline of the same run);
//! * when the node's datapath held the change: the policy epoch
//!   (`cp_np_epoch`), which the agent's sync bumps last, after the pass's
//!   map writes, read from the node's pinned map every millisecond.
//!
//! Measured, never asserted. Needs root (skips otherwise). Run:
//! `cargo bench -p cozyplane-agent --bench policy_propagation`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{line, poll};
use futures::StreamExt;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::Api;
use support::{prerequisites, Cluster};

const ROUNDS: usize = 40;
const POLL: Duration = Duration::from_millis(1);
const GIVE_UP: Duration = Duration::from_secs(5);

/// Policy `i`: every pod of `default` admits the others on TCP port 1000+i.
fn policy(i: usize) -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("prop-{i}"), "namespace": "default"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {}}],
                "ports": [{"protocol": "TCP", "port": 1000 + i}],
            }],
        },
    }))
    .expect("policy")
}

/// When the watch saw each (name, created) event.
type Seen = Arc<Mutex<HashMap<(String, bool), Instant>>>;

/// The node's policy epoch, from its pinned maps.
fn epoch(dp: &cozyplane_datapath::Datapath) -> u32 {
    dp.np.epoch.get(&0, 0).expect("read cp_np_epoch")
}

/// Polls the epoch until it moves past `before`; the time from `t0`.
fn wait_epoch(dp: &cozyplane_datapath::Datapath, before: u32, t0: Instant) -> Duration {
    poll(
        "the datapath to follow the policy change",
        POLL,
        GIVE_UP,
        || (epoch(dp) != before).then(|| t0.elapsed()),
    )
}

fn seen_after(seen: &Seen, name: &str, created: bool, t0: Instant) -> Duration {
    poll(&format!("the watch to see {name}"), POLL, GIVE_UP, || {
        let seen = seen.lock().unwrap();
        let at = seen.get(&(name.to_string(), created))?;
        Some(at.saturating_duration_since(t0))
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of tests
    }
    if !prerequisites(cozyplane_testkit::Needs::new("policy_propagation")) {
        return;
    }
    let c = Cluster::start("cpprop", 1).await;
    let pods = [c.add_pod(0), c.add_pod(0)];
    let api: Api<NetworkPolicy> = Api::namespaced(c.client.clone(), "default");

    let seen: Seen = Arc::default();
    let recorder = seen.clone();
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let watch = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let at = Instant::now();
            let (np, created) = match ev {
                Ok(watcher::Event::Apply(np)) => (np, true),
                Ok(watcher::Event::Delete(np)) => (np, false),
                _ => continue,
            };
            if let Some(name) = np.metadata.name {
                recorder
                    .lock()
                    .unwrap()
                    .entry((name, created))
                    .or_insert(at);
            }
        }
    });

    // the node's pinned maps, opened once (the programs load, nothing attaches)
    let dp = cozyplane_datapath::Datapath::load(c.agents[0].bpffs.join("cozyplane"))
        .expect("open the node's pinned datapath");
    let (mut watch_add, mut watch_del, mut dp_add, mut dp_del) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let np = policy(i);
        let name = np.metadata.name.clone().unwrap();
        let before = epoch(&dp);
        api.create(&PostParams::default(), &np)
            .await
            .expect("create");
        let t0 = Instant::now();
        dp_add.push(tokio::task::block_in_place(|| wait_epoch(&dp, before, t0)));
        watch_add.push(seen_after(&seen, &name, true, t0));
        tokio::time::sleep(Duration::from_millis(200)).await;

        let before = epoch(&dp);
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        let t0 = Instant::now();
        dp_del.push(tokio::task::block_in_place(|| wait_epoch(&dp, before, t0)));
        watch_del.push(seen_after(&seen, &name, false, t0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();

    println!("NetworkPolicy change, from the API's answer (rounds={ROUNDS}, 1 node, 2 pods):");
    line("API watch sees the create (baseline)", &mut watch_add);
    line("datapath holds the policy's rules", &mut dp_add);
    line("API watch sees the delete (baseline)", &mut watch_del);
    line("datapath has dropped them", &mut dp_del);
    let mut both: Vec<Duration> = dp_add.iter().chain(&dp_del).copied().collect();
    line("datapath, both kinds of change", &mut both);
    drop(pods);
}

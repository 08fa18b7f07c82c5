//! Exec + ADD/DEL round-trip of the real plugin binary against an in-process
//! fake agent that answers at once: this is the plugin's own cost (process
//! start, config parsing, one socket exchange, result encoding), i.e. the
//! floor under what the real agent adds. Run with
//! `cargo bench -p cozyplane-cni --bench exec_roundtrip`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{exec_plugin, fake_netns, FakeAgent};
use cozyplane_cni::proto::{Request, Response};
use cozyplane_cni::types::{AttachmentResult, Interface, IpConfig};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<28} n={:<4} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// Execs the plugin once and returns the wall time of the exec.
fn exec(cmd: &str, id: String, ns: String, conf: &str) -> Duration {
    let env = [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", id.as_str()),
        ("CNI_NETNS", ns.as_str()),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=u",
        ),
        ("CNI_PATH", "/opt/cni/bin"),
    ];
    let t = Instant::now();
    let run = exec_plugin(&env, conf);
    let took = t.elapsed();
    assert_eq!(run.code, 0, "{run:?}");
    took
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |req| match req {
        Request::Add(_) => Response::Ok {
            result: Some(AttachmentResult {
                interfaces: vec![Interface {
                    name: "eth0".into(),
                    ..Default::default()
                }],
                ips: vec![IpConfig {
                    address: "10.244.0.5/32".parse().expect("cidr"),
                    gateway: None,
                    interface: Some(0),
                }],
                ..Default::default()
            }),
        },
        _ => Response::ok(),
    });
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "cozyplane", "type": "cozyplane",
        "agentSocket": agent.socket,
    })
    .to_string();
    // warm the page cache
    for i in 0..20 {
        exec("ADD", format!("w{i}"), ns.clone(), &conf);
    }
    // the floor: process start + VERSION, no socket
    let version: Vec<Duration> = (0..500)
        .map(|_| {
            let t = Instant::now();
            let run = exec_plugin(&[("CNI_COMMAND", "VERSION")], "");
            let took = t.elapsed();
            assert_eq!(run.code, 0, "{run:?}");
            took
        })
        .collect();
    report("VERSION (exec floor)", version);
    // interleave ADD and DEL, as a pod churn would
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for i in 0..500 {
        add.push(exec("ADD", format!("c{i}"), ns.clone(), &conf));
        del.push(exec("DEL", format!("c{i}"), ns.clone(), &conf));
    }
    report("ADD sequential", add);
    report("DEL sequential", del);

    let mut walls = Vec::new();
    for round in 0..30 {
        let t = Instant::now();
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (ns, conf) = (ns.clone(), conf.clone());
                std::thread::spawn(move || exec("ADD", format!("r{round}c{i}"), ns, &conf))
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        walls.push(t.elapsed());
    }
    report("20 concurrent ADDs (wall)", walls);
    println!("agent served {} requests", agent.requests().len());
}

//! Correctness smoke test of the benchmark (not a timed test: no speed is asserted).
//!
//! Runs each variant once for a very short time, RR only, on real lab topologies with
//! the real datapath, and checks that every variant carried traffic (the VPC pods' on
//! their VPC's path, by its meter), that the report has the VPC ÷ net-0 rows, and that
//! nothing with the run's prefix is left behind. A second test makes a round fail half-way and
//! checks that the failure also leaves nothing. Needs root and iproute2 (`ip`,
//! `bridge`, `ss`, `ping`); under CI a missing prerequisite fails the test (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};

use cozyplane_bench::report::{self, Context};
use cozyplane_bench::runner::Pinning;
use cozyplane_bench::{run, BenchError, Config, Metric, Variant};
use cozyplane_testkit::{needs, tools, Tool};

/// What a benchmark round drives besides root (network namespaces, bpffs, BPF
/// programs).
const TOOLS: &[Tool] = &[tools::IP, tools::BRIDGE, tools::SS, tools::PING];

fn config(prefix: &str, variants: Vec<Variant>, tool: PathBuf) -> Config {
    Config {
        rounds: 1,
        seconds: 1,
        warmup: 0.2,
        variants,
        metrics: vec![Metric::Rr],
        tool,
        prefix: prefix.to_string(),
        underlay_mtu: 1500,
        // Pinned as a real run is (taskset in every variant), where there are CPUs to.
        pin: Pinning::default_for(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// Everything under the prefix that could outlive a run: namespaces, mounts (the
/// private bpffs), run directories.
fn leftovers(prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.starts_with(prefix))
        .map(|n| format!("netns {n}"))
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    found.extend(
        mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.contains(&format!("/{prefix}")))
            .map(|m| format!("mount {m}")),
    );
    found.extend(
        std::fs::read_dir("/run/cozyplane-lab")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("run dir {n}")),
    );
    found
}

fn tool() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cozyplane-bench"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_carries_rr_traffic_and_leaves_nothing() {
    if !needs!().root().tools(TOOLS).ready() {
        return;
    }
    let prefix = format!("cs{}", std::process::id() % 100_000);
    let cfg = config(&prefix, Variant::ALL.to_vec(), tool());
    let result = run(&cfg, |line| eprintln!("{line}")).await;
    let left = leftovers(&prefix);
    let result = result.unwrap_or_else(|e| panic!("bench run failed: {e}"));
    assert!(left.is_empty(), "left behind: {left:?}");

    let ran: Vec<Variant> = result.rounds.iter().map(|r| r.variant).collect();
    assert_eq!(ran, Variant::ALL, "one round, a, b, c, d in order");
    for r in &result.rounds {
        let rr = r
            .sample
            .rr
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no RR result", r.variant));
        assert!(rr.n > 0 && rr.rate_per_s > 0.0, "{}: {rr:?}", r.variant);
        assert_eq!(rr.errors, 0, "{}: {rr:?}", r.variant);
        let lat = rr
            .txn
            .unwrap_or_else(|| panic!("{}: no latency", r.variant));
        assert!(lat.p50_us > 0.0 && lat.p50_us <= lat.p99_us, "{lat:?}");
        assert!(r.sample.tcp1.is_none() && r.sample.crr.is_none(), "RR only");
    }
    // (c) and (d) are the real datapath: they carried the traffic without dropping
    // any of it, and its maps are accounted for.
    for cozy in &result.rounds[2..] {
        assert!(cozy.variant.is_cozyplane(), "{}", cozy.variant);
        assert!(
            cozy.sample.drops.is_empty(),
            "{}: drops: {:?}",
            cozy.variant,
            cozy.sample.drops
        );
        assert!(!cozy.sample.setup.datapath_load.is_zero());
    }
    // (c)'s pods are on net 0, which is not metered; (d)'s traffic went through its
    // VPC both ways: at least one packet per RR transaction each way, on the sending
    // node's egress and the receiving node's ingress.
    assert_eq!(result.rounds[2].sample.metered, None);
    let vpc = &result.rounds[3];
    let metered = vpc.sample.metered.expect("(d) reports its VPC's meter");
    let transactions = vpc.sample.rr.as_ref().unwrap().n;
    assert!(
        metered.egress_packets >= 2 * transactions && metered.ingress_packets >= 2 * transactions,
        "{metered:?} for {transactions} transactions"
    );
    // The report puts (d) beside (c).
    let block = report::render(
        &cfg,
        &result,
        &Context {
            when: "now".into(),
            kernel: "test".into(),
            cpus: 1,
            command: "smoke".into(),
        },
    );
    let vpc_rr = block
        .lines()
        .filter(|l| l.starts_with("| TCP_RR 1 B, transactions/s |"))
        .nth(1)
        .unwrap_or_else(|| panic!("no VPC RR row: {block}"));
    assert!(vpc_rr.contains("| ≥ 0.97 |"), "{vpc_rr}");
    let locals = result
        .map_stats
        .iter()
        .find(|m| m.name == "cp_locals")
        .expect("cp_locals in the map stats");
    assert!(locals.memlock_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_fails_half_way_leaves_nothing() {
    if !needs!().root().tools(TOOLS).ready() {
        return;
    }
    let prefix = format!("cf{}", std::process::id() % 100_000);
    // `false` as the helper binary: the topology, pods and routes are built, then the
    // RR server exits at once and the round fails.
    let false_bin = ["/usr/bin/false", "/bin/false"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("false(1)");
    for variant in [Variant::Peer, Variant::Cozyplane, Variant::Vpc] {
        let cfg = config(&prefix, vec![variant], false_bin.to_path_buf());
        let err = run(&cfg, |_| {})
            .await
            .expect_err("a server that exits must fail the round");
        assert!(
            matches!(&err, BenchError::Command { stderr, .. } if stderr.contains("exited")),
            "{variant}: {err}"
        );
        let left = leftovers(&prefix);
        assert!(left.is_empty(), "{variant}: left behind: {left:?}");
    }
}

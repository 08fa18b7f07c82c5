//! NetworkPolicy compile and sync at the issue's scale (#12): 5 000 pods in
//! 50 namespaces on 20 nodes (this node holds 250 of them), 200 policies
//! (four per namespace for 50 namespaces: a deny-all, an allow from the
//! same namespace's `app=web<k>` on the named port `http`, an allow from
//! every namespace labelled `team=<t>` on TCP 8000-8010, and an egress rule
//! to 10.0.0.0/8 except 10.1.0.0/16 plus UDP 53 anywhere). Measured, never
//! asserted.
//!
//! Figures, side by side in one run:
//! - the agent's pass: the members from the address claims' snapshots (as
//!   the agent keeps them: parsed once per claim change, `MemberCache`, fed
//!   the objects as the stores share them) plus the compile, median and
//!   p99, and the first pass that parses them all; once with no claim
//!   changed between passes (what a policy change meets), once with one
//!   claim changed before each pass (every claim looked at again);
//! - the baseline beside it: the same input with every pod its own identity
//!   (a per-pod label), the shape an address-keyed compile has;
//! - when run as root: the sync into a real datapath (a private bpffs) from
//!   empty, and a policy change (one policy's port range edited) compiled
//!   and synced, p50/p99 - the agent's part of "policy change → datapath"
//!   (one namespace's policy edited: its `endPort` 8010 ↔ 8011).
//!
//! Run with `cargo bench -p cozyplane-agent --bench compile_network_policies`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_agent::compile::netpol::{
    compile_groups, CompiledNetworkPolicies, MemberCache, PolicyInput,
};
use cozyplane_api::labels::{ANNOTATION_POD_LABELS, ANNOTATION_POD_PORTS};
use cozyplane_api::FabricIP;
use cozyplane_datapath::{ensure_bpffs, Datapath};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

const PODS: u32 = 5_000;
const NAMESPACES: u32 = 50;
const NODES: u32 = 20;
const RUNS: usize = 41;

fn pod_ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + 2 + i))
}

fn labels(i: u32, unique: bool) -> serde_json::Value {
    // 10 apps × 2 tiers per namespace: 1 000 identities in all
    let mut l = json!({"app": format!("web{}", (i / NAMESPACES) % 10),
                       "tier": if (i / (NAMESPACES * 10)).is_multiple_of(2) { "front" } else { "back" }});
    if unique {
        l["pod"] = json!(format!("p{i}"));
    }
    l
}

const PORTS: &str = r#"[{"name":"http","port":8080,"protocol":"TCP"},{"name":"metrics","port":9090,"protocol":"TCP"}]"#;

fn input(unique: bool) -> (Vec<FabricIP>, Vec<Pod>) {
    let mut fips = Vec::new();
    let mut local = Vec::new();
    for i in 0..PODS {
        let ns = format!("ns{}", i % NAMESPACES);
        let node = format!("node{}", (i / 3) % NODES);
        let uid = format!("uid-{i}");
        let l = labels(i, unique);
        fips.push(
            serde_json::from_value(json!({
                "apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "FabricIP",
                "metadata": {"name": pod_ip(i).to_string(), "resourceVersion": format!("{}", i + 1), "annotations": {
                    ANNOTATION_POD_LABELS: l.to_string(), ANNOTATION_POD_PORTS: PORTS}},
                "spec": {"address": pod_ip(i).to_string(), "node": node, "podNamespace": ns,
                         "podName": format!("p{i}"), "podUID": uid},
            }))
            .unwrap(),
        );
        if node == "node0" {
            local.push(
                serde_json::from_value(json!({
                    "metadata": {"namespace": ns, "name": format!("p{i}"), "uid": uid, "labels": l},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [
                        {"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}]}]},
                    "status": {"phase": "Running", "podIP": pod_ip(i).to_string()},
                }))
                .unwrap(),
            );
        }
    }
    (fips, local)
}

fn namespaces() -> Vec<Namespace> {
    (0..NAMESPACES)
        .map(|n| {
            serde_json::from_value(json!({"metadata": {"name": format!("ns{n}"),
                "labels": {"team": format!("t{}", n % 5)}}}))
            .unwrap()
        })
        .collect()
}

/// The policies; namespace ns0's `team` rule ends at `ns0_end_port`, every
/// other's at 8010 (a change edits one namespace's policy).
fn policies(ns0_end_port: u16) -> Vec<NetworkPolicy> {
    let mut v = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("ns{n}");
        let p = |name: &str, spec: serde_json::Value| -> NetworkPolicy {
            serde_json::from_value(
                json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}),
            )
            .unwrap()
        };
        v.push(p(
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        ));
        v.push(p("web", json!({"podSelector": {"matchLabels": {"tier": "front"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("web{}", n % 10)}}}],
                         "ports": [{"port": "http"}]}]})));
        v.push(p("team", json!({"podSelector": {"matchLabels": {"tier": "back"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", n % 5)}}}],
                         "ports": [{"port": 8000, "endPort": if n == 0 { ns0_end_port } else { 8010 }}]}]})));
        v.push(p(
            "egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]},
                       {"ports": [{"port": 53, "protocol": "UDP"}]}]}),
        ));
    }
    v
}

/// The agent's compile of `policies` over the cache's identities.
fn compile(
    policies: &[NetworkPolicy],
    cache: &MemberCache,
    ns: &[Namespace],
) -> CompiledNetworkPolicies {
    compile_groups(
        PolicyInput {
            network_policies: policies,
            ..PolicyInput::default()
        },
        cache.groups(),
        ns,
        &Default::default(),
    )
}

/// The objects as the agent's stores share them.
fn shared((fips, local): (Vec<FabricIP>, Vec<Pod>)) -> (Vec<Arc<FabricIP>>, Vec<Arc<Pod>>) {
    (
        fips.into_iter().map(Arc::new).collect(),
        local.into_iter().map(Arc::new).collect(),
    )
}

fn stats(mut t: Vec<Duration>) -> (Duration, Duration) {
    t.sort();
    let p99 = t[(t.len() * 99 / 100).min(t.len() - 1)];
    (t[t.len() / 2], p99)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let ns = namespaces();
    let pol = policies(8010);
    // `COZYPLANE_BENCH_PROFILE=<n>`: only <n> passes of the agent's compile,
    // for `perf record`.
    if let Some(n) = std::env::var("COZYPLANE_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let (fips, local) = shared(input(false));
        let mut cache = MemberCache::default();
        for _ in 0..n {
            cache.update_shared(&fips, &local, "node0");
            black_box(compile(&pol, &cache, &ns));
        }
        return;
    }
    let mut rows = Vec::new();
    // the agent's passes: no claim changed since the last pass (what a
    // policy change meets), and one claim changed before each pass (a pod
    // relabelled on another node: every claim is looked at again); then
    // the baseline's shape
    for (what, unique, churn) in [
        ("identities (the agent)", false, false),
        ("identities, one claim changed each pass", false, true),
        ("one identity per pod (baseline)", true, false),
    ] {
        let (fips, local) = shared(input(unique));
        // the same claims but one: another snapshot (and version) for p1
        let mut changed = fips.clone();
        let mut f1 = (*changed[1]).clone();
        let notes = f1.metadata.annotations.get_or_insert_default();
        notes.insert(
            ANNOTATION_POD_LABELS.into(),
            json!({"app": "web9", "tier": "back"}).to_string(),
        );
        f1.metadata.resource_version = Some(format!("{}", PODS + 7));
        changed[1] = Arc::new(f1);
        let mut cache = MemberCache::default();
        let cold = Instant::now();
        cache.update_shared(&fips, &local, "node0");
        black_box(cache.groups());
        let cold = cold.elapsed();
        let (mut t, mut tm) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
        let mut last = None;
        for i in 0..RUNS {
            let input = if churn && i % 2 == 0 { &changed } else { &fips };
            let s = Instant::now();
            cache.update_shared(input, &local, "node0");
            tm.push(s.elapsed());
            let c = compile(&pol, &cache, &ns);
            t.push(s.elapsed());
            last = Some(black_box(c));
        }
        let c = last.unwrap();
        let (p50, p99) = stats(t);
        let (m50, _) = stats(tm);
        rows.push(format!(
            "pass {what:<40} p50 {:>7.2} ms  p99 {:>7.2} ms  (of which members {:.2} ms; first pass parsing every snapshot {:.1} ms; {} identities, {} endpoints, {} rules, {} CIDR classes)",
            ms(p50),
            ms(p99),
            ms(m50),
            ms(cold),
            c.identities,
            c.desired.eps.len(),
            c.desired.rules.len(),
            c.desired.cidrs.len()
        ));
    }
    for r in &rows {
        println!("{r}");
    }

    // The datapath part needs root (a private bpffs, BPF maps).
    let bpffs = std::env::temp_dir().join(format!("cp-np-bench-{}", std::process::id()));
    if let Err(e) = ensure_bpffs(&bpffs) {
        println!("sync: skipped (no private bpffs: {e}; run as root)");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let mut dp = Datapath::load(bpffs.join("pins")).expect("load the datapath");
        let (fips, local) = shared(input(false));
        let mut cache = MemberCache::default();
        cache.update_shared(&fips, &local, "node0");
        let s = Instant::now();
        let c = compile(&pol, &cache, &ns);
        let r = dp.np.sync(&c.desired).unwrap();
        println!(
            "sync from empty: {:.1} ms ({} entries written)",
            ms(s.elapsed()),
            r.written
        );
        // a change: one namespace's port range edited, back and forth
        let changed = [policies(8011), pol.clone()];
        let mut t = Vec::with_capacity(RUNS);
        let mut written = 0;
        for i in 0..RUNS {
            let p = &changed[i % 2];
            let s = Instant::now();
            cache.update_shared(&fips, &local, "node0");
            let c = compile(p, &cache, &ns);
            let r = dp.np.sync(&c.desired).unwrap();
            t.push(s.elapsed());
            written += r.written + r.removed;
        }
        let (p50, p99) = stats(t);
        println!(
            "policy change (compile + sync, {} map writes each): p50 {:.2} ms  p99 {:.2} ms",
            written / RUNS,
            ms(p50),
            ms(p99)
        );
    });
    // bpffs removes no tree in one call: the pins go one by one
    if let Ok(rd) = std::fs::read_dir(bpffs.join("pins")) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::fs::remove_dir(bpffs.join("pins"));
    if let Ok(target) = std::ffi::CString::new(bpffs.as_os_str().as_encoded_bytes()) {
        // SAFETY: `target` is a valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_dir(&bpffs);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

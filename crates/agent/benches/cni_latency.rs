//! CNI ADD/DEL latency through the real plugin binary and a real agent on a
//! lab node, side by side with Debian's `bridge` + `host-local` plugins (the
//! peer) on the same node, interleaved round by round, and our side again
//! with `--serial-add` (the veth pair made after the address claims, not
//! during them: the A/B of that overlap, each on a freshly restarted agent,
//! in alternating order); then our side again
//! with a NetworkPolicy in the pods' namespace (each ADD then waits for the
//! pod's policy); plus the agent's RSS and map memory; then, with 5 000
//! other pods' claims stored, our side finding a pod's claims from the
//! node's index against by a label-selected list. Measured, never asserted. Needs root (skips
//! otherwise). Run: `cargo bench -p cozyplane-agent --bench cni_latency`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ms, pct};
use cozyplane_datapath::netlink::delete_named_netns;
use support::{prerequisites, Cluster};

const ROUNDS: usize = 5;
/// Rounds of our side again with a NetworkPolicy in the pods' namespace.
const POLICED_ROUNDS: usize = 2;
const SEQUENTIAL: usize = 40;
/// Claims of other pods stored for the cluster-scale rounds.
const STORED_CLAIMS: usize = 5000;
/// Rounds of each variant at cluster scale.
const SCALE_ROUNDS: usize = 2;
/// Burst sizes: ADDs started at once (a node taking a rollout's pods).
const CONCURRENT: [usize; 2] = [20, 100];
const PEER_PLUGINS: &str = "/usr/lib/cni";

/// One pod's invocation context.
struct Sandbox {
    name: String,
    path: std::path::PathBuf,
    cid: String,
    args: String,
}

/// A pod namespace and its Pod object (the agent reads it at ADD, as on a
/// cluster), made before the clock starts.
fn sandbox(c: &Cluster) -> Sandbox {
    let (name, _netns, path) = c.new_pod_netns();
    let uid = c.pod_object(&name, 0);
    Sandbox {
        cid: format!("cid{}", name.replace('-', "")),
        args: Cluster::pod_args(&name, &uid),
        name,
        path,
    }
}

/// Runs a plugin binary inside node 0 (the peer's bridge lives in the
/// caller's namespace, so it must run where our agent does); returns its
/// wall time from spawn to exit.
fn exec_plugin(c: &Cluster, bin: &Path, cmd: &str, sb: &Sandbox, conf: &str) -> (Duration, Output) {
    let mut command = Command::new(bin);
    command
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", &sb.cid)
        .env("CNI_NETNS", &sb.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", PEER_PLUGINS)
        .env("CNI_ARGS", &sb.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Spawned from a thread inside the node's namespace rather than with a
    // setns hook after fork: without a hook std spawns with
    // clone(CLONE_VM|CLONE_VFORK) as container runtimes do (Go's os/exec),
    // where a fork copies this large test process's page tables first
    // (~2 ms of every invocation, both sides', measured).
    let t = Instant::now();
    let mut child = c.topo.nodes()[0]
        .netns
        .netns
        .run(|| command.spawn())
        .expect("enter the node's namespace")
        .expect("spawn plugin");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(conf.as_bytes());
    }
    let out = child.wait_with_output().expect("plugin output");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{} {cmd}: {}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (took, out)
}

struct Side {
    name: &'static str,
    bin: std::path::PathBuf,
    conf: String,
    add: Vec<Duration>,
    del: Vec<Duration>,
    /// `VERSION`: the plugin started in the node's namespace and answering
    /// without any work (what every ADD and DEL also pays for the process).
    version: Vec<Duration>,
    /// Wall time of each burst, per burst size (as in [`CONCURRENT`]).
    conc: [Vec<Duration>; 2],
}

impl Side {
    fn new(name: &'static str, bin: std::path::PathBuf, conf: String) -> Side {
        Side {
            name,
            bin,
            conf,
            add: Vec::new(),
            del: Vec::new(),
            version: Vec::new(),
            conc: [Vec::new(), Vec::new()],
        }
    }
}

/// Runs one round of `side`; returns the agent's log lines of the
/// sequential ADDs and DELs (for the step timings of those alone).
fn round(c: &Cluster, side: &mut Side) -> String {
    let pods: Vec<Sandbox> = (0..SEQUENTIAL).map(|_| sandbox(c)).collect();
    let from = c.agent_log(0).len();
    for sb in &pods {
        side.version
            .push(exec_plugin(c, &side.bin, "VERSION", sb, &side.conf).0);
    }
    for sb in &pods {
        side.add
            .push(exec_plugin(c, &side.bin, "ADD", sb, &side.conf).0);
    }
    for sb in &pods {
        side.del
            .push(exec_plugin(c, &side.bin, "DEL", sb, &side.conf).0);
    }
    let sequential = c.agent_log(0).get(from..).unwrap_or_default().to_string();
    let mut bursts = Vec::new();
    for (i, n) in CONCURRENT.into_iter().enumerate() {
        let burst: Vec<Sandbox> = (0..n).map(|_| sandbox(c)).collect();
        let t = Instant::now();
        std::thread::scope(|s| {
            for sb in &burst {
                let (bin, conf) = (&side.bin, &side.conf);
                s.spawn(move || exec_plugin(c, bin, "ADD", sb, conf));
            }
        });
        side.conc[i].push(t.elapsed());
        for sb in burst.iter() {
            exec_plugin(c, &side.bin, "DEL", sb, &side.conf);
        }
        bursts.extend(burst);
    }
    // The pods are gone, on the API server too: a node that kept every pod
    // of every round (runs up to 17 did: ~2 400 Pod objects by the end)
    // would make each of the agent's sync passes copy them all.
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(c.client.clone(), "default");
    for sb in pods.iter().chain(bursts.iter()) {
        let _ = delete_named_netns(&sb.name);
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(api.delete(
                &sb.name,
                &kube::api::DeleteParams::default().grace_period(0),
            ))
        })
        .expect("delete the pod object");
    }
    sequential
}

fn report(side: &mut Side) {
    side.add.sort();
    side.del.sort();
    side.version.sort();
    let mut bursts = String::new();
    for (n, walls) in CONCURRENT.iter().zip(side.conc.iter_mut()) {
        walls.sort();
        bursts.push_str(&format!(
            " | {n} concurrent ADDs median {:>7.1} ms",
            ms(pct(walls, 0.5))
        ));
    }
    println!(
        "{:<22} VERSION p50 {:>5.2} ms | ADD p50 {:>6.2} ms p99 {:>6.2} ms | DEL p50 {:>6.2} ms p99 {:>6.2} ms{bursts} (n={}, rounds={})",
        side.name,
        ms(pct(&side.version, 0.5)),
        ms(pct(&side.add, 0.5)),
        ms(pct(&side.add, 0.99)),
        ms(pct(&side.del, 0.5)),
        ms(pct(&side.del, 0.99)),
        side.add.len(),
        side.add.len() / SEQUENTIAL,
    );
}

/// Restarts node 0's agent, with `--serial-add` or without.
fn restart_agent(c: &mut Cluster, serial: bool) {
    restart_agent_with(c, if serial { &["--serial-add"] } else { &[] });
}

/// The hidden A/B flags [`restart_agent_with`] sets or clears.
const AB_FLAGS: [&str; 2] = ["--serial-add", "--claims-by-label"];

/// Restarts node 0's agent with exactly these of [`AB_FLAGS`].
fn restart_agent_with(c: &mut Cluster, flags: &[&str]) {
    c.kill_agent(0);
    c.agents[0].args.retain(|a| !AB_FLAGS.contains(&a.as_str()));
    c.agents[0].args.extend(flags.iter().map(|f| f.to_string()));
    c.start_agent(0);
    c.wait_ready(0);
}

/// Stores `n` FabricIPs of node 1's pods (the rest of a cluster), each a
/// claim as an agent makes it, addresses from 10.244.100.0 up (in the pod
/// pool: the walk meets some of them, as on a full cluster).
async fn store_cluster_claims(c: &Cluster, n: usize) {
    use futures::StreamExt;
    let node = c.topo.nodes()[1].name.clone();
    let api: kube::Api<cozyplane_api::FabricIP> = kube::Api::all(c.client.clone());
    let made = futures::stream::iter(0..n)
        .map(|i| {
            let (api, node) = (api.clone(), node.clone());
            async move {
                let who = cozyplane_agent::ipam::Claimant {
                    namespace: "elsewhere".into(),
                    name: format!("pod-{i}"),
                    uid: format!("00000000-0000-4000-8000-{i:012}"),
                    container_id: format!("c{i}"),
                    ifname: "eth0".into(),
                    node,
                };
                let ip =
                    std::net::Ipv4Addr::new(10, 244, 100 + (i / 250) as u8, 2 + (i % 250) as u8);
                api.create(&kube::api::PostParams::default(), &who.claim_for(ip.into()))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(16)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    assert_eq!(made, n, "stored claims");
}

/// Prints the p50 ratios of two (reported, so sorted) sides.
fn ratios(what: &str, a: &Side, b: &Side) {
    let r = |x: &[Duration], y: &[Duration]| ms(pct(x, 0.5)) / ms(pct(y, 0.5));
    println!(
        "ratios {what}: ADD p50 {:.2}, DEL p50 {:.2}, {} concurrent {:.2}, {} concurrent {:.2}",
        r(&a.add, &b.add),
        r(&a.del, &b.del),
        CONCURRENT[0],
        r(&a.conc[0], &b.conc[0]),
        CONCURRENT[1],
        r(&a.conc[1], &b.conc[1]),
    );
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `RssAnon`, `RssFile`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of tests
    }
    if !prerequisites(cozyplane_testkit::Needs::new("cni_latency")) {
        return;
    }
    let mut c = Cluster::start("cpbench", 2).await;
    let ours_conf = c.conf(0);
    let peer_conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "peer",
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.99.0.0/16"}]],
            "dataDir": c.dir.path().join("host-local").display().to_string(),
        },
    })
    .to_string();
    let mut ours = Side::new("cozyplane (agent)", c.cni.clone(), ours_conf);
    let mut peer = Side::new(
        "bridge + host-local",
        Path::new(PEER_PLUGINS).join("bridge"),
        peer_conf,
    );
    let peer_ok = peer.bin.exists();
    if !peer_ok {
        println!("peer plugins not found in {PEER_PLUGINS} (containernetworking-plugins)");
    }
    // The A/B of the veth pair made during the address claims (the
    // default) against after them (`--serial-add`): each is measured on a
    // freshly restarted agent, in alternating order.
    // `CNI_BENCH_ONLY=scale` runs the cluster-scale rounds alone.
    let only_scale = std::env::var("CNI_BENCH_ONLY").is_ok_and(|v| v == "scale");
    let mut serial = Side::new("cozyplane, serial ADD", c.cni.clone(), c.conf(0));
    let mut sequential_log = String::new();
    let mut serial_log = String::new();
    for r in 0..if only_scale { 0 } else { ROUNDS } {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for (i, serial_add) in order.into_iter().enumerate() {
            restart_agent(&mut c, serial_add);
            if serial_add {
                serial_log.push_str(&round(&c, &mut serial));
            } else {
                sequential_log.push_str(&round(&c, &mut ours));
            }
            // the peer between the two
            if peer_ok && i == 0 {
                round(&c, &mut peer);
            }
        }
    }
    if !only_scale {
        main_rounds(
            &mut c,
            ours,
            serial,
            peer,
            peer_ok,
            &sequential_log,
            &serial_log,
        )
        .await;
    }
    scale_rounds(&mut c).await;
}

/// Reports the main rounds, then runs and reports the policed ones and the
/// agent's memory.
async fn main_rounds(
    c: &mut Cluster,
    mut ours: Side,
    mut serial: Side,
    mut peer: Side,
    peer_ok: bool,
    sequential_log: &str,
    serial_log: &str,
) {
    restart_agent(c, false);
    report(&mut ours);
    report(&mut serial);
    ratios("ours/serial", &ours, &serial);
    if peer_ok {
        report(&mut peer);
        ratios("ours/peer", &ours, &peer);
    }
    println!("step timings of the sequential ADDs and DELs:");
    step_summary(sequential_log);
    println!("step timings of the sequential ADDs and DELs, serial ADD:");
    step_summary(serial_log);

    // The same with a NetworkPolicy in the pods' namespace: every ADD now
    // waits until the node's datapath holds the new pod's policy (the
    // policy barrier, runtime/barrier.rs).
    let deny: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bench-deny", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
        }))
        .expect("policy");
    kube::Api::namespaced(c.client.clone(), "default")
        .create(&kube::api::PostParams::default(), &deny)
        .await
        .expect("create the NetworkPolicy");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut policed = Side::new("cozyplane, policed ns", c.cni.clone(), c.conf(0));
    let mut policed_log = String::new();
    for _ in 0..POLICED_ROUNDS {
        policed_log.push_str(&round(c, &mut policed));
    }
    report(&mut policed);
    println!("step timings of the sequential ADDs and DELs in the policed namespace:");
    step_summary(&policed_log);
    let pid = c.agents[0].child.as_ref().map(|ch| ch.id()).unwrap_or(0);
    let memlock: u64 = {
        let (_, body) = c.http_get(0, "/metrics").expect("metrics");
        body.lines()
            .filter(|l| l.starts_with("cozyplane_map_memlock_bytes"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    // RSS counts the binary's pages the agent has touched (file-backed,
    // shared with every process of the same binary, reclaimable) beside its
    // own memory (anonymous): the two are reported apart.
    let mib = |field: &str| status_kib(pid, field) as f64 / 1024.0;
    println!(
        "agent RSS {:.1} MiB (anonymous {:.1}, file-backed {:.1}); map memory (memlock, all maps) {:.1} MiB",
        mib("VmRSS"),
        mib("RssAnon"),
        mib("RssFile"),
        memlock as f64 / (1024.0 * 1024.0)
    );
    kube::Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        c.client.clone(),
        "default",
    )
    .delete("bench-deny", &kube::api::DeleteParams::default())
    .await
    .expect("delete the NetworkPolicy");
}

/// The cluster-scale rounds.
async fn scale_rounds(c: &mut Cluster) {
    // At cluster scale: with the FabricIPs of 5 000 other pods stored, our
    // side again, finding the pod's claims by name from the node's index
    // (the default) against by a label-selected list (`--claims-by-label`,
    // as before the index), each on a freshly restarted agent, alternating.
    store_cluster_claims(c, STORED_CLAIMS).await;
    let mut indexed = Side::new("cozyplane, 5k stored", c.cni.clone(), c.conf(0));
    let mut labelled = Side::new("by label, 5k stored", c.cni.clone(), c.conf(0));
    let mut indexed_log = String::new();
    let mut labelled_log = String::new();
    let mut passes = Vec::new();
    let mut whole = String::new();
    for r in 0..SCALE_ROUNDS {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for by_label in order {
            if by_label {
                restart_agent_with(c, &["--claims-by-label"]);
                let from = c.agent_log(0).len();
                labelled_log.push_str(&round(c, &mut labelled));
                let log = c.agent_log(0);
                passes.extend(sync_passes(log.get(from..).unwrap_or_default()));
                whole.push_str(log.get(from..).unwrap_or_default());
            } else {
                restart_agent_with(c, &[]);
                let from = c.agent_log(0).len();
                indexed_log.push_str(&round(c, &mut indexed));
                let log = c.agent_log(0);
                passes.extend(sync_passes(log.get(from..).unwrap_or_default()));
                whole.push_str(log.get(from..).unwrap_or_default());
            }
        }
    }
    report(&mut indexed);
    report(&mut labelled);
    ratios("index/label, 5k stored", &indexed, &labelled);
    println!("step timings of the sequential ADDs and DELs, 5k stored:");
    step_summary(&indexed_log);
    println!("step timings of the sequential ADDs and DELs, 5k stored, by label:");
    step_summary(&labelled_log);
    passes.sort_unstable();
    if let (Some(p50), Some(max)) = (passes.get(passes.len() / 2), passes.last()) {
        println!(
            "agent sync passes during those rounds: {}, p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms",
            passes.len(),
            *p50 as f64 / 1e3,
            passes[passes.len() * 9 / 10] as f64 / 1e3,
            *max as f64 / 1e3,
        );
    }
    step_summary(
        &whole
            .lines()
            .filter(|l| l.contains("sync steps") || l.contains("sync pass"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let pid = c.agents[0].child.as_ref().map(|ch| ch.id()).unwrap_or(0);
    println!(
        "agent RSS with 5k claims stored {:.1} MiB (anonymous {:.1})",
        status_kib(pid, "VmRSS") as f64 / 1024.0,
        status_kib(pid, "RssAnon") as f64 / 1024.0,
    );
}

/// The `sync_us` of each of the agent's debug "sync pass" lines.
fn sync_passes(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("sync pass"))
        .filter_map(|l| {
            let rest = &l[l.find(" sync_us=")? + 9..];
            rest.split(|ch: char| !ch.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Medians of the agent's debug "step timings" lines (cumulative µs; the
/// `_alone` fields are one concurrent step's own time).
fn step_summary(log: &str) {
    for (what, fields) in [
        (
            "ADD step timings",
            &[
                "resolve",
                "allocate",
                "plumb",
                "maps",
                "attach",
                "claim_alone",
                "pair_alone",
            ][..],
        ),
        ("ADD policy barrier", &["policy"][..]),
        (
            "sync steps",
            &["compile_us", "overlay_us", "sg_us", "np_us", "services_us"][..],
        ),
        ("sync pass", &["snapshot_us", "sync_us"][..]),
        (
            "DEL step timings",
            &["inspect", "kernel_and_claims", "release"][..],
        ),
    ] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(what)).collect();
        if lines.is_empty() {
            continue;
        }
        let mut out = format!("agent {what} (median, cumulative):");
        for f in fields {
            let mut v: Vec<u64> = lines
                .iter()
                .filter_map(|l| {
                    let i = l.find(&format!(" {f}="))?;
                    let rest = &l[i + f.len() + 2..];
                    rest.split(|ch: char| !ch.is_ascii_digit())
                        .next()?
                        .parse()
                        .ok()
                })
                .collect();
            v.sort_unstable();
            if let Some(m) = v.get(v.len() / 2) {
                out.push_str(&format!(" {f} {:.2} ms", *m as f64 / 1e3));
            }
        }
        println!("{out}");
    }
}

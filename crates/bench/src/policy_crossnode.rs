//! Cross-node TCP_RR and TCP_CRR with 100 NetworkPolicies selecting the pair
//! against none, issue #12's "goal ≥ 0.95×"
//! (`cozyplane-bench services --parts policy`).
//!
//! One two-node lab topology with the production eBPF datapath on both nodes,
//! built as the datapath bench's variant (c) is ([`overlay::setup`]): the client
//! pod on node 1, the RR/CRR server pod on node 2. The policies are compiled by
//! the agent's own compiler (`compile_network_policies`) for each node, as that
//! node's agent would, and written by `NpMaps::sync`: the client's egress is
//! judged on node 1, the server's ingress on node 2. Per round, three variants
//! back to back, the order rotated each round:
//!
//! * **no policy**: every flow is still tracked (the tracker is always on), but
//!   no pod is isolated: the baseline;
//! * **100 policies**: 100 NetworkPolicies in the pair's namespace, each
//!   selecting both pods for ingress and egress; one admits the RR/CRR ports
//!   between them, the other 99 admit other peers (ipBlocks with `except`,
//!   namespaces, port ranges), so each subject carries ~350 rules and ~300
//!   CIDR classes (the unit test checks the load is there);
//! * **no policy again**: an A/A control, the method's own spread.
//!
//! Reported: per variant the medians over rounds, and the median of the
//! per-round ratios against the first variant. Speed is only reported; the
//! run fails unless, with the policies loaded, a connect to a port no
//! policy admits is refused at the client's egress (the policies were in
//! force).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use cozyplane_agent::compile::netpol::{compile_network_policies, NpHosts, NpMember};
use cozyplane_datapath::netpol::NpDesired;
use cozyplane_datapath::node::Tunnel;
use cozyplane_lab::{Topology, TopologySpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::error::{BenchError, Result};
use crate::measure::{self, CRR_PORT, RR_PORT};
use crate::overlay::{self, PodNetwork};
use crate::rr::{Mode, RrReport};
use crate::services::{client_run, Cgroups, SvcConfig};
use crate::stats::median;

/// Report markers in `docs/benchmarks.md`.
pub const BEGIN: &str = "<!-- policy-crossnode:begin -->";
/// End marker.
pub const END: &str = "<!-- policy-crossnode:end -->";
/// Policies in the loaded variant.
pub const POLICIES: usize = 100;
const NAMESPACE: &str = "bench";

/// The variants, in the order of the first round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyVariant {
    /// No policy.
    None,
    /// 100 policies selecting the pair.
    Policies,
    /// No policy again (A/A control).
    NoneAgain,
}

impl PolicyVariant {
    const ALL: [PolicyVariant; 3] = [
        PolicyVariant::None,
        PolicyVariant::Policies,
        PolicyVariant::NoneAgain,
    ];

    fn label(self) -> &'static str {
        match self {
            PolicyVariant::None => "no policy",
            PolicyVariant::Policies => "100 policies selecting the pair",
            PolicyVariant::NoneAgain => "no policy again [A/A control]",
        }
    }
}

/// One measurement: a variant's RR and CRR in one round.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    /// Round.
    pub round: u32,
    /// Which variant.
    pub variant: PolicyVariant,
    /// TCP_RR.
    pub rr: RrReport,
    /// TCP_CRR.
    pub crr: RrReport,
}

/// The 100 policies: 0 admits RR/CRR between the pair both ways, 1..100
/// other peers and ports; every one selects both pods, both directions.
pub fn policies() -> Vec<NetworkPolicy> {
    let role = |r: &str| serde_json::json!({"podSelector": {"matchLabels": {"role": r}}});
    let bench_ports = serde_json::json!([{"port": RR_PORT}, {"port": CRR_PORT}]);
    (0..POLICIES)
        .map(|i| {
            let spec = if i == 0 {
                serde_json::json!({
                    "podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [role("client")], "ports": bench_ports}],
                    "egress": [{"to": [role("server")], "ports": bench_ports}],
                })
            } else {
                let lo = 20_000 + 10 * i;
                serde_json::json!({
                    "podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                    "ingress": [
                        {"from": [{"ipBlock": {"cidr": format!("10.{i}.0.0/16"),
                                               "except": [format!("10.{i}.1.0/24")]}}],
                         "ports": [{"port": lo, "endPort": lo + 9}]},
                        {"from": [role(&format!("peer-{i}"))], "ports": [{"protocol": "UDP", "port": 5000 + i}]}],
                    "egress": [
                        {"to": [{"namespaceSelector": {"matchLabels": {"team": format!("t{i}")}}}],
                         "ports": [{"port": 3000 + i}]},
                        {"to": [{"ipBlock": {"cidr": format!("172.16.{i}.0/24")}}]}],
                })
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": NAMESPACE, "name": format!("p{i}")},
                "spec": spec,
            }))
            .unwrap_or_default()
        })
        .collect()
}

fn member(role: &str, ip: Ipv4Addr, local: bool) -> NpMember {
    NpMember {
        namespace: NAMESPACE.into(),
        labels: BTreeMap::from([("role".to_string(), role.to_string())]),
        ports: BTreeSet::new(),
        ip: IpAddr::V4(ip),
        local,
    }
}

/// What node 1 (the client's) and node 2 (the server's) hold for `policies`.
pub fn desired(
    policies: &[NetworkPolicy],
    client: Ipv4Addr,
    server: Ipv4Addr,
) -> (NpDesired, NpDesired) {
    let hosts = NpHosts::default();
    let on = |client_local: bool| {
        let members = [
            member("client", client, client_local),
            member("server", server, !client_local),
        ];
        compile_network_policies(policies, &members, &[], &hosts).desired
    };
    (on(true), on(false))
}

/// Runs the rounds; `log` gets progress lines.
pub fn run(cfg: &SvcConfig, log: &impl Fn(&str)) -> Result<Vec<PolicyRun>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("start a tokio runtime", e))?;
    rt.block_on(rounds(cfg, log))
}

async fn rounds(cfg: &SvcConfig, log: &impl Fn(&str)) -> Result<Vec<PolicyRun>> {
    let name = format!("{}p", cfg.prefix);
    let mut spec = TopologySpec::new(&name, 2);
    spec.external = false;
    let topo = Topology::build(spec).await?;
    // From here on an error drops `topo`, whose Drop tears everything down.
    let mut net = overlay::setup(&topo, PodNetwork::Default, Tunnel::default()).await?;
    let (client, client_ip, server) = match net.pods.as_slice() {
        [c, s, ..] => (c.name.clone(), c.ip, s.ip),
        _ => {
            return Err(BenchError::Invalid(
                "the overlay set up fewer than two pods".into(),
            ))
        }
    };
    measure::wait_reachable(&net.pods[0], server).await?;
    let _servers =
        measure::start_servers(&topo, &net.pods[1], &cfg.tool, cfg.pin.map(|p| p.server)).await?;
    let cgroups = Cgroups::new(&name)?;
    let (loaded1, loaded2) = desired(&policies(), client_ip, server);
    log(&format!(
        "policy: node 1 holds {} rules / {} classes, node 2 {} / {}",
        loaded1.rules.len(),
        loaded1.cidrs.len(),
        loaded2.rules.len(),
        loaded2.cidrs.len()
    ));
    let empty = NpDesired::default();
    let mut out = Vec::new();
    for round in 1..=cfg.rounds {
        let mut order = PolicyVariant::ALL.to_vec();
        let n = order.len();
        order.rotate_left((round as usize - 1) % n);
        for variant in order {
            let (d1, d2) = match variant {
                PolicyVariant::Policies => (&loaded1, &loaded2),
                _ => (&empty, &empty),
            };
            for (node, d) in net.nodes.iter_mut().zip([d1, d2]) {
                let r = node.datapath.np.sync(d)?;
                if !r.converged() {
                    return Err(BenchError::Output {
                        what: "NpMaps::sync".into(),
                        reason: format!("did not converge: {:?}", r.failures),
                    });
                }
            }
            let rr = client_run(
                cfg,
                &client,
                &cgroups.plain,
                SocketAddr::new(IpAddr::V4(server), RR_PORT),
                Mode::Rr,
            )?;
            let crr = client_run(
                cfg,
                &client,
                &cgroups.plain,
                SocketAddr::new(IpAddr::V4(server), CRR_PORT),
                Mode::Crr,
            )?;
            log(&format!(
                "policy round {round} {}: RR {:.0} tps, CRR {:.0} conn/s, errors {}/{}",
                variant.label(),
                rr.rate_per_s,
                crr.rate_per_s,
                rr.errors,
                crr.errors
            ));
            out.push(PolicyRun {
                round,
                variant,
                rr,
                crr,
            });
        }
    }
    // The policies were in force: with them loaded, a connection to a port
    // no policy admits is refused at the client's egress (node 1).
    for (node, d) in net.nodes.iter_mut().zip([&loaded1, &loaded2]) {
        node.datapath.np.sync(d)?;
    }
    let before = egress_drops(&net)?;
    let probe = std::process::Command::new("ip")
        .args(["netns", "exec", &client, "timeout", "2", "bash", "-c"])
        .arg(format!("echo > /dev/tcp/{server}/{UNADMITTED_PORT}"))
        .output()
        .map_err(|e| BenchError::io("probe an unadmitted port", e))?;
    let dropped = egress_drops(&net)? - before;
    log(&format!(
        "policy: a connect to {server}:{UNADMITTED_PORT} with the policies loaded: {} and {dropped} np_egress drop(s) on node 1",
        if probe.status.success() { "answered" } else { "refused" },
    ));
    if probe.status.success() || dropped == 0 {
        return Err(BenchError::Output {
            what: "the loaded variant".into(),
            reason: "the policies did not refuse an unadmitted port: not in force".into(),
        });
    }
    for node in &mut net.nodes {
        let _ = node.datapath.np.sync(&empty);
    }
    Ok(out)
}

/// A port no bench policy admits.
const UNADMITTED_PORT: u16 = 7003;

fn egress_drops(net: &overlay::Overlay) -> Result<u64> {
    let node1 = net
        .nodes
        .first()
        .ok_or_else(|| BenchError::Invalid("the overlay set up no node".into()))?;
    Ok(node1
        .datapath
        .drop_count(cozyplane_datapath::abi::DropReason::NpEgress)?)
}

/// The report section (markdown, without the markers).
pub fn render(runs: &[PolicyRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n**Cross-node TCP_RR and TCP_CRR with 100 NetworkPolicies selecting the pair vs none** (client pod on node 1, server pod on node 2, VXLAN overlay); medians over rounds; ratio = median of the per-round ratios against \"no policy\" in the same round (min–max). Goal: 100 policies ≥ 0.95× no policy.\n"
    );
    let _ = writeln!(
        s,
        "| variant | TCP_RR tps | RR p50 µs | RR p99 µs | TCP_CRR conn/s | CRR connect p50 µs | RR ratio | RR per round | CRR ratio | CRR per round |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    let rounds: BTreeSet<u32> = runs.iter().map(|r| r.round).collect();
    let find =
        |round: u32, v: PolicyVariant| runs.iter().find(|r| r.round == round && r.variant == v);
    for v in PolicyVariant::ALL {
        let mine: Vec<&PolicyRun> = runs.iter().filter(|r| r.variant == v).collect();
        let med = |f: &dyn Fn(&PolicyRun) -> Option<f64>, digits: usize| {
            let vals: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
            median(&vals).map_or("–".into(), |m| format!("{m:.digits$}"))
        };
        let ratio = |f: &dyn Fn(&PolicyRun) -> f64| {
            let ratios: Vec<f64> = rounds
                .iter()
                .filter_map(|&round| {
                    let base = f(find(round, PolicyVariant::None)?);
                    let this = f(find(round, v)?);
                    (base > 0.0).then(|| this / base)
                })
                .collect();
            let (lo, hi) = ratios
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            let m = median(&ratios).map_or("–".into(), |m| {
                let goal = match v {
                    PolicyVariant::Policies if m >= 0.95 => " (goal met)",
                    PolicyVariant::Policies => " (**goal missed**)",
                    _ => "",
                };
                format!("{m:.3}{goal}")
            });
            (m, format!("{lo:.3}–{hi:.3}"))
        };
        let (rr_ratio, rr_range) = ratio(&|r| r.rr.rate_per_s);
        let (crr_ratio, crr_range) = ratio(&|r| r.crr.rate_per_s);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {rr_ratio} | {rr_range} | {crr_ratio} | {crr_range} |",
            v.label(),
            med(&|r| Some(r.rr.rate_per_s), 0),
            med(&|r| r.rr.txn.as_ref().map(|l| l.p50_us), 1),
            med(&|r| r.rr.txn.as_ref().map(|l| l.p99_us), 1),
            med(&|r| Some(r.crr.rate_per_s), 0),
            med(&|r| r.crr.connect.as_ref().map(|l| l.p50_us), 1),
        );
    }
    let _ = writeln!(
        s,
        "\nPer run (round, variant: RR tps, CRR conn/s, errors RR/CRR):\n"
    );
    for r in runs {
        let _ = writeln!(
            s,
            "- {} {}: {:.0}, {:.0}, {}/{}",
            r.round,
            r.variant.label(),
            r.rr.rate_per_s,
            r.crr.rate_per_s,
            r.rr.errors,
            r.crr.errors
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use cozyplane_datapath::abi::{np_ep_key, NP_F_ISOLATED_IN, NP_F_ISOLATED_OUT};

    #[test]
    fn the_policies_isolate_both_pods_and_admit_the_bench_ports_only() {
        let (c, s) = (Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 2, 2));
        let ps = policies();
        assert_eq!(ps.len(), POLICIES);
        let (n1, n2) = desired(&ps, c, s);
        let flags = |d: &NpDesired, ip| d.eps[&np_ep_key(IpAddr::V4(ip))].flags;
        assert_eq!(flags(&n1, c), NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT);
        assert_eq!(flags(&n2, s), NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT);
        // subjects carry many rules: the load is real
        for d in [&n1, &n2] {
            assert!(
                d.rules.len() > 300 && d.cidrs.len() > 250,
                "{} rules, {} classes",
                d.rules.len(),
                d.cidrs.len()
            );
        }
    }
}

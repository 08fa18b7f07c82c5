//! Cross-node ClusterIP TCP_CRR through cozyplane's own datapath, issue #11's
//! "cross-node ClusterIP TCP_CRR vs direct pod IP: goal ≥ 0.95×"
//! (`cozyplane-bench services --parts crossnode`).
//!
//! One two-node lab topology with the production eBPF datapath on both nodes, built
//! as the datapath bench's variant (c) is ([`overlay::setup`]: VXLAN overlay, pods
//! plumbed and attached as the agent's CNI ADD does): the client pod on node 1, the
//! CRR server pod on node 2. Node 1's datapath also gets the socket-LB programs,
//! attached at a cgroup of our own (`lb`; on a node, the cgroup root), and one
//! frontend, ClusterIP `10.96.0.10:80` → the server pod's CRR port, written by
//! `SvcMaps::sync` as the agent writes it. Per round, three variants back to back,
//! the order rotated each round:
//!
//! * **direct**: the client, in a cgroup with nothing attached, connects to the
//!   server pod's address: the baseline;
//! * **ClusterIP**: the client, in `lb`, connects to the ClusterIP; the socket-LB
//!   rewrites the destination once at `connect()`, so the packets are the direct
//!   variant's, and what differs is the hook and the per-socket state it records;
//! * **direct again**: the baseline repeated, an A/A control: how far two identical
//!   variants differ in this method, so a ClusterIP/direct gap can be told from the
//!   method's own spread.
//!
//! Reported: per variant the medians over rounds, and the median of the per-round
//! ratios against direct in the same round. Speed is only reported, never asserted.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use cozyplane_datapath::abi::{Backend, SvcKey, SVC_SCOPE_INTERNAL};
use cozyplane_datapath::node::Tunnel;
use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
use cozyplane_lab::{Topology, TopologySpec};

use crate::error::{BenchError, Result};
use crate::measure::{self, CRR_PORT};
use crate::overlay::{self, PodNetwork};
use crate::rr::RrReport;
use crate::services::{crr, Cgroups, SvcConfig};
use crate::stats::median;

/// The ClusterIP of the measured Service.
pub const CLUSTER_IP: [u8; 4] = [10, 96, 0, 10];
/// Its port.
pub const SERVICE_PORT: u16 = 80;
/// Report markers in `docs/benchmarks.md` (its own block: this part runs alone).
pub const BEGIN: &str = "<!-- services-crossnode:begin -->";
/// End marker.
pub const END: &str = "<!-- services-crossnode:end -->";

/// The variants, in the order of the first round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossVariant {
    /// To the server pod's address.
    Direct,
    /// To the ClusterIP, through node 1's socket-LB.
    ClusterIp,
    /// To the server pod's address again (A/A control).
    DirectAgain,
}

impl CrossVariant {
    const ALL: [CrossVariant; 3] = [
        CrossVariant::Direct,
        CrossVariant::ClusterIp,
        CrossVariant::DirectAgain,
    ];

    fn label(self) -> &'static str {
        match self {
            CrossVariant::Direct => "direct to the pod IP",
            CrossVariant::ClusterIp => "ClusterIP, cozyplane socket-LB",
            CrossVariant::DirectAgain => "direct again [A/A control]",
        }
    }
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct CrossRun {
    /// Round.
    pub round: u32,
    /// Which variant.
    pub variant: CrossVariant,
    /// What the client measured.
    pub report: RrReport,
}

/// Runs the rounds; `log` gets progress lines.
pub fn run(cfg: &SvcConfig, log: &impl Fn(&str)) -> Result<Vec<CrossRun>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("start a tokio runtime", e))?;
    rt.block_on(rounds(cfg, log))
}

async fn rounds(cfg: &SvcConfig, log: &impl Fn(&str)) -> Result<Vec<CrossRun>> {
    let name = format!("{}x", cfg.prefix);
    let mut spec = TopologySpec::new(&name, 2);
    spec.external = false;
    let topo = Topology::build(spec).await?;
    // From here on an error drops `topo`, whose Drop tears everything down.
    let mut net = overlay::setup(&topo, PodNetwork::Default, Tunnel::default()).await?;
    let (client, server) = match net.pods.as_slice() {
        [c, s, ..] => (c.name.clone(), s.ip),
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
    let node1 = net
        .nodes
        .first_mut()
        .ok_or_else(|| BenchError::Invalid("the overlay set up no node".into()))?;
    let links = topo
        .run_dir()
        .join("bpffs")
        .join(&topo.nodes()[0].name)
        .join("links");
    node1.datapath.attach_socket_lb(&cgroups.lb, &links)?;
    let vip = IpAddr::from(CLUSTER_IP);
    let desired: SvcDesired = [(
        SvcKey::new(0, vip, SERVICE_PORT, 6, SVC_SCOPE_INTERNAL),
        DesiredFrontend {
            addr: Backend::new(0, vip, SERVICE_PORT, 6, 0),
            backends: vec![Backend::new(0, IpAddr::V4(server), CRR_PORT, 6, 0)],
            ..DesiredFrontend::default()
        },
    )]
    .into_iter()
    .collect();
    let r = node1.datapath.svc.sync(&desired)?;
    if !r.converged() {
        return Err(BenchError::Output {
            what: "SvcMaps::sync".into(),
            reason: format!("did not converge: {r:?}"),
        });
    }
    let mut out = Vec::new();
    for round in 1..=cfg.rounds {
        let mut order = CrossVariant::ALL.to_vec();
        let n = order.len();
        order.rotate_left((round as usize - 1) % n);
        for variant in order {
            let (cgroup, target) = match variant {
                CrossVariant::ClusterIp => (&cgroups.lb, SocketAddr::new(vip, SERVICE_PORT)),
                _ => (
                    &cgroups.plain,
                    SocketAddr::new(IpAddr::V4(server), CRR_PORT),
                ),
            };
            let report = crr(cfg, &client, cgroup, target)?;
            log(&format!(
                "crossnode round {round} {}: {:.0} conn/s, connect p50 {:.1} µs, {} errors",
                variant.label(),
                report.rate_per_s,
                report.connect.as_ref().map_or(f64::NAN, |l| l.p50_us),
                report.errors
            ));
            out.push(CrossRun {
                round,
                variant,
                report,
            });
        }
    }
    let _ = cozyplane_datapath::detach_socket_lb(&links);
    Ok(out)
}

/// The report section (markdown, without the markers).
pub fn render(runs: &[CrossRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n**Cross-node ClusterIP TCP_CRR through cozyplane's datapath** (client pod on node 1, server pod on node 2, VXLAN overlay, socket-LB on node 1); medians over rounds; ratio = median of the per-round ratios against direct in the same round (min–max). Goal: ClusterIP ≥ 0.95× direct.\n"
    );
    let _ = writeln!(
        s,
        "| variant | connections/s | connect() p50 µs | connect() p99 µs | connect+req+resp p50 µs | ratio conn/s vs direct | per round |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let rounds: Vec<u32> = {
        let mut r: Vec<u32> = runs.iter().map(|r| r.round).collect();
        r.dedup();
        r
    };
    let find = |round: u32, v: CrossVariant| {
        runs.iter()
            .find(|r| r.round == round && r.variant == v)
            .map(|r| &r.report)
    };
    for v in CrossVariant::ALL {
        let mine: Vec<&RrReport> = runs
            .iter()
            .filter(|r| r.variant == v)
            .map(|r| &r.report)
            .collect();
        let med = |f: &dyn Fn(&RrReport) -> Option<f64>, digits: usize| {
            let vals: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
            median(&vals).map_or("–".into(), |m| format!("{m:.digits$}"))
        };
        let ratios: Vec<f64> = rounds
            .iter()
            .filter_map(|&round| {
                let base = find(round, CrossVariant::Direct)?.rate_per_s;
                let this = find(round, v)?.rate_per_s;
                (base > 0.0).then(|| this / base)
            })
            .collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let ratio = median(&ratios).map_or("–".into(), |m| {
            let goal = match v {
                CrossVariant::ClusterIp if m >= 0.95 => " (goal met)",
                CrossVariant::ClusterIp => " (**goal missed**)",
                _ => "",
            };
            format!("{m:.3}{goal}")
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {ratio} | {lo:.3}–{hi:.3} |",
            v.label(),
            med(&|r| Some(r.rate_per_s), 0),
            med(&|r| r.connect.as_ref().map(|l| l.p50_us), 1),
            med(&|r| r.connect.as_ref().map(|l| l.p99_us), 1),
            med(&|r| r.txn.as_ref().map(|l| l.p50_us), 1),
        );
    }
    let _ = writeln!(
        s,
        "\nPer run (round, variant: conn/s, connect p50/p99 µs, errors):\n"
    );
    for r in runs {
        let c = r.report.connect.as_ref();
        let _ = writeln!(
            s,
            "- {} {}: {:.0}, {:.1} / {:.1}, {}",
            r.round,
            r.variant.label(),
            r.report.rate_per_s,
            c.map_or(f64::NAN, |l| l.p50_us),
            c.map_or(f64::NAN, |l| l.p99_us),
            r.report.errors
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rr::{Latency, Mode};

    fn report(rate: f64, p50: f64) -> RrReport {
        let lat = Latency {
            p50_us: p50,
            p90_us: p50 * 2.0,
            p99_us: p50 * 3.0,
            mean_us: p50,
            max_us: p50 * 4.0,
        };
        RrReport {
            mode: Mode::Crr,
            n: 1,
            errors: 0,
            elapsed_s: 1.0,
            rate_per_s: rate,
            txn: Some(lat),
            connect: Some(lat),
        }
    }

    #[test]
    fn ratios_are_per_round_against_direct_and_name_the_goal() {
        let mut runs = Vec::new();
        for (round, [d, c, a]) in [(1, [1000.0, 900.0, 1000.0]), (2, [2000.0, 2000.0, 1800.0])] {
            for (variant, rate) in CrossVariant::ALL.into_iter().zip([d, c, a]) {
                runs.push(CrossRun {
                    round,
                    variant,
                    report: report(rate, 20.0),
                });
            }
        }
        let s = render(&runs);
        // ClusterIP: 0.9 and 1.0 → median 0.95, met at the edge
        assert!(
            s.contains("| ClusterIP, cozyplane socket-LB | 1450 | 20.0 | 60.0 | 20.0 | 0.950 (goal met) | 0.900–1.000 |"),
            "{s}"
        );
        assert!(s.contains("| direct again [A/A control] | 1400 |"), "{s}");
        assert!(s.contains("0.950 | 0.900–1.000 |"), "{s}");
    }
}

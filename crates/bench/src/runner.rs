//! The run: for each round, each selected variant in order (a, b, c, d, a, b, c, d, …), a
//! fresh lab topology is built, the variant's network set up, the metrics measured,
//! and everything torn down again before the next one starts. Interleaving spreads
//! the machine's drift (other load, thermal, hypervisor) over all variants alike;
//! building from scratch every time keeps one run's state (TIME_WAIT sockets, neighbour
//! entries, conntrack-free but still warm caches) out of the next.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use cozyplane_datapath::MapStats;
use cozyplane_lab::{Topology, TopologySpec};
use serde::Serialize;

use crate::baseline;
use crate::error::{BenchError, Result};
use crate::measure::{self, Throughput};
use crate::overlay::{self, PodNetwork};
use crate::pods::{self, Pod};
use crate::rr::{Mode, RrReport};

/// One of the compared datapaths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Variant {
    /// (a) plain routing, no encapsulation: the limit.
    Limit,
    /// (b) flannel-style bridge + kernel VXLAN: the peer.
    Peer,
    /// (c) cozyplane's eBPF datapath.
    Cozyplane,
    /// (d) cozyplane's eBPF datapath with both pods in one VPC, against (c)'s net 0.
    Vpc,
}

impl Variant {
    /// All variants, in the interleaving order.
    pub const ALL: [Variant; 4] = [
        Variant::Limit,
        Variant::Peer,
        Variant::Cozyplane,
        Variant::Vpc,
    ];

    /// The letter used on the command line and in tables.
    pub fn letter(self) -> char {
        match self {
            Variant::Limit => 'a',
            Variant::Peer => 'b',
            Variant::Cozyplane => 'c',
            Variant::Vpc => 'd',
        }
    }

    /// A short description for tables.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Limit => "(a) plain routing [limit]",
            Variant::Peer => "(b) bridge + kernel VXLAN [peer]",
            Variant::Cozyplane => "(c) cozyplane eBPF",
            Variant::Vpc => "(d) cozyplane eBPF, VPC pods",
        }
    }

    /// Whether the variant runs cozyplane's datapath ((c) and (d)).
    pub fn is_cozyplane(self) -> bool {
        matches!(self, Variant::Cozyplane | Variant::Vpc)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter())
    }
}

/// Parses `a,b,c,d` (any subset, any order; the run keeps a, b, c, d order).
pub fn parse_variants(s: &str) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v = match part {
            "a" => Variant::Limit,
            "b" => Variant::Peer,
            "c" => Variant::Cozyplane,
            "d" => Variant::Vpc,
            other => {
                return Err(BenchError::Invalid(format!(
                    "variant {other:?}: want a (limit), b (peer), c (cozyplane) or d (cozyplane, VPC pods)"
                )))
            }
        };
        if !out.contains(&v) {
            out.push(v);
        }
    }
    if out.is_empty() {
        return Err(BenchError::Invalid("no variant selected".into()));
    }
    out.sort();
    Ok(out)
}

/// A measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Metric {
    /// iperf3, 1 stream.
    Tcp1,
    /// iperf3, 4 streams.
    Tcp4,
    /// TCP_RR.
    Rr,
    /// TCP_CRR.
    Crr,
}

impl FromStr for Metric {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Metric> {
        match s.trim() {
            "tcp1" => Ok(Metric::Tcp1),
            "tcp4" => Ok(Metric::Tcp4),
            "rr" => Ok(Metric::Rr),
            "crr" => Ok(Metric::Crr),
            other => Err(BenchError::Invalid(format!(
                "metric {other:?}: want tcp1, tcp4, rr or crr"
            ))),
        }
    }
}

/// Parses `tcp1,tcp4,rr,crr` (any subset; measured in that order).
pub fn parse_metrics(s: &str) -> Result<Vec<Metric>> {
    let mut out: Vec<Metric> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect::<Result<_>>()?;
    out.sort();
    out.dedup();
    if out.is_empty() {
        return Err(BenchError::Invalid("no metric selected".into()));
    }
    Ok(out)
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Rounds (each runs every selected variant once).
    pub rounds: u32,
    /// Seconds per iperf3 run and per RR/CRR measuring period.
    pub seconds: u32,
    /// RR/CRR warm-up, seconds.
    pub warmup: f64,
    /// Variants, in run order.
    pub variants: Vec<Variant>,
    /// Metrics, in run order.
    pub metrics: Vec<Metric>,
    /// The bench binary (runs `serve` / `client` inside the pods).
    pub tool: PathBuf,
    /// Prefix of every topology name; the variant letter is appended.
    pub prefix: String,
    /// Underlay MTU of the lab topologies.
    pub underlay_mtu: u32,
}

impl Config {
    /// Checks the options; the prefix must leave room for the variant letter within
    /// the lab's 10-character topology names.
    pub fn validate(&self) -> Result<()> {
        if self.rounds == 0 || self.seconds == 0 {
            return Err(BenchError::Invalid("rounds and seconds must be ≥ 1".into()));
        }
        if !(0.0..=60.0).contains(&self.warmup) {
            return Err(BenchError::Invalid(format!(
                "warm-up {} s: want 0-60",
                self.warmup
            )));
        }
        cozyplane_lab::spec::validate_name(&format!("{}a", self.prefix))?;
        if !self.tool.is_file() {
            return Err(BenchError::Invalid(format!(
                "helper binary {} not found",
                self.tool.display()
            )));
        }
        Ok(())
    }

    /// The topology name of `variant`.
    pub fn topology_name(&self, variant: Variant) -> String {
        format!("{}{}", self.prefix, variant.letter())
    }
}

/// Wall-clock times of the bench's own setup steps for one (round, variant).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SetupTimes {
    /// Lab topology build (namespaces, fabric bridge, node veths).
    pub topology: Duration,
    /// The variant's network: pods, devices, routes (for (c) also maps and attach).
    pub network: Duration,
    /// (c), (d) only: loading and verifying the object, summed over nodes.
    pub datapath_load: Duration,
    /// Until the client pod first pinged the server pod.
    pub first_ping: Duration,
    /// Tearing the topology down.
    pub teardown: Duration,
}

/// Everything measured for one (round, variant).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// iperf3 1 stream.
    pub tcp1: Option<Throughput>,
    /// iperf3 4 streams.
    pub tcp4: Option<Throughput>,
    /// TCP_RR.
    pub rr: Option<RrReport>,
    /// TCP_CRR.
    pub crr: Option<RrReport>,
    /// Setup times.
    pub setup: SetupTimes,
    /// (c), (d) only: non-zero datapath drop counters after the run.
    pub drops: Vec<(String, u64)>,
    /// (d) only: the VPC's meter after the run, summed over the nodes (the proof that
    /// the traffic took the VPC's path: net 0 is not metered).
    pub metered: Option<Metered>,
}

/// A VPC's packet counters (`cp_meters`) after a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Metered {
    /// Packets the VPC's pods sent that were forwarded (delivered or encapsulated).
    pub egress_packets: u64,
    /// Packets delivered into the VPC's pods.
    pub ingress_packets: u64,
}

/// One (round, variant) result.
#[derive(Clone, Debug, Serialize)]
pub struct RoundResult {
    /// 1-based round.
    pub round: u32,
    /// The variant.
    pub variant: Variant,
    /// What was measured.
    pub sample: Sample,
}

/// The whole run.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Results in run order.
    pub rounds: Vec<RoundResult>,
    /// (c)'s (or (d)'s) memory per map (first node), if either ran.
    pub map_stats: Vec<MapStats>,
    /// `/proc/loadavg` before and after.
    pub load_before: String,
    /// `/proc/loadavg` after the run.
    pub load_after: String,
}

/// A variant's network, kept alive while measuring.
enum Network {
    Plain(Vec<Pod>),
    Cozy(overlay::Overlay),
}

impl Network {
    fn pods(&self) -> &[Pod] {
        match self {
            Network::Plain(p) => p,
            Network::Cozy(o) => &o.pods,
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs the benchmark. `progress` receives one line per step (for stderr).
pub async fn run(cfg: &Config, mut progress: impl FnMut(&str)) -> Result<RunResult> {
    cfg.validate()?;
    let mut result = RunResult {
        load_before: loadavg(),
        ..RunResult::default()
    };
    for round in 1..=cfg.rounds {
        for &variant in &cfg.variants {
            progress(&format!(
                "round {round}/{}: {} (load {})",
                cfg.rounds,
                variant.label(),
                loadavg()
            ));
            let (sample, maps) = run_one(cfg, variant).await?;
            if !maps.is_empty() {
                result.map_stats = maps;
            }
            result.rounds.push(RoundResult {
                round,
                variant,
                sample,
            });
        }
    }
    result.load_after = loadavg();
    Ok(result)
}

/// Builds, measures and tears down one variant once.
async fn run_one(cfg: &Config, variant: Variant) -> Result<(Sample, Vec<MapStats>)> {
    let mut spec = TopologySpec::new(cfg.topology_name(variant), 2);
    spec.external = false;
    spec.mtu = cfg.underlay_mtu;
    let mut sample = Sample::default();

    let t = Instant::now();
    let mut topo = Topology::build(spec).await?;
    sample.setup.topology = t.elapsed();

    // Everything from here on is inside `topo`: an error or a dropped future (Ctrl-C)
    // drops it, and its Drop tears everything down.
    let t = Instant::now();
    let network = match variant {
        Variant::Limit => Network::Plain(baseline::direct(&topo).await?),
        Variant::Peer => Network::Plain(baseline::flannel(&topo).await?),
        Variant::Cozyplane => Network::Cozy(overlay::setup(&topo, PodNetwork::Default).await?),
        Variant::Vpc => {
            Network::Cozy(overlay::setup(&topo, PodNetwork::Vpc { vni: pods::VPC_VNI }).await?)
        }
    };
    sample.setup.network = t.elapsed();
    if let Network::Cozy(o) = &network {
        sample.setup.datapath_load = o.load_time;
    }
    let (client, server) = match network.pods() {
        [client, server, ..] => (client, server),
        _ => {
            return Err(BenchError::Invalid(
                "a variant built fewer than 2 pods".into(),
            ))
        }
    };
    sample.setup.first_ping = measure::wait_reachable(client, server.ip).await?;

    let servers = measure::start_servers(&topo, server, &cfg.tool).await?;
    let secs = f64::from(cfg.seconds);
    for metric in &cfg.metrics {
        match metric {
            Metric::Tcp1 => {
                sample.tcp1 = Some(measure::iperf(client, server.ip, cfg.seconds, 1).await?)
            }
            Metric::Tcp4 => {
                sample.tcp4 = Some(measure::iperf(client, server.ip, cfg.seconds, 4).await?)
            }
            Metric::Rr => {
                sample.rr = Some(
                    measure::request_response(
                        client,
                        &cfg.tool,
                        Mode::Rr,
                        server.ip,
                        secs,
                        cfg.warmup,
                    )
                    .await?,
                )
            }
            Metric::Crr => {
                sample.crr = Some(
                    measure::request_response(
                        client,
                        &cfg.tool,
                        Mode::Crr,
                        server.ip,
                        secs,
                        cfg.warmup,
                    )
                    .await?,
                )
            }
        }
    }
    drop(servers);

    let mut maps = Vec::new();
    if let Network::Cozy(o) = &network {
        maps = o.map_stats()?;
        sample.drops = o
            .drops()?
            .into_iter()
            .map(|(r, c)| (r.to_string(), c))
            .collect();
        sample.metered = o.metered()?.map(|c| Metered {
            egress_packets: c.egress.packets,
            ingress_packets: c.ingress.packets,
        });
    }
    drop(network);
    let t = Instant::now();
    topo.destroy()?;
    sample.setup.teardown = t.elapsed();
    Ok((sample, maps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_in_run_order_without_duplicates() {
        assert_eq!(
            parse_variants("c,a").unwrap(),
            [Variant::Limit, Variant::Cozyplane]
        );
        assert_eq!(parse_variants("a, b ,d,c,a").unwrap(), Variant::ALL);
        assert_eq!(parse_variants("d").unwrap(), [Variant::Vpc]);
        assert!(parse_variants("e").is_err());
        assert!(parse_variants(",").is_err());
    }

    #[test]
    fn metrics_parse_and_refuse_unknown_names() {
        assert_eq!(parse_metrics("rr").unwrap(), [Metric::Rr]);
        assert_eq!(
            parse_metrics("crr,tcp1,rr,tcp4,rr").unwrap(),
            [Metric::Tcp1, Metric::Tcp4, Metric::Rr, Metric::Crr]
        );
        assert!(parse_metrics("udp").is_err());
        assert!(parse_metrics("").is_err());
    }

    #[test]
    fn config_checks_names_and_counts() {
        let tool = std::env::current_exe().unwrap();
        let ok = Config {
            rounds: 1,
            seconds: 1,
            warmup: 0.5,
            variants: Variant::ALL.to_vec(),
            metrics: vec![Metric::Rr],
            tool,
            prefix: "cb123".into(),
            underlay_mtu: 1500,
        };
        ok.validate().unwrap();
        assert_eq!(ok.topology_name(Variant::Peer), "cb123b");
        for bad in [
            Config {
                rounds: 0,
                ..ok.clone()
            },
            Config {
                prefix: "much-too-long".into(),
                ..ok.clone()
            },
            Config {
                prefix: "abcdefghij".into(),
                ..ok.clone()
            },
            Config {
                warmup: -1.0,
                ..ok.clone()
            },
            Config {
                tool: "/nonexistent/tool".into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}

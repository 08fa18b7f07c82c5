//! The run: for each round, every selected variant is built on a fresh lab topology
//! of its own (all of them alive at once), then each metric is measured on every
//! variant back to back, and everything is torn down before the next round starts.
//!
//! The order alternates so that no variant always goes first: metric *k* of round
//! *r* (both 0-based) runs the variants in a, b, c, d, e order when *r + k* is even
//! and in e, d, c, b, a order when it is odd. Measuring one metric on all variants within
//! seconds of each other (rather than all metrics of one variant, then the next)
//! keeps the machine's drift (other load, thermal, hypervisor) out of the per-round
//! ratios, and the alternation cancels what being first or second costs. Building
//! from scratch every round keeps one round's state (TIME_WAIT sockets, neighbour
//! entries, warm caches) out of the next.
//!
//! With [`Config::pin`], every client (iperf3, RR/CRR) runs on one fixed CPU and every
//! server on another, in every variant alike: with few CPUs, where the scheduler
//! happens to put client and server otherwise moves a round's figures by more than
//! the datapaths differ (`docs/benchmarks.md`, "Method of (c) against (d)").

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use cozyplane_datapath::node::Tunnel;
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
    /// (e) (c) again, built after (d): an A/A control that shows how far two identical
    /// variants differ in this method, so a (d)/(c) gap can be told from the method's bias.
    Control,
    /// (f) (c) with the kernel's VXLAN device building and removing every tunnel header
    /// (`--tunnel-mode=device`) instead of tc: what the tc tunnel gains.
    Device,
}

impl Variant {
    /// All variants, in the interleaving order.
    pub const ALL: [Variant; 6] = [
        Variant::Limit,
        Variant::Peer,
        Variant::Cozyplane,
        Variant::Vpc,
        Variant::Control,
        Variant::Device,
    ];

    /// The letter used on the command line and in tables.
    pub fn letter(self) -> char {
        match self {
            Variant::Limit => 'a',
            Variant::Peer => 'b',
            Variant::Cozyplane => 'c',
            Variant::Vpc => 'd',
            Variant::Control => 'e',
            Variant::Device => 'f',
        }
    }

    /// A short description for tables.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Limit => "(a) plain routing [limit]",
            Variant::Peer => "(b) bridge + kernel VXLAN [peer]",
            Variant::Cozyplane => "(c) cozyplane eBPF",
            Variant::Vpc => "(d) cozyplane eBPF, VPC pods",
            Variant::Control => "(e) cozyplane eBPF again [A/A control]",
            Variant::Device => "(f) cozyplane eBPF, VXLAN device tunnel",
        }
    }

    /// Whether the variant runs cozyplane's datapath ((c), (d) and (e)).
    pub fn is_cozyplane(self) -> bool {
        matches!(
            self,
            Variant::Cozyplane | Variant::Vpc | Variant::Control | Variant::Device
        )
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.letter())
    }
}

/// Parses `a,b,c,d,e,f` (any subset, any order; the run keeps a, b, c, d, e, f order).
pub fn parse_variants(s: &str) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v = match part {
            "a" => Variant::Limit,
            "b" => Variant::Peer,
            "c" => Variant::Cozyplane,
            "d" => Variant::Vpc,
            "e" => Variant::Control,
            "f" => Variant::Device,
            other => {
                return Err(BenchError::Invalid(format!(
                    "variant {other:?}: want a (limit), b (peer), c (cozyplane), d (cozyplane, VPC pods), e (c again, A/A control) or f (c with the VXLAN device tunnel)"
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
    /// CPUs of the measuring processes; `None` leaves them to the scheduler.
    pub pin: Option<Pinning>,
}

/// The CPUs the measuring processes are pinned to, the same for every variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pinning {
    /// The client pod's iperf3 and RR/CRR clients.
    pub client: usize,
    /// The server pod's iperf3 and RR/CRR servers.
    pub server: usize,
}

impl Pinning {
    /// The default: client on CPU 0, server on CPU 1, as two nodes would each run
    /// their own; `None` on a single CPU.
    pub fn default_for(cpus: usize) -> Option<Pinning> {
        (cpus >= 2).then_some(Pinning {
            client: 0,
            server: 1,
        })
    }
}

impl fmt::Display for Pinning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client CPU {}, server CPU {}", self.client, self.server)
    }
}

/// Parses `--pin`: `CLIENT,SERVER` (CPU numbers; the same one twice is allowed) or
/// `none`.
pub fn parse_pinning(s: &str) -> Result<Option<Pinning>> {
    if s.trim() == "none" {
        return Ok(None);
    }
    let bad = || {
        BenchError::Invalid(format!(
            "--pin {s:?}: want CLIENT,SERVER (CPU numbers) or none"
        ))
    };
    let (c, srv) = s.split_once(',').ok_or_else(bad)?;
    let cpu = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
    Ok(Some(Pinning {
        client: cpu(c)?,
        server: cpu(srv)?,
    }))
}

/// The order variant indices `0..n` are measured in for metric `metric` (0-based) of
/// round `round` (1-based): forward when `round - 1 + metric` is even, else reversed.
pub fn measuring_order(round: u32, metric: usize, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if (round.saturating_sub(1) as usize + metric) % 2 == 1 {
        order.reverse();
    }
    order
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
        if let Some(p) = self.pin {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            if p.client >= cpus || p.server >= cpus {
                return Err(BenchError::Invalid(format!(
                    "--pin {},{}: this process may use {cpus} CPU(s), 0-{}",
                    p.client,
                    p.server,
                    cpus - 1
                )));
            }
        }
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

/// One variant built and serving, for one round. Dropping it (an error, Ctrl-C) kills
/// its servers, then the topology's drop guard tears everything down.
struct Live {
    variant: Variant,
    servers: Option<measure::Servers>,
    network: Network,
    topo: Topology,
    sample: Sample,
}

/// Runs the benchmark. `progress` receives one line per step (for stderr).
pub async fn run(cfg: &Config, mut progress: impl FnMut(&str)) -> Result<RunResult> {
    cfg.validate()?;
    let mut result = RunResult {
        load_before: loadavg(),
        ..RunResult::default()
    };
    for round in 1..=cfg.rounds {
        let mut live = Vec::with_capacity(cfg.variants.len());
        for &variant in &cfg.variants {
            progress(&format!(
                "round {round}/{}: build {} (load {})",
                cfg.rounds,
                variant.label(),
                loadavg()
            ));
            live.push(build(cfg, variant).await?);
        }
        for (k, metric) in cfg.metrics.iter().enumerate() {
            for i in measuring_order(round, k, live.len()) {
                let l = &mut live[i];
                progress(&format!(
                    "round {round}/{}: {metric:?} on {} (load {})",
                    cfg.rounds,
                    l.variant,
                    loadavg()
                ));
                measure_one(cfg, l, *metric).await?;
            }
        }
        for l in live {
            let variant = l.variant;
            let (sample, maps) = finish(l)?;
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

/// Builds one variant: its topology, network and servers, reachable.
async fn build(cfg: &Config, variant: Variant) -> Result<Live> {
    let mut spec = TopologySpec::new(cfg.topology_name(variant), 2);
    spec.external = false;
    spec.mtu = cfg.underlay_mtu;
    let mut sample = Sample::default();

    let t = Instant::now();
    let topo = Topology::build(spec).await?;
    sample.setup.topology = t.elapsed();

    // Everything from here on is inside `topo`: an error or a dropped future (Ctrl-C)
    // drops it, and its Drop tears everything down.
    let t = Instant::now();
    let network = match variant {
        Variant::Limit => Network::Plain(baseline::direct(&topo).await?),
        Variant::Peer => Network::Plain(baseline::flannel(&topo).await?),
        Variant::Cozyplane | Variant::Control => {
            Network::Cozy(overlay::setup(&topo, PodNetwork::Default, Tunnel::Tc).await?)
        }
        Variant::Vpc => Network::Cozy(
            overlay::setup(&topo, PodNetwork::Vpc { vni: pods::VPC_VNI }, Tunnel::Tc).await?,
        ),
        Variant::Device => {
            Network::Cozy(overlay::setup(&topo, PodNetwork::Default, Tunnel::Device).await?)
        }
    };
    sample.setup.network = t.elapsed();
    if let Network::Cozy(o) = &network {
        sample.setup.datapath_load = o.load_time;
    }
    let (client, server) = client_server(&network)?;
    sample.setup.first_ping = measure::wait_reachable(client, server.ip).await?;
    let servers =
        measure::start_servers(&topo, server, &cfg.tool, cfg.pin.map(|p| p.server)).await?;
    Ok(Live {
        variant,
        servers: Some(servers),
        network,
        topo,
        sample,
    })
}

fn client_server(network: &Network) -> Result<(&Pod, &Pod)> {
    match network.pods() {
        [client, server, ..] => Ok((client, server)),
        _ => Err(BenchError::Invalid(
            "a variant built fewer than 2 pods".into(),
        )),
    }
}

/// Measures `metric` on a built variant.
async fn measure_one(cfg: &Config, live: &mut Live, metric: Metric) -> Result<()> {
    let (client, server) = client_server(&live.network)?;
    let cpu = cfg.pin.map(|p| p.client);
    let secs = f64::from(cfg.seconds);
    let s = &mut live.sample;
    match metric {
        Metric::Tcp1 => {
            s.tcp1 = Some(measure::iperf(client, server.ip, cfg.seconds, 1, cpu).await?)
        }
        Metric::Tcp4 => {
            s.tcp4 = Some(measure::iperf(client, server.ip, cfg.seconds, 4, cpu).await?)
        }
        Metric::Rr | Metric::Crr => {
            let mode = if metric == Metric::Rr {
                Mode::Rr
            } else {
                Mode::Crr
            };
            let report = measure::request_response(
                client, &cfg.tool, mode, server.ip, secs, cfg.warmup, cpu,
            )
            .await?;
            if metric == Metric::Rr {
                s.rr = Some(report);
            } else {
                s.crr = Some(report);
            }
        }
    }
    Ok(())
}

/// Stops a variant's servers, reads its datapath's counters and tears it down.
fn finish(mut live: Live) -> Result<(Sample, Vec<MapStats>)> {
    drop(live.servers.take());
    let mut sample = std::mem::take(&mut live.sample);
    let mut maps = Vec::new();
    if let Network::Cozy(o) = &live.network {
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
    let Live {
        network, mut topo, ..
    } = live;
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
        assert_eq!(parse_variants("a, b ,d,c,a").unwrap(), Variant::ALL[..4]);
        assert_eq!(parse_variants("f,e,d,c,b,a").unwrap(), Variant::ALL);
        assert_eq!(parse_variants("d").unwrap(), [Variant::Vpc]);
        assert_eq!(
            parse_variants("e,c").unwrap(),
            [Variant::Cozyplane, Variant::Control]
        );
        assert_eq!(parse_variants("f").unwrap(), [Variant::Device]);
        assert!(parse_variants("g").is_err());
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
    fn pinning_parses_and_defaults_to_two_cpus() {
        assert_eq!(
            parse_pinning("0,1").unwrap(),
            Some(Pinning {
                client: 0,
                server: 1
            })
        );
        assert_eq!(
            parse_pinning(" 1 , 1 ").unwrap(),
            Some(Pinning {
                client: 1,
                server: 1
            })
        );
        assert_eq!(parse_pinning("none").unwrap(), None);
        for bad in ["", "0", "0,x", "-1,0", "0;1"] {
            assert!(parse_pinning(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Pinning::default_for(1), None);
        assert_eq!(
            Pinning::default_for(2),
            Some(Pinning {
                client: 0,
                server: 1
            })
        );
    }

    #[test]
    fn the_measuring_order_alternates_by_round_and_metric() {
        assert_eq!(measuring_order(1, 0, 2), [0, 1]);
        assert_eq!(measuring_order(1, 1, 2), [1, 0]);
        assert_eq!(measuring_order(2, 0, 2), [1, 0]);
        assert_eq!(measuring_order(2, 1, 2), [0, 1]);
        assert_eq!(measuring_order(3, 0, 4), [0, 1, 2, 3]);
        assert_eq!(measuring_order(3, 3, 4), [3, 2, 1, 0]);
        // Over two rounds every variant goes first equally often on every metric.
        for k in 0..4 {
            let firsts: Vec<usize> = (1..=2).map(|r| measuring_order(r, k, 2)[0]).collect();
            assert_eq!(firsts.iter().filter(|&&f| f == 0).count(), 1, "metric {k}");
        }
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
            pin: None,
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
            Config {
                pin: Some(Pinning {
                    client: 0,
                    server: 100_000,
                }),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}

//! The agent's metrics registry (prometheus-client), served on `/metrics` in the
//! Prometheus text format 0.0.4.
//!
//! * `cozyplane_map_entries{map}` and `cozyplane_map_memlock_bytes{map}` (gauges),
//!   `cozyplane_drops_total{reason}` (counter): read from the kernel at scrape
//!   time ([`AgentMetrics::read_maps`]), so they are never stale. Map memory is
//!   charged to the agent's cgroup, so it is worth watching next to its RSS.
//! * `cozyplane_syncs_total`, `cozyplane_sync_failures_total`,
//!   `cozyplane_sync_changes_total` (counters), `cozyplane_compile_diagnostics`
//!   and `cozyplane_node_address_conflicts` (gauges): written by the sync loop
//!   ([`SyncStats`]).
//! * `cozyplane_cni_request_duration_seconds{op,result}` (histogram): written by
//!   the CNI handler ([`CniMetrics`]).
//! * `cozyplane_vpc_packets_total` / `cozyplane_vpc_bytes_total`
//!   `{namespace,vpc,direction}` and `cozyplane_vpc_drops_total` /
//!   `cozyplane_vpc_dropped_bytes_total` `{namespace,vpc,reason}` (counters):
//!   the datapath's per-VPC meters ([`Datapath::net_counters`]), rendered by
//!   [`render_vpc_counters`] with the VPCs' names.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use cozyplane_datapath::meter::{Counters, NetCounters, Traffic};
use cozyplane_datapath::{Datapath, DatapathError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::watch::SyncStats;
use crate::cni_handler::CniMetrics;

/// The `Content-Type` of what [`AgentMetrics::encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every metric the agent exports.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    maps: Arc<MapReadings>,
    /// The per-VPC families, rendered at the last [`AgentMetrics::read_maps`].
    vpcs: Mutex<String>,
}

impl AgentMetrics {
    /// A registry over the sync loop's counters and the CNI handler's histogram.
    pub fn new(stats: &SyncStats, cni: &CniMetrics) -> Self {
        let mut registry = Registry::default();
        stats.register(&mut registry);
        cni.register(&mut registry);
        let maps = Arc::new(MapReadings::default());
        registry.register_collector(Box::new(Arc::clone(&maps)));
        AgentMetrics {
            registry,
            maps,
            vpcs: Mutex::default(),
        }
    }

    /// Reads the per-VPC meters, labelled with `names` (network id →
    /// namespace, name: the VPCs the sync loop serves), for the next
    /// [`AgentMetrics::encode`].
    pub fn read_vpcs(
        &self,
        dp: &Datapath,
        names: &BTreeMap<u32, (String, String)>,
    ) -> Result<(), DatapathError> {
        let text = render_vpc_counters(&dp.net_counters()?, names);
        *self.vpcs.lock().unwrap_or_else(|p| p.into_inner()) = text;
        Ok(())
    }

    /// Reads the map sizes, memory and drop counters from the kernel for the
    /// next [`AgentMetrics::encode`]. Until the first read they are left out.
    pub fn read_maps(&self, dp: &Datapath) -> Result<(), DatapathError> {
        let readings = Readings::read(dp)?;
        *self.maps.0.lock().unwrap_or_else(|p| p.into_inner()) = readings;
        Ok(())
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail, and no collector of ours fails.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out.push_str(&self.vpcs.lock().unwrap_or_else(|p| p.into_inner()));
        out
    }
}

/// The last kernel readings, encoded on every scrape.
#[derive(Debug, Default)]
struct MapReadings(Mutex<Readings>);

#[derive(Debug, Default)]
struct Readings {
    entries: Vec<(&'static str, u64)>,
    memlock_bytes: Vec<(&'static str, u64)>,
    drops: Vec<(&'static str, u64)>,
}

impl Readings {
    fn read(dp: &Datapath) -> Result<Readings, DatapathError> {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let entries = vec![
            (dp.locals.name(), count(dp.locals.entries()?.len())),
            (dp.remotes.name(), count(dp.remotes.entries()?.len())),
            (
                dp.node_remotes.name(),
                count(dp.node_remotes.entries()?.len()),
            ),
            (dp.ports.name(), count(dp.ports.entries()?.len())),
            (dp.vnis.name(), count(dp.vnis.entries()?.len())),
            (dp.vteps.name(), count(dp.vteps.entries()?.len())),
            (dp.learned.name(), count(dp.learned.entries()?.len())),
            (dp.masq_fwd.name(), count(dp.masq_fwd.entries()?.len())),
            (dp.masq_rev.name(), count(dp.masq_rev.entries()?.len())),
            (dp.masq_srcs.name(), count(dp.masq_srcs.entries()?.len())),
            (dp.internal.name(), count(dp.internal.entries()?.len())),
        ];
        let memlock_bytes = dp
            .map_stats()?
            .into_iter()
            .map(|m| (m.name, m.memlock_bytes))
            .collect();
        let drops = dp
            .drops()?
            .into_iter()
            .map(|(reason, n)| (reason.label(), n))
            .collect();
        Ok(Readings {
            entries,
            memlock_bytes,
            drops,
        })
    }
}

impl Collector for MapReadings {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Help texts are written as given here (`register` adds the full stop).
        let entries = Family {
            name: "cozyplane_map_entries",
            help: "Entries in a pinned datapath map.",
            label: "map",
            kind: MetricType::Gauge,
        };
        entries.encode(&mut encoder, &r.entries)?;
        let memlock = Family {
            name: "cozyplane_map_memlock_bytes",
            help: "Kernel memory charged to a map.",
            label: "map",
            kind: MetricType::Gauge,
        };
        memlock.encode(&mut encoder, &r.memlock_bytes)?;
        let drops = Family {
            // the text encoder adds `_total` to a counter's name
            name: "cozyplane_drops",
            help: "Packets dropped by the datapath.",
            label: "reason",
            kind: MetricType::Counter,
        };
        drops.encode(&mut encoder, &r.drops)
    }
}

/// One metric family of kernel readings, with one label.
struct Family {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    kind: MetricType,
}

impl Family {
    /// Writes the samples (label value, value); nothing when there are none.
    fn encode(
        &self,
        encoder: &mut DescriptorEncoder,
        samples: &[(&'static str, u64)],
    ) -> Result<(), std::fmt::Error> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (value, n) in samples {
            let labels = [(self.label, *value)];
            let sample = family.encode_family(&labels)?;
            match self.kind {
                MetricType::Counter => ConstCounter::new(*n).encode(sample)?,
                _ => ConstGauge::new(*n).encode(sample)?,
            }
        }
        Ok(())
    }
}

/// The per-VPC counters of this node (`counters`, from
/// [`Datapath::net_counters`]) as Prometheus text (format 0.0.4), labelled by
/// the VPC's namespace and name from `names` (network id, i.e. the VPC's VNI
/// → (namespace, name)), never by pod:
/// - `cozyplane_vpc_packets_total{namespace,vpc,direction}` and
///   `cozyplane_vpc_bytes_total{…}`, direction `ingress` (delivered into the
///   VPC's pods on this node) or `egress` (sent by them and forwarded);
/// - `cozyplane_vpc_drops_total{namespace,vpc,reason}` and
///   `cozyplane_vpc_dropped_bytes_total{…}`, by drop reason (the labels of
///   `cozyplane_drops_total`).
///
/// A network without a name is left out: a VPC the agent no longer knows
/// (its counters go with `Datapath::forget_net_counters`) or one it does not
/// know yet. The default network (net 0) is not metered by the datapath at
/// all, so it never appears; its drops are in `cozyplane_drops_total`.
/// Bytes are the Ethernet frames as the datapath saw them (the inner frame
/// for overlay traffic). Returns an empty string when there is nothing to
/// show, so the families are left out rather than shown empty.
pub fn render_vpc_counters(counters: &Counters, names: &BTreeMap<u32, (String, String)>) -> String {
    let named: Vec<(&str, &str, &NetCounters)> = counters
        .iter()
        .filter_map(|(net, c)| {
            let (ns, vpc) = names.get(net)?;
            Some((ns.as_str(), vpc.as_str(), c))
        })
        .collect();
    if named.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let families: [CounterFamily; 2] = [
        (
            "cozyplane_vpc_packets_total",
            "Packets of a VPC's pods the datapath forwarded, by direction.",
            |t| t.packets,
        ),
        (
            "cozyplane_vpc_bytes_total",
            "Bytes of a VPC's pods the datapath forwarded, by direction.",
            |t| t.bytes,
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (ns, vpc, c) in &named {
            for (direction, t) in [("ingress", c.ingress), ("egress", c.egress)] {
                let _ = writeln!(
                    out,
                    "{name}{{namespace=\"{}\",vpc=\"{}\",direction=\"{direction}\"}} {}",
                    escape(ns),
                    escape(vpc),
                    value(t)
                );
            }
        }
    }
    let families: [CounterFamily; 2] = [
        (
            "cozyplane_vpc_drops_total",
            "Packets of a VPC the datapath dropped, by reason.",
            |t| t.packets,
        ),
        (
            "cozyplane_vpc_dropped_bytes_total",
            "Bytes of a VPC the datapath dropped, by reason.",
            |t| t.bytes,
        ),
    ];
    if named.iter().any(|(_, _, c)| !c.drops.is_empty()) {
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (ns, vpc, c) in &named {
                for (reason, t) in &c.drops {
                    let _ = writeln!(
                        out,
                        "{name}{{namespace=\"{}\",vpc=\"{}\",reason=\"{}\"}} {}",
                        escape(ns),
                        escape(vpc),
                        reason.label(),
                        value(*t)
                    );
                }
            }
        }
    }
    out
}

/// A counter family of [`render_vpc_counters`]: name, help, and which
/// number of a [`Traffic`] it shows.
type CounterFamily = (&'static str, &'static str, fn(Traffic) -> u64);

/// A label value in the text format: backslash, double quote and newline
/// escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_counters_keep_their_names_and_types() {
        let stats = SyncStats::default();
        stats.syncs.inc();
        stats.failed_syncs.inc();
        stats.changes.inc_by(7);
        stats.diagnostics.set(2);
        stats.address_conflicts.set(1);
        let text = AgentMetrics::new(&stats, &CniMetrics::default()).encode();
        for want in [
            "# HELP cozyplane_syncs_total Overlay map syncs run.\n\
             # TYPE cozyplane_syncs_total counter\n\
             cozyplane_syncs_total 1\n",
            "# TYPE cozyplane_sync_failures_total counter\ncozyplane_sync_failures_total 1\n",
            "# TYPE cozyplane_sync_changes_total counter\ncozyplane_sync_changes_total 7\n",
            "# HELP cozyplane_compile_diagnostics Objects the last compile skipped.\n\
             # TYPE cozyplane_compile_diagnostics gauge\n\
             cozyplane_compile_diagnostics 2\n",
            "# TYPE cozyplane_node_address_conflicts gauge\ncozyplane_node_address_conflicts 1\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // no kernel read yet: the map families are left out, not shown as empty
        assert!(!text.contains("cozyplane_map_entries"), "{text}");
    }

    #[test]
    fn kernel_readings_are_encoded_with_their_labels() {
        let m = AgentMetrics::new(&SyncStats::default(), &CniMetrics::default());
        *m.maps.0.lock().unwrap() = Readings {
            entries: vec![("cp_locals", 3), ("cp_vteps", 0)],
            memlock_bytes: vec![("cp_locals", 4096)],
            drops: vec![("unknown_vtep", 5)],
        };
        let text = m.encode();
        for want in [
            "# HELP cozyplane_map_entries Entries in a pinned datapath map.\n\
             # TYPE cozyplane_map_entries gauge\n\
             cozyplane_map_entries{map=\"cp_locals\"} 3\n\
             cozyplane_map_entries{map=\"cp_vteps\"} 0\n",
            "# TYPE cozyplane_map_memlock_bytes gauge\n\
             cozyplane_map_memlock_bytes{map=\"cp_locals\"} 4096\n",
            "# HELP cozyplane_drops_total Packets dropped by the datapath.\n\
             # TYPE cozyplane_drops_total counter\n\
             cozyplane_drops_total{reason=\"unknown_vtep\"} 5\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }

    fn traffic(packets: u64, bytes: u64) -> Traffic {
        Traffic { packets, bytes }
    }

    #[test]
    fn vpc_counters_are_labelled_by_vpc_not_pod() {
        use cozyplane_datapath::abi::DropReason;
        let mut counters = Counters::new();
        counters.insert(
            100,
            NetCounters {
                ingress: traffic(3, 300),
                egress: traffic(2, 196),
                drops: [(DropReason::VpcIsolated, traffic(1, 74))].into(),
            },
        );
        counters.insert(
            101,
            NetCounters {
                ingress: traffic(1, 98),
                ..NetCounters::default()
            },
        );
        // a VPC the agent does not (or no longer) know: left out
        counters.insert(
            102,
            NetCounters {
                egress: traffic(9, 9),
                ..NetCounters::default()
            },
        );
        let names: BTreeMap<u32, (String, String)> = [
            (100, ("t1".to_string(), "net".to_string())),
            (101, ("t2".to_string(), "net".to_string())),
        ]
        .into();
        let text = render_vpc_counters(&counters, &names);
        assert_eq!(
            text,
            "# HELP cozyplane_vpc_packets_total Packets of a VPC's pods the datapath forwarded, \
             by direction.\n\
             # TYPE cozyplane_vpc_packets_total counter\n\
             cozyplane_vpc_packets_total{namespace=\"t1\",vpc=\"net\",direction=\"ingress\"} 3\n\
             cozyplane_vpc_packets_total{namespace=\"t1\",vpc=\"net\",direction=\"egress\"} 2\n\
             cozyplane_vpc_packets_total{namespace=\"t2\",vpc=\"net\",direction=\"ingress\"} 1\n\
             cozyplane_vpc_packets_total{namespace=\"t2\",vpc=\"net\",direction=\"egress\"} 0\n\
             # HELP cozyplane_vpc_bytes_total Bytes of a VPC's pods the datapath forwarded, \
             by direction.\n\
             # TYPE cozyplane_vpc_bytes_total counter\n\
             cozyplane_vpc_bytes_total{namespace=\"t1\",vpc=\"net\",direction=\"ingress\"} 300\n\
             cozyplane_vpc_bytes_total{namespace=\"t1\",vpc=\"net\",direction=\"egress\"} 196\n\
             cozyplane_vpc_bytes_total{namespace=\"t2\",vpc=\"net\",direction=\"ingress\"} 98\n\
             cozyplane_vpc_bytes_total{namespace=\"t2\",vpc=\"net\",direction=\"egress\"} 0\n\
             # HELP cozyplane_vpc_drops_total Packets of a VPC the datapath dropped, by reason.\n\
             # TYPE cozyplane_vpc_drops_total counter\n\
             cozyplane_vpc_drops_total{namespace=\"t1\",vpc=\"net\",reason=\"vpc_isolated\"} 1\n\
             # HELP cozyplane_vpc_dropped_bytes_total Bytes of a VPC the datapath dropped, by \
             reason.\n\
             # TYPE cozyplane_vpc_dropped_bytes_total counter\n\
             cozyplane_vpc_dropped_bytes_total{namespace=\"t1\",vpc=\"net\",reason=\"vpc_isolated\"} \
             74\n"
        );
        assert!(!text.contains("t3") && !text.contains(" 9\n"), "{text}");
    }

    #[test]
    fn vpc_counters_render_nothing_without_a_named_vpc_and_escape_labels() {
        let mut counters = Counters::new();
        counters.insert(
            100,
            NetCounters {
                ingress: traffic(1, 1),
                ..NetCounters::default()
            },
        );
        assert_eq!(render_vpc_counters(&counters, &BTreeMap::new()), "");
        assert_eq!(render_vpc_counters(&Counters::new(), &BTreeMap::new()), "");
        // no drops: the drop families are left out
        let names = [(100, ("a\"b".to_string(), "c\\d\ne".to_string()))].into();
        let text = render_vpc_counters(&counters, &names);
        assert!(
            text.contains(r#"{namespace="a\"b",vpc="c\\d\ne",direction="ingress"} 1"#),
            "{text}"
        );
        assert!(!text.contains("drops"), "{text}");
    }
}

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

use std::sync::{Arc, Mutex};

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
}

impl AgentMetrics {
    /// A registry over the sync loop's counters and the CNI handler's histogram.
    pub fn new(stats: &SyncStats, cni: &CniMetrics) -> Self {
        let mut registry = Registry::default();
        stats.register(&mut registry);
        cni.register(&mut registry);
        let maps = Arc::new(MapReadings::default());
        registry.register_collector(Box::new(Arc::clone(&maps)));
        AgentMetrics { registry, maps }
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
}

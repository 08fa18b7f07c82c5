//! Per-network (per-VPC) packet and byte counters, read from `cp_meters`
//! (`bpf/meter.h`): what was delivered into the network's pods (ingress),
//! what its pods sent and the datapath forwarded (egress), and what of it
//! was dropped, by reason. Only VPCs are metered (net 0 is not: the default
//! network pays no map lookup for it); nothing is counted per pod.
//!
//! The kernel keeps one value per CPU; [`fold`] sums them into one
//! [`NetCounters`] per network. Counters only grow while the network is
//! served; [`crate::Datapath::forget_net_counters`] removes them when it is not.

use std::collections::BTreeMap;

use crate::abi::{DropReason, MeterKey, MeterVal, METER_DROP, METER_EGRESS, METER_INGRESS};

/// Packets and bytes (bytes: the Ethernet frame as the datapath saw it,
/// the inner frame for overlay traffic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Traffic {
    fn add(&mut self, other: Traffic) {
        self.packets = self.packets.saturating_add(other.packets);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// The counters of one network, summed over all CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// Delivered into a pod of the network.
    pub ingress: Traffic,
    /// Sent by a pod of the network and forwarded (delivered on this node or
    /// encapsulated towards another).
    pub egress: Traffic,
    /// Dropped, by reason (only reasons that occurred).
    pub drops: BTreeMap<DropReason, Traffic>,
}

/// Per-network counters by network id.
pub type Counters = BTreeMap<u32, NetCounters>;

/// The sum of one entry's per-CPU values.
pub fn sum_cpus<'a>(values: impl IntoIterator<Item = &'a MeterVal>) -> Traffic {
    let mut t = Traffic::default();
    for v in values {
        t.add(Traffic {
            packets: v.packets,
            bytes: v.bytes,
        });
    }
    t
}

/// Folds `cp_meters` entries (already summed over CPUs) into counters per
/// network. Kinds this build does not know (a newer datapath's) are skipped.
pub fn fold(entries: impl IntoIterator<Item = (MeterKey, Traffic)>) -> Counters {
    let mut out = Counters::new();
    for (key, t) in entries {
        let slot = match key.kind {
            METER_INGRESS => &mut out.entry(key.net).or_default().ingress,
            METER_EGRESS => &mut out.entry(key.net).or_default().egress,
            k if k >= METER_DROP => match DropReason::from_index(k - METER_DROP) {
                Some(r) => out.entry(key.net).or_default().drops.entry(r).or_default(),
                None => continue,
            },
            _ => continue,
        };
        slot.add(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fold_into_per_network_sums() {
        let t = |packets, bytes| Traffic { packets, bytes };
        let key = |net, kind| MeterKey { net, kind };
        let per_cpu = [
            MeterVal {
                packets: 2,
                bytes: 200,
            },
            MeterVal {
                packets: 1,
                bytes: 60,
            },
        ];
        let c = fold([
            (key(100, METER_INGRESS), sum_cpus(&per_cpu)),
            (key(100, METER_EGRESS), t(1, 98)),
            (
                key(100, METER_DROP + DropReason::VpcIsolated as u32),
                t(4, 400),
            ),
            (
                key(101, METER_DROP + DropReason::Quarantined as u32),
                t(1, 42),
            ),
            // unknown kinds: skipped, the network is not invented for them
            (key(102, 7), t(1, 1)),
            (key(102, METER_DROP + 999), t(1, 1)),
        ]);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[&100].ingress, t(3, 260));
        assert_eq!(c[&100].egress, t(1, 98));
        assert_eq!(c[&100].drops[&DropReason::VpcIsolated], t(4, 400));
        assert_eq!(c[&101].ingress, Traffic::default());
        assert_eq!(c[&101].drops.len(), 1);
        assert_eq!(c[&101].drops[&DropReason::Quarantined], t(1, 42));
    }
}

//! Revocation: a VPC pod whose Port is gone is cut off at once.
//!
//! The controller deletes the Ports a deleted VPCBinding authorised
//! (docs/controller.md). The agent meets that as a local VPC endpoint
//! (`locals` at a VPC's network on this node) without a Port in its cache.
//! The cache may lag a fresh ADD (which creates the Port *before* it writes
//! `locals`), so absence in the cache only nominates a candidate: a live
//! read of the Port decides, and it decides before anything is written: a
//! candidate whose Port is still there and its own is left untouched,
//! record included (its record marked severed would make the next restart
//! restore a connected pod quarantined). A Port that is really gone (or now
//! held by another attachment) gets its pod severed:
//!
//! 1. the veth record is marked severed first, so a restart in between
//!    restores the pod quarantined, never connected;
//! 2. the port is quarantined (`PORT_F_QUARANTINE`: from_pod drops all the
//!    pod sends, the destination gate delivers nothing into it);
//! 3. its bridge entries and VPC `locals` entries go (other nodes drop
//!    their remotes from the same Port deletion).
//!
//! The pod keeps running, cut off. Re-creating the binding does not
//! reconnect it: its Port is gone and only a new ADD (a new sandbox)
//! claims one. The fabric guard entries stay until DEL.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cozyplane_api::names::port_name;
use cozyplane_api::Port;
use cozyplane_errors::Chain;
use kube::{Api, Client};

use super::kernel::SharedDatapath;
use super::plumber::NetlinkPlumber;
use crate::desired::NET_DEFAULT;
use crate::ipam::{claim_attachment, port_address};

/// The local VPC endpoints `{vni, address} → host ifindex` that have no
/// Port of this node in `ports` (candidates; see the module docs).
pub fn unclaimed(
    locals: &BTreeMap<(u32, IpAddr), u32>,
    ports: &[Port],
    node: &str,
) -> BTreeMap<(u32, IpAddr), u32> {
    let claimed: BTreeSet<(u32, IpAddr)> = ports
        .iter()
        .filter(|p| p.spec.node.as_deref() == Some(node))
        .filter_map(port_address)
        .collect();
    locals
        .iter()
        .filter(|((net, _), _)| *net != NET_DEFAULT)
        .filter(|(key, _)| !claimed.contains(key))
        .map(|(k, v)| (*k, *v))
        .collect()
}

/// Severs the pods of every candidate whose Port a live read confirms
/// gone; returns how many endpoints were cut.
pub async fn sever_unclaimed(
    client: &Client,
    dp: &SharedDatapath,
    plumber: &NetlinkPlumber,
    ports: &[Port],
    node: &str,
) -> usize {
    let locals: BTreeMap<(u32, IpAddr), u32> = match dp.lock().locals.entries() {
        Ok(e) => e
            .into_iter()
            .map(|(k, v)| ((k.net, k.addr.to_ip()), v.ifindex))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot read locals to find severed pods");
            return 0;
        }
    };
    let api: Api<Port> = Api::all(client.clone());
    let mut cut = 0;
    for ((vni, addr), ifindex) in unclaimed(&locals, ports, node) {
        let name = port_name(vni, addr);
        let live = match api.get_opt(&name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(port = %name, error = %Chain(&e), "cannot confirm a Port is gone; not severing yet");
                continue;
            }
        };
        let plumbed = match plumber.recorded(ifindex).await {
            Ok(Some(p)) => p,
            Ok(None) => continue, // not a pod veth of ours (anymore)
            Err(e) => {
                tracing::warn!(port = %name, ifindex, error = %Chain(&e), "cannot read a VPC pod's record");
                continue;
            }
        };
        let attachment = format!("{}/{}", plumbed.container_id, plumbed.ifname);
        if let Some(p) = &live {
            // Still there and still this attachment's: the cache lagged.
            // Decided before the record is touched: a record marked severed
            // here would make the next restart quarantine a live pod.
            if p.spec.node.as_deref() == Some(node)
                && claim_attachment(p) == Some(attachment.as_str())
            {
                continue;
            }
        }
        match plumber.mark_severed(ifindex).await {
            Ok(Some(_)) => {}
            Ok(None) => continue, // its veth went away meanwhile
            Err(e) => {
                tracing::warn!(port = %name, ifindex, error = %Chain(&e), "cannot record a severed pod");
                continue;
            }
        }
        let outcome = {
            let mut guard = dp.lock();
            guard.set_port_quarantine(ifindex, true).and_then(|_| {
                // the node no longer reaches it at its fabric address either
                for f in &plumbed.fabric {
                    guard.delete_bridge(*f, Some(ifindex))?;
                }
                guard
                    .locals
                    .remove(&cozyplane_datapath::abi::EpKey::new(vni, addr))
            })
        };
        match outcome {
            Ok(_) => {
                cut += 1;
                tracing::warn!(port = %name, container = %plumbed.container_id, ifindex, "Port gone: pod severed from its VPC (quarantined)");
            }
            Err(e) => {
                tracing::warn!(port = %name, error = %Chain(&e), "severing a pod failed (retried on the next sync)")
            }
        }
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Claimant;
    use cozyplane_api::sdn::VPCRef;

    fn port(vni: u32, ip: &str, node: &str) -> Port {
        let who = Claimant {
            namespace: "app".into(),
            name: "p".into(),
            uid: "u".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            node: node.into(),
        };
        who.port_for(vni, &VPCRef::default(), ip.parse().unwrap(), None)
    }

    #[test]
    fn only_vpc_endpoints_without_a_port_of_this_node_are_candidates() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let locals = BTreeMap::from([
            ((0, ip("10.244.0.5")), 7),  // net 0: never
            ((100, ip("10.0.0.5")), 8),  // has its Port
            ((100, ip("10.0.0.6")), 9),  // Port gone
            ((101, ip("10.0.0.5")), 10), // twin VPC: the Port of 100 does not count
            ((100, ip("10.0.0.7")), 11), // a Port of that address, but on another node
        ]);
        let ports = [port(100, "10.0.0.5", "n1"), port(100, "10.0.0.7", "n2")];
        let got: Vec<u32> = unclaimed(&locals, &ports, "n1").into_values().collect();
        assert_eq!(got, [9, 11, 10]);
    }
}

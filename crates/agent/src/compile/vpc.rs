//! The VPC networks' part of the topology: a pure function from the VPCs,
//! the Ports and the nodes' endpoints to
//!
//! * `remotes` at each VPC's network (its VNI): every Port on *another*
//!   node → that node's tunnel endpoint (this node's own Ports are locals,
//!   written by the CNI ADD);
//! * `vnis`: every Ready VPC's VNI → its network id (the same number), the
//!   VNIs `from_overlay` accepts;
//! * `names`: network id → the VPC's namespace and name, for metering;
//! * `peer_routes`: for every live peering of VPCs A and B, each of B's
//!   CIDRs under A's network → B's network, and the reverse.
//!
//! A peering is live when both halves exist and name each other (each in
//! its owner's namespace: the API server let only holders of `peer` on the
//! local VPC create it), both VPCs are Ready, and no CIDR of one overlaps
//! one of the other. The agent decides this from the specs itself rather
//! than from the halves' status, so deleting either half cuts the traffic
//! as soon as the agents see the deletion, without waiting for the
//! controller. Routes exist per pair only: peering is not transitive. A VPC
//! peered with two VPCs whose CIDRs overlap each other routes to neither
//! (an address in the overlap would be ambiguous).
//!
//! A Port is placed by `spec.node` (which the API server lets only that
//! node's agent write), never by the `spec.nodeIP` it carries. A Port whose
//! VNI is no Ready VPC's, or whose `spec.vpcRef` names another VPC than the
//! one holding that VNI, is skipped and reported: a Port cannot smuggle an
//! address into a VPC it does not belong to.

use std::collections::BTreeMap;

use cozyplane_api::validation::net::cidrs_overlap;
use cozyplane_api::{Port, VPCPeering, VPC};
use ipnet::IpNet;

use crate::desired::{RemoteKey, TunnelEndpoint};
use crate::ipam::port_address;

/// What the VPC compiler produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VpcTopology {
    /// `remotes` entries at VPC networks.
    pub remotes: BTreeMap<RemoteKey, TunnelEndpoint>,
    /// VNI → network id, for every Ready VPC.
    pub vnis: BTreeMap<u32, u32>,
    /// Network id → (namespace, name).
    pub names: BTreeMap<u32, (String, String)>,
    /// `{network, peer CIDR}` → the peer's network.
    pub peer_routes: BTreeMap<(u32, IpNet), u32>,
    /// What was skipped, sorted.
    pub diagnostics: Vec<VpcDiagnostic>,
}

/// Something the VPC compiler skipped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum VpcDiagnostic {
    /// The Port's name and `spec.ip` do not name one address.
    #[error("Port {0}: name and spec.ip do not name one address")]
    MalformedPort(String),
    /// The Port's VNI is no Ready VPC's, or its vpcRef names another VPC.
    #[error("Port {port}: VNI {vni} is not the VNI of VPC {vpc}")]
    PortOfUnknownVpc {
        /// The Port.
        port: String,
        /// The VNI in its name.
        vni: u32,
        /// The VPC its spec names.
        vpc: String,
    },
    /// The Port's node is unknown or has no endpoint.
    #[error("Port {port}: node {node:?} is unknown or has no tunnel endpoint")]
    PortOnUnknownNode {
        /// The Port.
        port: String,
        /// Its node.
        node: Option<String>,
    },
    /// Two VPCs report one VNI (a claim bug or a hand-edited status).
    #[error("VNI {vni} is reported by {first} and {second}: neither is served")]
    DuplicateVni {
        /// The VNI.
        vni: u32,
        /// One VPC.
        first: String,
        /// The other.
        second: String,
    },
}

/// Compiles the VPC entries as seen from `this_node`; `endpoints` are the
/// nodes' tunnel endpoints ([`super::Topology::endpoints`]).
pub fn compile_vpcs(
    vpcs: &[VPC],
    ports: &[Port],
    peerings: &[VPCPeering],
    endpoints: &BTreeMap<String, TunnelEndpoint>,
    this_node: &str,
) -> VpcTopology {
    let mut out = VpcTopology::default();
    let mut by_vni: BTreeMap<u32, (String, String)> = BTreeMap::new();
    let mut duplicated: BTreeMap<u32, ()> = BTreeMap::new();
    for vpc in vpcs {
        let Some(vni) = ready_vni(vpc) else { continue };
        let ns = vpc.metadata.namespace.clone().unwrap_or_default();
        let name = vpc.metadata.name.clone().unwrap_or_default();
        if let Some((ons, oname)) = by_vni.get(&vni) {
            out.diagnostics.push(VpcDiagnostic::DuplicateVni {
                vni,
                first: format!("{ons}/{oname}"),
                second: format!("{ns}/{name}"),
            });
            duplicated.insert(vni, ());
            continue;
        }
        by_vni.insert(vni, (ns, name));
    }
    for vni in duplicated.keys() {
        by_vni.remove(vni);
    }
    for port in ports {
        let pname = port.metadata.name.clone().unwrap_or_default();
        let Some((vni, ip)) = port_address(port) else {
            out.diagnostics.push(VpcDiagnostic::MalformedPort(pname));
            continue;
        };
        let vpc_ns = port.spec.vpc_ref.namespace.as_deref().unwrap_or_default();
        let vpc_name = port.spec.vpc_ref.name.as_str();
        match by_vni.get(&vni) {
            Some((ns, name)) if ns == vpc_ns && name == vpc_name => {}
            _ => {
                out.diagnostics.push(VpcDiagnostic::PortOfUnknownVpc {
                    port: pname,
                    vni,
                    vpc: format!("{vpc_ns}/{vpc_name}"),
                });
                continue;
            }
        }
        let node = port.spec.node.as_deref().filter(|n| !n.is_empty());
        if node == Some(this_node) {
            continue; // a local
        }
        match node.and_then(|n| endpoints.get(n)) {
            Some(ep) => {
                out.remotes.insert(RemoteKey::host(vni, ip), *ep);
            }
            None => out.diagnostics.push(VpcDiagnostic::PortOnUnknownNode {
                port: pname,
                node: node.map(str::to_string),
            }),
        }
    }
    out.peer_routes = peer_routes(vpcs, &by_vni, peerings);
    out.vnis = by_vni.keys().map(|v| (*v, *v)).collect();
    out.names = by_vni;
    out.diagnostics.sort();
    out
}

/// A VPC by (namespace, name).
type VpcName<'a> = (&'a str, &'a str);

/// The routes of every live peering (see the module docs).
fn peer_routes(
    vpcs: &[VPC],
    served: &BTreeMap<u32, (String, String)>,
    peerings: &[VPCPeering],
) -> BTreeMap<(u32, IpNet), u32> {
    // (namespace, name) -> (vni, cidrs) of the served VPCs
    let mut ready: BTreeMap<(&str, &str), (u32, &[String])> = BTreeMap::new();
    for vpc in vpcs {
        let (Some(ns), Some(name)) = (&vpc.metadata.namespace, &vpc.metadata.name) else {
            continue;
        };
        if let Some(vni) = ready_vni(vpc).filter(|v| served.contains_key(v)) {
            ready.insert(
                (ns.as_str(), name.as_str()),
                (vni, vpc.spec.cidrs.as_slice()),
            );
        }
    }
    // every half as (local VPC, peer VPC), both as (namespace, name)
    let halves: std::collections::BTreeSet<(VpcName<'_>, VpcName<'_>)> = peerings
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let ns = p.metadata.namespace.as_deref()?;
            Some((
                (ns, p.spec.vpc_ref.name.as_str()),
                (
                    p.spec.peer_ref.namespace.as_str(),
                    p.spec.peer_ref.name.as_str(),
                ),
            ))
        })
        .collect();
    let mut routes = BTreeMap::new();
    for (local, peer) in &halves {
        if local == peer || !halves.contains(&(*peer, *local)) {
            continue;
        }
        let (Some((lvni, lcidrs)), Some((pvni, pcidrs))) = (ready.get(local), ready.get(peer))
        else {
            continue;
        };
        if lcidrs
            .iter()
            .any(|a| pcidrs.iter().any(|b| cidrs_overlap(a, b)))
        {
            continue;
        }
        for c in pcidrs.iter().filter_map(|c| c.parse::<IpNet>().ok()) {
            routes.insert((*lvni, c.trunc()), *pvni);
        }
    }
    // Two peers of one VPC with overlapping CIDRs: no route could say which
    // peer an address in the overlap means, so neither peer is routed from
    // that VPC (each peering stays fine on its own).
    let mut conflicted: std::collections::BTreeSet<(u32, u32)> = Default::default();
    for ((net_a, cidr_a), peer_a) in &routes {
        for ((net_b, cidr_b), peer_b) in &routes {
            if net_a == net_b
                && peer_a != peer_b
                && (cidr_a.contains(&cidr_b.network()) || cidr_b.contains(&cidr_a.network()))
            {
                conflicted.insert((*net_a, *peer_a));
                conflicted.insert((*net_b, *peer_b));
            }
        }
    }
    routes.retain(|(net, _), peer| !conflicted.contains(&(*net, *peer)));
    routes
}

/// The VNI of a Ready VPC that is not being deleted.
fn ready_vni(vpc: &VPC) -> Option<u32> {
    let status = vpc.status.as_ref()?;
    if status.phase.as_deref() != Some("Ready") {
        return None;
    }
    u32::try_from(status.vni?)
        .ok()
        .filter(|v| *v >= cozyplane_api::names::FIRST_VPC_VNI)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Claimant;
    use crate::tenancy::testing::vpc;
    use cozyplane_api::sdn::VPCRef;
    use std::net::{IpAddr, Ipv4Addr};

    fn port(vni: u32, ns: &str, name: &str, ip: &str, node: &str) -> Port {
        let who = Claimant {
            namespace: "app".into(),
            name: "p".into(),
            uid: "u".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            node: node.into(),
        };
        who.port_for(
            vni,
            &VPCRef {
                namespace: Some(ns.into()),
                name: name.into(),
            },
            ip.parse().unwrap(),
            None,
        )
    }

    fn ep(last: u8) -> TunnelEndpoint {
        TunnelEndpoint(Ipv4Addr::new(192, 0, 2, last))
    }

    #[test]
    fn twin_vpcs_are_kept_apart_by_network() {
        let vpcs = [
            vpc("t1", "net", &["10.0.0.0/24"], Some(100), Some("Ready")),
            vpc("t2", "net", &["10.0.0.0/24"], Some(101), Some("Ready")),
            vpc("t3", "young", &["10.0.0.0/24"], None, None),
        ];
        let ports = [
            port(100, "t1", "net", "10.0.0.5", "n2"),
            port(101, "t2", "net", "10.0.0.5", "n3"),
            port(100, "t1", "net", "10.0.0.6", "n1"),
        ];
        let endpoints = BTreeMap::from([
            ("n1".into(), ep(1)),
            ("n2".into(), ep(2)),
            ("n3".into(), ep(3)),
        ]);
        let t = compile_vpcs(&vpcs, &ports, &[], &endpoints, "n1");
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(
            t.remotes,
            BTreeMap::from([
                (RemoteKey::host(100, ip), ep(2)),
                (RemoteKey::host(101, ip), ep(3)),
            ]),
            "own Port is local; the same address lives in two networks"
        );
        assert_eq!(t.vnis, BTreeMap::from([(100, 100), (101, 101)]));
        assert_eq!(t.names[&101], ("t2".to_string(), "net".to_string()));
        assert!(t.diagnostics.is_empty(), "{:?}", t.diagnostics);
    }

    #[test]
    fn a_port_cannot_smuggle_an_address_into_another_vpc() {
        let vpcs = [
            vpc("t1", "net", &["10.0.0.0/24"], Some(100), Some("Ready")),
            vpc("t2", "net", &["10.0.0.0/24"], Some(101), Some("Ready")),
        ];
        // VNI 101 is t2's, but the Port says t1/net; VNI 555 is nobody's.
        let ports = [
            port(101, "t1", "net", "10.0.0.5", "n2"),
            port(555, "t1", "net", "10.0.0.5", "n2"),
            port(100, "t1", "net", "10.0.0.7", "gone"),
        ];
        let mut bad_name = port(100, "t1", "net", "10.0.0.8", "n2");
        bad_name.spec.ip = "10.0.0.9".into();
        let mut all = ports.to_vec();
        all.push(bad_name);
        let endpoints = BTreeMap::from([("n2".into(), ep(2))]);
        let t = compile_vpcs(&vpcs, &all, &[], &endpoints, "n1");
        assert!(t.remotes.is_empty(), "{:?}", t.remotes);
        assert_eq!(t.diagnostics.len(), 4, "{:?}", t.diagnostics);
    }

    fn peering(ns: &str, local: &str, peer_ns: &str, peer: &str) -> VPCPeering {
        VPCPeering {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{local}-to-{peer}")),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: cozyplane_api::sdn::VPCPeeringSpec {
                vpc_ref: cozyplane_api::sdn::LocalVPCRef { name: local.into() },
                peer_ref: cozyplane_api::sdn::ObjectRef {
                    namespace: peer_ns.into(),
                    name: peer.into(),
                },
            },
            status: None,
        }
    }

    #[test]
    fn only_mutual_disjoint_peerings_route_and_never_transitively() {
        let vpcs = [
            vpc("a", "net", &["10.1.0.0/24"], Some(100), Some("Ready")),
            vpc(
                "b",
                "net",
                &["10.2.0.0/24", "fd02::/64"],
                Some(101),
                Some("Ready"),
            ),
            vpc("c", "net", &["10.3.0.0/24"], Some(102), Some("Ready")),
            vpc("d", "net", &["10.1.0.0/25"], Some(103), Some("Ready")),
        ];
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        // a<->b mutual; b<->c mutual; a->c one-sided; a<->d overlapping.
        let peerings = [
            peering("a", "net", "b", "net"),
            peering("b", "net", "a", "net"),
            peering("b", "net", "c", "net"),
            peering("c", "net", "b", "net"),
            peering("a", "net", "c", "net"),
            peering("d", "net", "a", "net"),
            peering("a", "net", "d", "net"),
        ];
        let t = compile_vpcs(&vpcs, &[], &peerings, &BTreeMap::new(), "n1");
        assert_eq!(
            t.peer_routes,
            BTreeMap::from([
                ((100, net("10.2.0.0/24")), 101),
                ((100, net("fd02::/64")), 101),
                ((101, net("10.1.0.0/24")), 100),
                ((101, net("10.3.0.0/24")), 102),
                ((102, net("10.2.0.0/24")), 101),
                ((102, net("fd02::/64")), 101),
            ]),
            "a-b and b-c, but no a-c (one-sided, and not transitive) and no a-d (overlap)"
        );
        // Either half gone: no route either way.
        let t = compile_vpcs(&vpcs, &[], &peerings[1..2], &BTreeMap::new(), "n1");
        assert!(t.peer_routes.is_empty());

        // e overlaps b: c, peered with both, routes to neither (which would
        // 10.2.0.1 mean?); b and e keep their routes to c.
        let mut vpcs = vpcs.to_vec();
        vpcs.push(vpc("e", "net", &["10.2.0.0/25"], Some(104), Some("Ready")));
        let both = [
            peering("b", "net", "c", "net"),
            peering("c", "net", "b", "net"),
            peering("e", "net", "c", "net"),
            peering("c", "net", "e", "net"),
        ];
        let t = compile_vpcs(&vpcs, &[], &both, &BTreeMap::new(), "n1");
        assert_eq!(
            t.peer_routes,
            BTreeMap::from([
                ((101, net("10.3.0.0/24")), 102),
                ((104, net("10.3.0.0/24")), 102),
            ])
        );
    }

    #[test]
    fn a_vni_two_vpcs_report_is_served_for_neither() {
        let vpcs = [
            vpc("t1", "a", &["10.0.0.0/24"], Some(100), Some("Ready")),
            vpc("t2", "b", &["10.0.0.0/24"], Some(100), Some("Ready")),
        ];
        let t = compile_vpcs(&vpcs, &[], &[], &BTreeMap::new(), "n1");
        assert!(t.vnis.is_empty());
        assert!(matches!(
            t.diagnostics.as_slice(),
            [VpcDiagnostic::DuplicateVni { vni: 100, .. }]
        ));
    }
}

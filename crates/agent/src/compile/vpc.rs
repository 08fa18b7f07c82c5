//! The VPC networks' part of the topology: a pure function from the VPCs,
//! the Ports and the nodes' endpoints to
//!
//! * `remotes` at each VPC's network (its VNI): every Port on *another*
//!   node → that node's tunnel endpoint (this node's own Ports are locals,
//!   written by the CNI ADD);
//! * `vnis`: every Ready VPC's VNI → its network id (the same number), the
//!   VNIs `from_overlay` accepts;
//! * `names`: network id → the VPC's namespace and name, for metering.
//!
//! A Port is placed by `spec.node` (which the API server lets only that
//! node's agent write), never by the `spec.nodeIP` it carries. A Port whose
//! VNI is no Ready VPC's, or whose `spec.vpcRef` names another VPC than the
//! one holding that VNI, is skipped and reported: a Port cannot smuggle an
//! address into a VPC it does not belong to.

use std::collections::BTreeMap;

use cozyplane_api::{Port, VPC};

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
    out.vnis = by_vni.keys().map(|v| (*v, *v)).collect();
    out.names = by_vni;
    out.diagnostics.sort();
    out
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
        let t = compile_vpcs(&vpcs, &ports, &endpoints, "n1");
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
        let t = compile_vpcs(&vpcs, &all, &endpoints, "n1");
        assert!(t.remotes.is_empty(), "{:?}", t.remotes);
        assert_eq!(t.diagnostics.len(), 4, "{:?}", t.diagnostics);
    }

    #[test]
    fn a_vni_two_vpcs_report_is_served_for_neither() {
        let vpcs = [
            vpc("t1", "a", &["10.0.0.0/24"], Some(100), Some("Ready")),
            vpc("t2", "b", &["10.0.0.0/24"], Some(100), Some("Ready")),
        ];
        let t = compile_vpcs(&vpcs, &[], &BTreeMap::new(), "n1");
        assert!(t.vnis.is_empty());
        assert!(matches!(
            t.diagnostics.as_slice(),
            [VpcDiagnostic::DuplicateVni { vni: 100, .. }]
        ));
    }
}

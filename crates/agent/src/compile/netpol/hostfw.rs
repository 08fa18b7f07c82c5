//! HostFirewall (`sdn.cozystack.io`, cluster-scoped, operator-only)
//! compiled for this node into the host's rules (`bpf/hostfw.h`,
//! `docs/policy.md`, "Host firewall"), beside the Cilium host policies
//! (cilium.rs), and the safe defaults every host policy gets.
//!
//! A HostFirewall whose `nodeSelector` selects this node (none: every node)
//! isolates the node for its policy types (`Ingress` by default, plus
//! `Egress` when it has egress rules) and admits what its rules admit:
//! peers by CIDR with `except` (none: any peer), ports by number or range
//! of any length (`endPort`), protocols TCP (the default), UDP and SCTP
//! (none: every protocol and port). Firewalls add up.
//!
//! Safe defaults, so a firewall never locks the node out of its cluster:
//! the datapath exempts the other nodes, ICMP and the node's own flows into
//! its pods; the compile admits the API server's addresses both ways.

use cozyplane_api::sdn::{HostFirewallPeer, HostFirewallPort};
use cozyplane_api::selector::selector_matches;
use cozyplane_api::HostFirewall;
use ipnet::IpNet;

use super::{proto_of, Compiled, NpDiagnostic, NpHosts, Peer, PortSpec, Rule, World};

/// Appends every HostFirewall selecting this node, then the safe defaults
/// when anything (a HostFirewall or a Cilium host policy) governs the node.
pub(super) fn compile(
    world: &World<'_>,
    firewalls: &[HostFirewall],
    hosts: &NpHosts,
    out: &mut Vec<Compiled>,
    diags: &mut Vec<NpDiagnostic>,
) {
    for f in firewalls {
        let policy = format!(
            "HostFirewall {}",
            f.metadata.name.as_deref().unwrap_or_default()
        );
        let selected = match &f.spec.node_selector {
            None => true,
            Some(sel) => match selector_matches(sel, &hosts.node_labels) {
                Ok(m) => m,
                Err(e) => {
                    diags.push(NpDiagnostic::BadSelector {
                        policy: policy.clone(),
                        what: "nodeSelector",
                        error: e.to_string(),
                    });
                    false
                }
            },
        };
        if !selected {
            continue;
        }
        let spec = &f.spec;
        let (ing, eg) = if spec.policy_types.is_empty() {
            (true, !spec.egress.is_empty())
        } else {
            (
                spec.policy_types.iter().any(|t| t == "Ingress"),
                spec.policy_types.iter().any(|t| t == "Egress"),
            )
        };
        let ingress = spec
            .ingress
            .iter()
            .map(|r| rule(&r.from, &r.ports, &policy, diags))
            .collect();
        let egress = spec
            .egress
            .iter()
            .map(|r| rule(&r.to, &r.ports, &policy, diags))
            .collect();
        out.push(Compiled {
            name: policy,
            host: true,
            ingress: ing.then_some(ingress),
            egress: eg.then_some(egress),
            ..Compiled::default()
        });
    }
    if out.iter().any(|c| c.host) && !world.apiserver.is_empty() {
        let api = || Rule {
            peers: vec![Peer::Hosts {
                entity: "kube-apiserver",
                addrs: world.apiserver.clone(),
                ingress_only: false,
            }],
            ports: vec![PortSpec::Any],
        };
        out.push(Compiled {
            name: "host firewall safe defaults".into(),
            host: true,
            ingress: Some(vec![api()]),
            egress: Some(vec![api()]),
            open: [true, true],
            ..Compiled::default()
        });
    }
}

fn rule(
    peers: &[HostFirewallPeer],
    ports: &[HostFirewallPort],
    policy: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Rule {
    let peers = if peers.is_empty() {
        vec![Peer::Any]
    } else {
        peers
            .iter()
            .filter_map(|p| {
                let parse = |s: &str| s.parse::<IpNet>().map(|n| n.trunc()).ok();
                let net = parse(&p.cidr);
                let except: Option<Vec<IpNet>> = p.except.iter().map(|e| parse(e)).collect();
                match (net, except) {
                    (Some(net), Some(except)) => Some(Peer::Block(net, except)),
                    _ => {
                        diags.push(NpDiagnostic::BadCidr {
                            policy: policy.to_string(),
                            cidr: format!("{} except {:?}", p.cidr, p.except),
                        });
                        None
                    }
                }
            })
            .collect()
    };
    let ports = if ports.is_empty() {
        vec![PortSpec::Any]
    } else {
        ports
            .iter()
            .filter_map(|p| {
                let spec = port(p);
                if spec.is_none() {
                    diags.push(NpDiagnostic::BadPort {
                        policy: policy.to_string(),
                        port: format!(
                            "{}/{:?}-{:?}",
                            p.protocol.as_deref().unwrap_or("TCP"),
                            p.port,
                            p.end_port
                        ),
                    });
                }
                spec
            })
            .collect()
    };
    Rule { peers, ports }
}

fn port(p: &HostFirewallPort) -> Option<PortSpec> {
    let proto = proto_of(p.protocol.as_deref())?;
    match (p.port, p.end_port) {
        (None, None) | (Some(0), None) => Some(PortSpec::Proto(proto)),
        (None, Some(_)) => None,
        (Some(lo), end) => {
            let lo = u16::try_from(lo).ok().filter(|n| *n > 0)?;
            let hi = match end {
                None => lo,
                Some(e) => u16::try_from(e).ok()?,
            };
            (lo <= hi).then_some(PortSpec::Range(proto, lo, hi))
        }
    }
}

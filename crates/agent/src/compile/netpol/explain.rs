//! Which policy decided: for one subject (a pod, or a node itself), one
//! direction, one peer, protocol and port, what the compiled maps answer —
//! evaluated with the datapath's own lookups (identity, any peer, the
//! longest CIDR class; LPM over protocol and port bits; deny rules first) —
//! and, compiling each policy object alone, which objects isolate the
//! subject, which admit the flow and which deny it (`cozyplane policy
//! explain`, `docs/policy.md`).

use std::net::IpAddr;

use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};
use cozyplane_api::HostFirewall;
use cozyplane_datapath::abi::{
    np_ep_key, np_host_key, Addr128, EpKey, NpEp, NpRule, NP_F_DENY_IN, NP_F_DENY_OUT,
    NP_F_ISOLATED_IN, NP_F_ISOLATED_OUT, NP_INGRESS, NP_PEER_ANY, NP_PEER_CIDR, NP_RULE_FIXED_BITS,
};
use cozyplane_datapath::netpol::{NpDesired, Prefixed};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::{compile_policies, NpHosts, NpMember, PolicyInput};

/// Whose side of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// The pod with this address.
    Pod(IpAddr),
    /// The node itself (its host firewall).
    Host,
}

/// What the maps answer for one subject, direction, peer and port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The subject is isolated for the direction.
    pub isolated: bool,
    /// An allow rule matches.
    pub admitted: bool,
    /// A deny rule matches.
    pub denied: bool,
}

impl Lookup {
    /// The verdict on a new flow: no deny, and not isolated or admitted.
    pub fn passes(&self) -> bool {
        !self.denied && (!self.isolated || self.admitted)
    }
}

/// One side of a flow, explained.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SideExplanation {
    /// `ingress` or `egress`.
    pub direction: &'static str,
    /// The verdict of all policies together.
    pub admitted: bool,
    /// The objects that isolate the subject for the direction.
    pub isolated_by: Vec<String>,
    /// The objects whose rules admit the flow.
    pub admitted_by: Vec<String>,
    /// The objects whose deny rules refuse it.
    pub denied_by: Vec<String>,
}

/// The datapath's answer from `d` for `subject`'s `dir` flow with `peer`.
pub fn lookup(
    d: &NpDesired,
    subject: &EpKey,
    peer: IpAddr,
    dir: u8,
    proto: u8,
    port: u16,
) -> Lookup {
    let Some(ep) = d.eps.get(subject) else {
        return Lookup::default();
    };
    let (iso, deny) = if dir == NP_INGRESS {
        (NP_F_ISOLATED_IN, NP_F_DENY_IN)
    } else {
        (NP_F_ISOLATED_OUT, NP_F_DENY_OUT)
    };
    Lookup {
        isolated: ep.flags & iso != 0,
        admitted: ep.flags & iso != 0 && matches(d, &d.rules, ep, peer, dir, proto, port),
        denied: ep.flags & deny != 0 && matches(d, &d.deny, ep, peer, dir, proto, port),
    }
}

/// Does an LPM rule key match `proto`/`port`?
fn key_matches(k: &Prefixed<NpRule>, proto: u8, port: u16) -> bool {
    let bits = k.prefix_len.saturating_sub(NP_RULE_FIXED_BITS);
    match bits {
        0 => true,
        1..=8 => k.data.proto == proto,
        _ => {
            let n = bits.saturating_sub(16).min(16);
            let mask = if n == 0 { 0 } else { u16::MAX << (16 - n) };
            k.data.proto == proto && (port & mask) == (u16::from_be_bytes(k.data.port) & mask)
        }
    }
}

fn matches(
    d: &NpDesired,
    map: &cozyplane_datapath::sorted::SortedMap<Prefixed<NpRule>, u32>,
    ep: &NpEp,
    peer: IpAddr,
    dir: u8,
    proto: u8,
    port: u16,
) -> bool {
    let port = if matches!(proto, 6 | 17 | 132) {
        port
    } else {
        0
    };
    let rule = |peer_id: u32| {
        map.keys().any(|k| {
            k.data.subject == ep.id
                && k.data.dir == dir
                && k.data.peer == peer_id
                && key_matches(k, proto, port)
        })
    };
    if let Some(p) = d.eps.get(&np_ep_key(peer)).filter(|p| p.id != 0) {
        if rule(p.id) {
            return true;
        }
    }
    if rule(NP_PEER_ANY) {
        return true;
    }
    let addr = u128::from_be_bytes(Addr128::from(peer).0);
    let class = d
        .cidrs
        .iter()
        .filter(|(k, _)| k.data.subject == ep.id && k.data.dir == dir)
        .filter(|(k, _)| {
            let len = k.prefix_len.saturating_sub(64);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            addr & mask == u128::from_be_bytes(k.data.addr.0) & mask
        })
        .max_by_key(|(k, _)| k.prefix_len)
        .map(|(_, class)| *class);
    class.is_some_and(|class| rule(NP_PEER_CIDR | class))
}

/// Explains `subject`'s `dir` side of a new flow with `peer` on
/// `proto`/`port`. `members` are every pod; the subject is made the only
/// local one. The verdict is the compile of everything together (as the
/// node's agent compiles it); the attribution compiles each object alone.
#[allow(clippy::too_many_arguments)]
pub fn explain(
    input: PolicyInput<'_>,
    members: &[NpMember],
    namespaces: &[Namespace],
    hosts: &NpHosts,
    subject: Subject,
    peer: IpAddr,
    dir: u8,
    proto: u8,
    port: u16,
) -> SideExplanation {
    let members: Vec<NpMember> = members
        .iter()
        .map(|m| NpMember {
            local: subject == Subject::Pod(m.ip),
            ..m.clone()
        })
        .collect();
    let key = match subject {
        Subject::Pod(ip) => np_ep_key(ip),
        Subject::Host => np_host_key(),
    };
    let of = |input: PolicyInput<'_>| {
        let c = compile_policies(input, &members, namespaces, hosts);
        lookup(&c.desired, &key, peer, dir, proto, port)
    };
    let mut out = SideExplanation {
        direction: if dir == NP_INGRESS {
            "ingress"
        } else {
            "egress"
        },
        admitted: of(input).passes(),
        ..SideExplanation::default()
    };
    let mut attribute = |name: String, l: Lookup| {
        if l.isolated {
            out.isolated_by.push(name.clone());
        }
        if l.admitted {
            out.admitted_by.push(name.clone());
        }
        if l.denied {
            out.denied_by.push(name);
        }
    };
    let none = PolicyInput::default();
    for p in input.network_policies {
        let one: &[NetworkPolicy] = std::slice::from_ref(p);
        let l = of(PolicyInput {
            network_policies: one,
            ..none
        });
        attribute(format!("NetworkPolicy {}", super::policy_name(p)), l);
    }
    for p in input.cilium {
        let one: &[CiliumNetworkPolicy] = std::slice::from_ref(p);
        let l = of(PolicyInput {
            cilium: one,
            ..none
        });
        let m = &p.metadata;
        attribute(
            format!(
                "CiliumNetworkPolicy {}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            ),
            l,
        );
    }
    for p in input.cilium_clusterwide {
        let one: &[CiliumClusterwideNetworkPolicy] = std::slice::from_ref(p);
        let l = of(PolicyInput {
            cilium_clusterwide: one,
            ..none
        });
        attribute(
            format!(
                "CiliumClusterwideNetworkPolicy {}",
                p.metadata.name.as_deref().unwrap_or_default()
            ),
            l,
        );
    }
    for p in input.host_firewalls {
        let one: &[HostFirewall] = std::slice::from_ref(p);
        let l = of(PolicyInput {
            host_firewalls: one,
            ..none
        });
        attribute(
            format!(
                "HostFirewall {}",
                p.metadata.name.as_deref().unwrap_or_default()
            ),
            l,
        );
    }
    out
}

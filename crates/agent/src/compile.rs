//! The default network's topology compiler: a pure function from the
//! watched objects (Nodes, FabricIPs) and this node's name to the entries
//! the overlay maps must hold.
//!
//! * `remotes`, net 0: every pod address claimed by a FabricIP on *another*
//!   node → that node's tunnel endpoint. This node's own pods are local
//!   (the CNI handler writes them into `locals`), never remotes.
//! * `node_remotes`: every address of every other node (InternalIP,
//!   ExternalIP, and the `cozyplane.io/node-addresses` annotation the agents
//!   publish for multi-NIC nodes) → that node's tunnel endpoint, so pod →
//!   node traffic is encapsulated and the underlay only carries node-sourced
//!   packets.
//!
//! * `vteps`: every other node's tunnel endpoint, the outer sources the
//!   overlay accepts decapsulated packets from (the datapath drops the
//!   rest, and only learns remote pods from these senders).
//!
//! Who owns an address (`node_remotes`): the Node *status* (InternalIP,
//! ExternalIP, written by the kubelet or the cloud provider) beats the
//! annotation, which any node can write about itself. An address one node
//! reports in its status and others only annotate stays with the status
//! node; an address two nodes report with equal standing (both in their
//! status, or both only in their annotation) goes to neither. Every such
//! contest is a [`Diagnostic::AddressConflict`] (the agent logs it and
//! counts it in `cozyplane_node_address_conflicts`), never resolved by name
//! order: a node must not be able to divert pod → node traffic for another
//! node's address by annotating it.
//!
//! A node's tunnel endpoint is its first IPv4 InternalIP, else the first
//! IPv4 address of its annotation that it owns. The output uses `BTreeMap`s so the same
//! input always yields the same entries in the same order: the sync's diffs
//! are stable and the compiler can be re-run from scratch on every event.
//! Anything that cannot be compiled (a node without an endpoint, a claim on
//! an unknown node, an address two nodes both report) is skipped and
//! reported as a [`Diagnostic`] rather than failing the whole compile: one
//! bad object must not take the other pods' routes down.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use cozyplane_api::labels::ANNOTATION_NODE_ADDRESSES;
use cozyplane_api::FabricIP;
use k8s_openapi::api::core::v1::Node;

use crate::desired::{RemoteKey, TunnelEndpoint, NET_DEFAULT};
use crate::ipam::claim_address;

/// Something the compiler skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Diagnostic {
    /// A node has no IPv4 address to use as its tunnel endpoint.
    NodeWithoutEndpoint {
        /// The node.
        node: String,
    },
    /// A node reports something that is not an IP address.
    BadNodeAddress {
        /// The node.
        node: String,
        /// The offending value.
        value: String,
    },
    /// A FabricIP's name and address disagree, or neither is an address.
    MalformedClaim {
        /// The claim name.
        claim: String,
    },
    /// A FabricIP names no node, or a node that is unknown or has no endpoint.
    ClaimOnUnknownNode {
        /// The claim name.
        claim: String,
        /// The node it names, if any.
        node: Option<String>,
    },
    /// Several nodes report the same address. A node that reports it in its
    /// status keeps it over nodes that only annotate it; with no such single
    /// node, nobody gets it.
    AddressConflict {
        /// The address.
        address: IpAddr,
        /// The node that reports it in its status, if exactly one does.
        kept: Option<String>,
        /// The nodes whose claims were dropped, sorted.
        dropped: Vec<String>,
    },
}

impl Diagnostic {
    /// Whether this is a contest between nodes over an address.
    pub fn is_address_conflict(&self) -> bool {
        matches!(self, Diagnostic::AddressConflict { .. })
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnostic::NodeWithoutEndpoint { node } => {
                write!(
                    f,
                    "node {node} has no IPv4 InternalIP or node-addresses entry to tunnel to"
                )
            }
            Diagnostic::BadNodeAddress { node, value } => {
                write!(f, "node {node}: {value:?} is not an IP address")
            }
            Diagnostic::MalformedClaim { claim } => {
                write!(
                    f,
                    "FabricIP {claim}: name and spec.address do not name one address"
                )
            }
            Diagnostic::ClaimOnUnknownNode { claim, node } => match node {
                Some(n) => write!(
                    f,
                    "FabricIP {claim}: node {n} is unknown or has no tunnel endpoint"
                ),
                None => write!(f, "FabricIP {claim}: spec.node is empty"),
            },
            Diagnostic::AddressConflict {
                address,
                kept: Some(kept),
                dropped,
            } => write!(
                f,
                "node {kept} reports {address} in its status, and {} claim it through \
                 {ANNOTATION_NODE_ADDRESSES}: kept {kept}",
                dropped.join(", ")
            ),
            Diagnostic::AddressConflict {
                address,
                kept: None,
                dropped,
            } => write!(
                f,
                "nodes {} all report {address}: routed to none of them",
                dropped.join(", ")
            ),
        }
    }
}

/// Where a node reports an address; `Status` ranks above `Annotation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AddressSource {
    /// Only the `cozyplane.io/node-addresses` annotation.
    Annotation,
    /// `status.addresses` (InternalIP or ExternalIP).
    Status,
}

/// What the compiler learns about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node name.
    pub name: String,
    /// Its first IPv4 InternalIP, the tunnel endpoint when it has one.
    pub internal_v4: Option<TunnelEndpoint>,
    /// Its annotation's IPv4 addresses in order, endpoint candidates
    /// without an InternalIP.
    pub annotated_v4: Vec<TunnelEndpoint>,
    /// Every address it reports (both families), with the best source.
    pub addresses: BTreeMap<IpAddr, AddressSource>,
}

/// Reads a Node's addresses and tunnel endpoint candidates.
pub fn node_info(node: &Node, diags: &mut Vec<Diagnostic>) -> NodeInfo {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut addresses = BTreeMap::new();
    let mut internal_v4 = None;
    let mut annotated_v4 = Vec::new();
    let status_addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    for a in status_addrs {
        if a.type_ != "InternalIP" && a.type_ != "ExternalIP" {
            continue; // Hostname, InternalDNS, ExternalDNS
        }
        match a.address.trim().parse::<IpAddr>() {
            Ok(ip) => {
                addresses.insert(ip, AddressSource::Status);
                if let (IpAddr::V4(v4), "InternalIP", None) = (ip, a.type_.as_str(), internal_v4) {
                    internal_v4 = Some(TunnelEndpoint(v4));
                }
            }
            Err(_) => diags.push(Diagnostic::BadNodeAddress {
                node: name.clone(),
                value: a.address.clone(),
            }),
        }
    }
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_NODE_ADDRESSES));
    for value in annotation
        .into_iter()
        .flat_map(|v| v.split([',', ' ', '\n', '\t']))
        .filter(|v| !v.is_empty())
    {
        match value.parse::<IpAddr>() {
            Ok(ip) => {
                addresses.entry(ip).or_insert(AddressSource::Annotation);
                if let IpAddr::V4(v4) = ip {
                    annotated_v4.push(TunnelEndpoint(v4));
                }
            }
            Err(_) => diags.push(Diagnostic::BadNodeAddress {
                node: name.clone(),
                value: value.to_string(),
            }),
        }
    }
    NodeInfo {
        name,
        internal_v4,
        annotated_v4,
        addresses,
    }
}

/// Decides which node owns each reported address: the only node reporting
/// it, else the only node reporting it in its status, else none. Every
/// contest is reported. `infos` is sorted by name.
fn address_owners<'a>(
    infos: &'a [NodeInfo],
    diags: &mut Vec<Diagnostic>,
) -> BTreeMap<IpAddr, &'a str> {
    let mut claims: BTreeMap<IpAddr, Vec<(&str, AddressSource)>> = BTreeMap::new();
    for info in infos {
        for (addr, source) in &info.addresses {
            claims
                .entry(*addr)
                .or_default()
                .push((info.name.as_str(), *source));
        }
    }
    let mut owners = BTreeMap::new();
    for (addr, claimants) in claims {
        if let [(only, _)] = claimants.as_slice() {
            owners.insert(addr, *only);
            continue;
        }
        let in_status: Vec<&str> = claimants
            .iter()
            .filter(|(_, s)| *s == AddressSource::Status)
            .map(|(n, _)| *n)
            .collect();
        let kept = match in_status.as_slice() {
            [owner] => Some(*owner),
            _ => None,
        };
        if let Some(owner) = kept {
            owners.insert(addr, owner);
        }
        diags.push(Diagnostic::AddressConflict {
            address: addr,
            kept: kept.map(str::to_string),
            dropped: claimants
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| Some(*n) != kept)
                .map(str::to_string)
                .collect(),
        });
    }
    owners
}

/// The desired overlay entries for one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// `remotes` entries at net 0: remote pod → owning node's endpoint.
    pub remotes: BTreeMap<RemoteKey, TunnelEndpoint>,
    /// `node_remotes`: other node's address → its endpoint.
    pub node_remotes: BTreeMap<IpAddr, TunnelEndpoint>,
    /// `vteps`: every other node's tunnel endpoint (never this node's own).
    pub vteps: BTreeSet<TunnelEndpoint>,
    /// Every node's tunnel endpoint, this node's included (the VPC compiler
    /// places Ports with it).
    pub endpoints: BTreeMap<String, TunnelEndpoint>,
    /// What was skipped, sorted.
    pub diagnostics: Vec<Diagnostic>,
}

/// Compiles the default network's topology as seen from `this_node`.
///
/// `fabric_ips` as owned objects or as the watch store shares them (`Arc`).
pub fn compile<F: Borrow<FabricIP>>(nodes: &[Node], fabric_ips: &[F], this_node: &str) -> Topology {
    let mut diagnostics = Vec::new();
    let mut infos: Vec<NodeInfo> = nodes
        .iter()
        .map(|n| node_info(n, &mut diagnostics))
        .collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));

    let owners = address_owners(&infos, &mut diagnostics);

    // The endpoint: the first IPv4 InternalIP, else the first annotated IPv4
    // address the node owns (an annotation cannot borrow another node's).
    let mut endpoints: BTreeMap<&str, TunnelEndpoint> = BTreeMap::new();
    for info in &infos {
        let owned = |ep: &TunnelEndpoint| {
            owners.get(&IpAddr::V4(ep.0)).copied() == Some(info.name.as_str())
        };
        let endpoint = info
            .internal_v4
            .or_else(|| info.annotated_v4.iter().copied().find(owned));
        match endpoint {
            Some(ep) => {
                endpoints.insert(info.name.as_str(), ep);
            }
            None => diagnostics.push(Diagnostic::NodeWithoutEndpoint {
                node: info.name.clone(),
            }),
        }
    }

    // vteps: a node that reports this node's own endpoint (a stale or
    // misconfigured object) must not make it a trusted sender.
    let own_endpoint = endpoints.get(this_node).copied();
    let vteps: BTreeSet<TunnelEndpoint> = endpoints
        .iter()
        .filter(|(name, ep)| **name != this_node && Some(**ep) != own_endpoint)
        .map(|(_, ep)| *ep)
        .collect();

    // node_remotes: every address another node owns (address_owners), to
    // its endpoint. This node's own addresses are added by the sync from the
    // kernel, never from what other nodes say.
    let node_remotes: BTreeMap<IpAddr, TunnelEndpoint> = owners
        .iter()
        .filter(|(_, owner)| **owner != this_node)
        .filter_map(|(addr, owner)| endpoints.get(owner).map(|ep| (*addr, *ep)))
        .collect();

    let mut remotes = BTreeMap::new();
    for fip in fabric_ips {
        let fip: &FabricIP = fip.borrow();
        let claim = fip.metadata.name.clone().unwrap_or_default();
        let Some(addr) = claim_address(fip) else {
            diagnostics.push(Diagnostic::MalformedClaim { claim });
            continue;
        };
        let node = fip.spec.node.as_deref().filter(|n| !n.is_empty());
        if node == Some(this_node) {
            continue; // our own pod: a local, not a remote
        }
        match node.and_then(|n| endpoints.get(n)) {
            Some(ep) => {
                remotes.insert(RemoteKey::host(NET_DEFAULT, addr), *ep);
            }
            None => diagnostics.push(Diagnostic::ClaimOnUnknownNode {
                claim,
                node: node.map(str::to_string),
            }),
        }
    }

    diagnostics.sort();
    Topology {
        remotes,
        node_remotes,
        vteps,
        endpoints: endpoints
            .into_iter()
            .map(|(n, ep)| (n.to_string(), ep))
            .collect(),
        diagnostics,
    }
}

pub mod netpol;
pub mod security_groups;
pub mod services;
pub mod vpc;

#[cfg(test)]
mod tests;

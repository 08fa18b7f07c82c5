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
//! A node's tunnel endpoint is its first IPv4 InternalIP, else the first
//! IPv4 address of its annotation. The output uses `BTreeMap`s so the same
//! input always yields the same entries in the same order: the sync's diffs
//! are stable and the compiler can be re-run from scratch on every event.
//! Anything that cannot be compiled (a node without an endpoint, a claim on
//! an unknown node, an address two nodes both report) is skipped and
//! reported as a [`Diagnostic`] rather than failing the whole compile: one
//! bad object must not take the other pods' routes down.

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
    /// Two other nodes report the same address; the first by name wins.
    AddressConflict {
        /// The address.
        address: IpAddr,
        /// The node whose entry was kept.
        kept: String,
        /// The node whose entry was dropped.
        dropped: String,
    },
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
                kept,
                dropped,
            } => write!(
                f,
                "nodes {kept} and {dropped} both report {address}; kept {kept}"
            ),
        }
    }
}

/// What the compiler learns about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node name.
    pub name: String,
    /// Its tunnel endpoint, if it has one.
    pub endpoint: Option<TunnelEndpoint>,
    /// Every address it reports (both families).
    pub addresses: BTreeSet<IpAddr>,
}

/// Reads a Node's addresses and tunnel endpoint.
pub fn node_info(node: &Node, diags: &mut Vec<Diagnostic>) -> NodeInfo {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut addresses = BTreeSet::new();
    let mut internal_v4 = None;
    let mut annotated_v4 = None;
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
                addresses.insert(ip);
                if let (IpAddr::V4(v4), "InternalIP", None) = (ip, a.type_.as_str(), internal_v4) {
                    internal_v4 = Some(v4);
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
                addresses.insert(ip);
                if let (IpAddr::V4(v4), None) = (ip, annotated_v4) {
                    annotated_v4 = Some(v4);
                }
            }
            Err(_) => diags.push(Diagnostic::BadNodeAddress {
                node: name.clone(),
                value: value.to_string(),
            }),
        }
    }
    let endpoint = internal_v4.or(annotated_v4).map(TunnelEndpoint);
    if endpoint.is_none() {
        diags.push(Diagnostic::NodeWithoutEndpoint { node: name.clone() });
    }
    NodeInfo {
        name,
        endpoint,
        addresses,
    }
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
    /// What was skipped, sorted.
    pub diagnostics: Vec<Diagnostic>,
}

/// Compiles the default network's topology as seen from `this_node`.
pub fn compile(nodes: &[Node], fabric_ips: &[FabricIP], this_node: &str) -> Topology {
    let mut diagnostics = Vec::new();
    let mut infos: Vec<NodeInfo> = nodes
        .iter()
        .map(|n| node_info(n, &mut diagnostics))
        .collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));

    let own_addresses: BTreeSet<IpAddr> = infos
        .iter()
        .filter(|n| n.name == this_node)
        .flat_map(|n| n.addresses.iter().copied())
        .collect();
    let endpoints: BTreeMap<&str, TunnelEndpoint> = infos
        .iter()
        .filter_map(|n| n.endpoint.map(|e| (n.name.as_str(), e)))
        .collect();

    // vteps: a node that reports this node's own endpoint (a stale or
    // misconfigured object) must not make it a trusted sender.
    let own_endpoint = endpoints.get(this_node).copied();
    let vteps: BTreeSet<TunnelEndpoint> = endpoints
        .iter()
        .filter(|(name, ep)| **name != this_node && Some(**ep) != own_endpoint)
        .map(|(_, ep)| *ep)
        .collect();

    // node_remotes: first node by name wins a contested address.
    let mut node_remotes = BTreeMap::new();
    let mut holder: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for info in infos.iter().filter(|n| n.name != this_node) {
        let Some(ep) = info.endpoint else { continue };
        for addr in info.addresses.iter().filter(|a| !own_addresses.contains(a)) {
            match holder.get(addr) {
                Some(kept) => diagnostics.push(Diagnostic::AddressConflict {
                    address: *addr,
                    kept: (*kept).to_string(),
                    dropped: info.name.clone(),
                }),
                None => {
                    holder.insert(*addr, &info.name);
                    node_remotes.insert(*addr, ep);
                }
            }
        }
    }

    let mut remotes = BTreeMap::new();
    for fip in fabric_ips {
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
        diagnostics,
    }
}

#[cfg(test)]
mod tests;

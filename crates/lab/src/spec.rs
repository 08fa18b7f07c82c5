//! What a topology should look like ([`TopologySpec`]) and the names and addresses it
//! turns into ([`Plan`]), computed and checked before anything is made.
//!
//! # Naming
//!
//! The topology name *is* its prefix: 1–10 characters, `[a-z][a-z0-9]*`. It has no `-`,
//! so `<name>-` identifies one topology exactly (`lab1` never matches `lab10-…`), and
//! it is short enough that every interface name stays within the kernel's 15 bytes.
//!
//! | resource | name |
//! |---|---|
//! | fabric namespace (bridge + router) | `<name>-fabric` |
//! | node namespace *i* (1-based) | `<name>-node<i>` (also the node's Kubernetes name) |
//! | external host namespace | `<name>-ext` |
//! | underlay bridge (in the fabric) | `<name>-br` |
//! | fabric end of node *i*'s veth | `<name>-n<i>` |
//! | fabric end of the external host's veth | `<name>-ext` |
//! | node / external end of its veth | `eth0` (inside its own namespace) |
//! | run directory with `state.json` | `/run/cozyplane-lab/<name>/` |
//!
//! # Addressing plan
//!
//! Defaults come from `198.18.0.0/15`, the RFC 2544 benchmarking range, which no real
//! network routes. Nothing of the lab is in the host's namespace, so the ranges cannot
//! clash with the host's own networks in any case (the host has no route to them and
//! the lab none to the host), and two topologies may even use the same ranges.
//!
//! * underlay (default `198.18.0.0/24`): the fabric router is the first address
//!   (`.1`, on the bridge); `.2`–`.10` are reserved for lab services (an API server the
//!   nodes reach, say: see [`crate::Topology::add_service_address`]); node *i* is
//!   `.10 + i` (`.11`, `.12`, …), default route via the router.
//! * external network (default `198.19.0.0/24`): a separate segment behind the fabric
//!   router: router `.1`, external host `.2`. The external host has **one** route, to
//!   the underlay via the router, and no default route, so it can answer nodes (and
//!   masqueraded pod traffic, which carries a node address) but never pod addresses:
//!   an un-masqueraded pod packet gets no reply. Nodes reach it through their default
//!   route, as a real node reaches the outside world through its gateway.
//! * the fabric namespace forwards between the two (`ip_forward=1`) and has no other
//!   routes: anything outside the two networks is unreachable from everywhere in the
//!   lab.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;

use cozyplane_datapath::netlink::IpPrefix;
use ipnet::{IpNet, Ipv4Net};

use crate::error::{LabError, Result};

/// Longest topology name: leaves room for `-n99` within the 15-byte interface names.
pub const MAX_NAME_LEN: usize = 10;
/// Most nodes a topology may have (interface names carry a two-digit index at most).
pub const MAX_NODES: usize = 99;
/// Where run directories (one per topology, holding `state.json`) live.
pub const RUN_ROOT: &str = "/run/cozyplane-lab";
/// Interface name of the underlay link inside every node and the external host.
pub const UNDERLAY_IFNAME: &str = "eth0";
/// Host offset of node 1 in the underlay (node *i* is `network + NODE_OFFSET + i - 1`);
/// the addresses below it are the router's and the reserved lab services'.
pub const NODE_OFFSET: u32 = 11;
/// Number of reserved lab service addresses (`.2`–`.10` of the underlay), slots 1–9.
pub const SERVICE_SLOTS: u32 = NODE_OFFSET - 2;
/// Smallest MTU accepted (the IPv6 minimum, so dual-stack can come later).
pub const MIN_MTU: u32 = 1280;
/// Largest MTU accepted (what veth and bridge support).
pub const MAX_MTU: u32 = 65535;

/// Checks a topology name (= prefix): see the module docs for why these rules.
pub fn validate_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(LabError::InvalidSpec(format!(
            "name {name:?}: want 1-{MAX_NAME_LEN} characters, a lowercase letter then \
             lowercase letters or digits (it prefixes every resource name)"
        )))
    }
}

/// True if `resource` (a namespace, link or directory name) belongs to topology `name`.
pub fn carries_prefix(resource: &str, name: &str) -> bool {
    resource
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

/// An IPv4 network: an address with its host bits clear and a prefix length. A thin
/// newtype over [`Ipv4Net`] that refuses host bits (a likely typo in a spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr(Ipv4Net);

impl Ipv4Cidr {
    /// A network; fails if `len > 32` or host bits are set (a likely typo).
    pub fn new(network: Ipv4Addr, len: u8) -> Result<Ipv4Cidr> {
        let net = Ipv4Net::new(network, len).map_err(|_| {
            LabError::InvalidSpec(format!("{network}/{len}: prefix length above 32"))
        })?;
        if net.trunc() != net {
            return Err(LabError::InvalidSpec(format!(
                "{net}: host bits set (did you mean {}?)",
                net.trunc()
            )));
        }
        Ok(Ipv4Cidr(net))
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        self.0.network()
    }

    /// The prefix length.
    pub fn len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// True for `/0`… never useful here, but clippy wants the pair.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of addresses, network and broadcast included.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.len()))
    }

    /// The `n`-th address (`0` is the network address), if it is a usable host address
    /// (not the network or broadcast address).
    pub fn host(&self, n: u32) -> Option<Ipv4Addr> {
        if n == 0 || u64::from(n) >= self.size().saturating_sub(1) {
            return None;
        }
        Some(Ipv4Addr::from(u32::from(self.network()) + n))
    }

    /// True if `ip` is inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.contains(&ip)
    }

    /// True if the two networks share any address.
    pub fn overlaps(&self, other: &Ipv4Cidr) -> bool {
        self.0.contains(&other.0) || other.0.contains(&self.0)
    }

    /// `ip` with this network's prefix length, as an interface address.
    pub fn with_len(&self, ip: Ipv4Addr) -> IpPrefix {
        // A v4 address with a length ≤ 32 (checked in `new`) is always a valid prefix.
        IpPrefix::new(ip.into(), self.len()).unwrap_or_else(|_| IpPrefix::host(ip.into()))
    }

    /// The network itself as a route destination.
    pub fn as_prefix(&self) -> IpPrefix {
        IpPrefix::from(IpNet::V4(self.0))
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = LabError;

    /// Reads the address with the standard library (ipnet's own parser takes
    /// `010.1.0.0` as decimal, where other tools read octal).
    fn from_str(s: &str) -> Result<Ipv4Cidr> {
        let bad = |why: &str| LabError::InvalidSpec(format!("CIDR {s:?}: {why}"));
        let (a, l) = s.split_once('/').ok_or_else(|| bad("want a.b.c.d/len"))?;
        Ipv4Cidr::new(
            a.parse().map_err(|_| bad("bad IPv4 address"))?,
            l.parse().map_err(|_| bad("bad prefix length"))?,
        )
    }
}

/// The default underlay, `198.18.0.0/24` (checked at compile time).
const DEFAULT_UNDERLAY: Ipv4Cidr = Ipv4Cidr(Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 24));
/// The default external network, `198.19.0.0/24`.
const DEFAULT_EXTERNAL_NET: Ipv4Cidr =
    Ipv4Cidr(Ipv4Net::new_assert(Ipv4Addr::new(198, 19, 0, 0), 24));

/// A declarative description of a lab topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologySpec {
    /// The topology name, which prefixes every resource (see the module docs).
    pub name: String,
    /// Number of node namespaces (1–99).
    pub nodes: usize,
    /// The underlay network shared by the fabric router and the nodes.
    pub underlay: Ipv4Cidr,
    /// Whether to build the external host.
    pub external: bool,
    /// The network between the fabric router and the external host.
    pub external_net: Ipv4Cidr,
    /// MTU of the bridge and every underlay link.
    pub mtu: u32,
    /// Parent of the per-topology run directory (default [`RUN_ROOT`]).
    pub run_root: PathBuf,
}

impl TopologySpec {
    /// The defaults: `nodes` nodes on `198.18.0.0/24`, an external host on
    /// `198.19.0.0/24`, MTU 1500.
    pub fn new(name: impl Into<String>, nodes: usize) -> TopologySpec {
        TopologySpec {
            name: name.into(),
            nodes,
            underlay: DEFAULT_UNDERLAY,
            external: true,
            external_net: DEFAULT_EXTERNAL_NET,
            mtu: 1500,
            run_root: PathBuf::from(RUN_ROOT),
        }
    }

    /// Checks the spec and computes every name and address.
    pub fn plan(&self) -> Result<Plan> {
        validate_name(&self.name)?;
        let invalid = |m: String| Err(LabError::InvalidSpec(m));
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return invalid(format!("nodes = {}: want 1-{MAX_NODES}", self.nodes));
        }
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return invalid(format!("mtu = {}: want {MIN_MTU}-{MAX_MTU}", self.mtu));
        }
        let router = self.underlay.host(1);
        let last = u32::try_from(self.nodes)
            .ok()
            .and_then(|n| self.underlay.host(NODE_OFFSET + n - 1));
        let (Some(router), Some(_)) = (router, last) else {
            return invalid(format!(
                "underlay {} is too small for the router, the reserved lab addresses and \
                 {} nodes (node 1 is host .{NODE_OFFSET})",
                self.underlay, self.nodes
            ));
        };
        let name = &self.name;
        let nodes = (1..=self.nodes)
            .zip(NODE_OFFSET..)
            .filter_map(|(i, host)| {
                Some(NodePlan {
                    name: format!("{name}-node{i}"),
                    index: i,
                    fabric_port: format!("{name}-n{i}"),
                    ip: self.underlay.host(host)?,
                })
            })
            .collect();
        let external = if self.external {
            if self.external_net.overlaps(&self.underlay) {
                return invalid(format!(
                    "external network {} overlaps the underlay {}",
                    self.external_net, self.underlay
                ));
            }
            let (Some(gateway), Some(ip)) = (self.external_net.host(1), self.external_net.host(2))
            else {
                return invalid(format!(
                    "external network {} needs room for two hosts (/30 or larger)",
                    self.external_net
                ));
            };
            Some(ExternalPlan {
                name: format!("{name}-ext"),
                fabric_port: format!("{name}-ext"),
                ip,
                gateway,
            })
        } else {
            None
        };
        Ok(Plan {
            name: name.clone(),
            fabric_netns: format!("{name}-fabric"),
            bridge: format!("{name}-br"),
            router,
            nodes,
            external,
            run_dir: self.run_root.join(name),
        })
    }
}

/// Every name and address of a topology, computed from a valid [`TopologySpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The topology name (prefix).
    pub name: String,
    /// The fabric namespace.
    pub fabric_netns: String,
    /// The underlay bridge (inside the fabric namespace).
    pub bridge: String,
    /// The fabric router's underlay address (nodes' default gateway).
    pub router: Ipv4Addr,
    /// The nodes, in order.
    pub nodes: Vec<NodePlan>,
    /// The external host, if any.
    pub external: Option<ExternalPlan>,
    /// The run directory (holds `state.json`).
    pub run_dir: PathBuf,
}

impl Plan {
    /// The reserved lab service address in `slot` (1–[`SERVICE_SLOTS`]): `.2` for slot 1.
    pub fn service_ip(&self, slot: u32) -> Option<Ipv4Addr> {
        if !(1..=SERVICE_SLOTS).contains(&slot) {
            return None;
        }
        Some(Ipv4Addr::from(u32::from(self.router) + slot))
    }

    /// Every namespace the topology consists of, fabric first.
    pub fn netns_names(&self) -> Vec<String> {
        let mut names = vec![self.fabric_netns.clone()];
        names.extend(self.nodes.iter().map(|n| n.name.clone()));
        names.extend(self.external.iter().map(|e| e.name.clone()));
        names
    }
}

/// One node's names and address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// Node name = its namespace name.
    pub name: String,
    /// 1-based index.
    pub index: usize,
    /// The fabric end of its veth.
    pub fabric_port: String,
    /// Its underlay address.
    pub ip: Ipv4Addr,
}

/// The external host's names and addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalPlan {
    /// Its namespace name.
    pub name: String,
    /// The fabric end of its veth (holds the gateway address).
    pub fabric_port: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The fabric router's address on the external network.
    pub gateway: Ipv4Addr,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cozyplane_datapath::netlink::validate_ifname;

    #[test]
    fn names_are_short_prefix_safe_and_unambiguous() {
        for ok in ["a", "lab", "cpl0", "abcdefghij"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1lab",
            "Lab",
            "la-b",
            "la_b",
            "abcdefghijk",
            "../x",
            "a b",
        ] {
            assert!(
                matches!(validate_name(bad), Err(LabError::InvalidSpec(_))),
                "{bad:?} accepted"
            );
        }
        assert!(carries_prefix("lab1-node3", "lab1"));
        assert!(carries_prefix("lab1", "lab1"));
        assert!(!carries_prefix("lab10-node3", "lab1"));
        assert!(!carries_prefix("lab", "lab1"));
        assert!(!carries_prefix("xlab1-node1", "lab1"));
    }

    #[test]
    fn default_plan_matches_the_documented_addressing() {
        let plan = TopologySpec::new("lab", 3).plan().unwrap();
        assert_eq!(plan.router, Ipv4Addr::new(198, 18, 0, 1));
        let ips: Vec<String> = plan.nodes.iter().map(|n| n.ip.to_string()).collect();
        assert_eq!(ips, ["198.18.0.11", "198.18.0.12", "198.18.0.13"]);
        let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["lab-node1", "lab-node2", "lab-node3"]);
        let ext = plan.external.clone().unwrap();
        assert_eq!(ext.ip, Ipv4Addr::new(198, 19, 0, 2));
        assert_eq!(ext.gateway, Ipv4Addr::new(198, 19, 0, 1));
        assert_eq!(
            plan.netns_names(),
            [
                "lab-fabric",
                "lab-node1",
                "lab-node2",
                "lab-node3",
                "lab-ext"
            ]
        );
        assert_eq!(plan.run_dir, PathBuf::from("/run/cozyplane-lab/lab"));
        assert_eq!(plan.service_ip(1), Some(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(plan.service_ip(9), Some(Ipv4Addr::new(198, 18, 0, 10)));
        assert_eq!(plan.service_ip(0), None);
        assert_eq!(plan.service_ip(10), None); // that is node 1
    }

    #[test]
    fn longest_names_still_fit_interface_names() {
        let plan = TopologySpec::new("abcdefghij", MAX_NODES).plan().unwrap();
        validate_ifname(&plan.bridge).unwrap();
        for n in &plan.nodes {
            validate_ifname(&n.fabric_port).unwrap();
        }
        validate_ifname(&plan.external.unwrap().fabric_port).unwrap();
        assert_eq!(plan.nodes.len(), MAX_NODES);
        assert_eq!(plan.nodes[98].ip, Ipv4Addr::new(198, 18, 0, 109));
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let check = |spec: TopologySpec, want: &str| {
            let err = spec.plan().unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        };
        check(TopologySpec::new("lab", 0), "nodes = 0");
        check(TopologySpec::new("lab", 100), "nodes = 100");
        let mut s = TopologySpec::new("lab", 3);
        s.mtu = 1000;
        check(s, "mtu = 1000");
        let mut s = TopologySpec::new("lab", 6);
        s.underlay = "10.0.0.0/28".parse().unwrap(); // hosts .1-.14: nodes up to .16 do not fit
        check(s, "too small");
        let mut s = TopologySpec::new("lab", 3);
        s.external_net = "198.18.0.128/25".parse().unwrap();
        check(s, "overlaps");
        let mut s = TopologySpec::new("lab", 3);
        s.external_net = "198.19.0.0/31".parse().unwrap();
        check(s, "two hosts");
        // Without an external host its network is irrelevant.
        let mut s = TopologySpec::new("lab", 3);
        s.external = false;
        s.external_net = s.underlay;
        assert!(s.plan().unwrap().external.is_none());
    }

    #[test]
    fn cidr_parsing_and_arithmetic() {
        let c: Ipv4Cidr = "10.1.0.0/16".parse().unwrap();
        assert_eq!(c.size(), 65536);
        assert_eq!(c.host(0), None);
        assert_eq!(c.host(65535), None); // broadcast
        assert_eq!(c.host(258), Some(Ipv4Addr::new(10, 1, 1, 2)));
        assert!(c.contains(Ipv4Addr::new(10, 1, 255, 255)));
        assert!(!c.contains(Ipv4Addr::new(10, 2, 0, 0)));
        assert!(c.overlaps(&"10.0.0.0/8".parse().unwrap()));
        assert!(!c.overlaps(&"10.2.0.0/16".parse().unwrap()));
        assert_eq!(
            c.with_len(Ipv4Addr::new(10, 1, 0, 9)).to_string(),
            "10.1.0.9/16"
        );
        for bad in [
            "10.1.0.1/16",
            "10.1.0.0",
            "10.1.0.0/33",
            "x/8",
            "10.1.0.0/x",
            "010.1.0.0/16",
        ] {
            assert!(bad.parse::<Ipv4Cidr>().is_err(), "{bad:?} accepted");
        }
        let err = "10.1.0.1/16".parse::<Ipv4Cidr>().unwrap_err().to_string();
        assert!(err.contains("did you mean 10.1.0.0/16"), "{err}");
    }
}

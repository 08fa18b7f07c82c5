//! The desired datapath entries as plain Rust values.
//!
//! The compiler produces these and the sync compares them with what the
//! kernel holds. They deliberately are *not* the datapath crate's
//! `#[repr(C)]` structs: this module is the single conversion seam. Mapping
//! onto the map ABI (`RemoteKey` → scoped LPM key with the address in
//! `addr128` form, [`TunnelEndpoint`] → `Remote`, [`LocalEndpoint`] →
//! `EpKey`/`Endpoint`) happens in one place, where the kernel-backed
//! `KernelMap` implementations are written, and nowhere else.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// Network id of the default (system) pod network.
pub const NET_DEFAULT: u32 = 0;

/// A key of the `remotes` map: an address prefix scoped by network id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RemoteKey {
    /// The network id (0: default network).
    pub net: u32,
    /// The address (network address of the prefix).
    pub addr: IpAddr,
    /// Prefix length in the address's own family (32 / 128 for one host).
    pub prefix_len: u8,
}

impl RemoteKey {
    /// The key of one host address on network `net`.
    pub fn host(net: u32, addr: IpAddr) -> Self {
        let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
        Self {
            net,
            addr,
            prefix_len,
        }
    }
}

impl fmt::Display for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "net {} {}/{}", self.net, self.addr, self.prefix_len)
    }
}

/// Where to send encapsulated traffic for a node: its tunnel endpoint. The
/// overlay's outer header is IPv4 (IPv6 inner rides IPv4 outer), so an
/// endpoint is always an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TunnelEndpoint(pub Ipv4Addr);

impl fmt::Display for TunnelEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Who vouches for a tunnel endpoint in the datapath's sender allow-list
/// (`cp_vteps`): decapsulated packets are accepted only from those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VtepOwner {
    /// A cluster node, from the compiled topology: the only kind the
    /// topology sync writes, replaces and prunes.
    Topology,
    /// Written by someone else (its raw flags); left alone.
    Other(u32),
}

/// A pod on this node as the datapath needs it (`ports` + `locals`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalEndpoint {
    /// Network id of the pod.
    pub net: u32,
    /// Host-side veth name.
    pub host_ifname: String,
    /// Host-side veth ifindex.
    pub host_ifindex: u32,
    /// The pod interface's MAC.
    pub pod_mac: [u8; 6],
    /// The pod's addresses on `net`.
    pub addresses: Vec<IpAddr>,
    /// A VPC pod's net-0 (fabric) addresses; empty on net 0. They are in
    /// `locals` at net 0 pointing at this veth, so a net-0 packet for them
    /// is handed to the destination gate, which refuses it (the port is on
    /// another net): only the node's own stack reaches the pod there,
    /// through the bridge.
    pub fabric: Vec<IpAddr>,
    /// Severed from its VPC: the port is quarantined and its VPC addresses
    /// are in no map.
    pub severed: bool,
}

impl LocalEndpoint {
    /// Every `locals` key of the endpoint: `{net, address}` for its
    /// addresses (none once severed), `{0, fabric}` for a VPC pod's fabric
    /// addresses.
    pub fn keys(&self) -> Vec<(u32, IpAddr)> {
        let own = if self.severed {
            &[][..]
        } else {
            &self.addresses[..]
        };
        let mut keys: Vec<(u32, IpAddr)> = own.iter().map(|a| (self.net, *a)).collect();
        if self.net != NET_DEFAULT {
            keys.extend(self.fabric.iter().map(|a| (NET_DEFAULT, *a)));
        }
        keys
    }
}

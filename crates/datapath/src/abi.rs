//! The map ABI: `#[repr(C)]` mirrors of the structs in `bpf/maps.h`,
//! `bpf/metrics.h` and `bpf/encap.h`.
//!
//! Byte-order contract (the same comment heads `bpf/maps.h`; tests lock it):
//! - addresses (every [`Addr128`], tunnel/node/masquerade IPv4) and L4 ports
//!   are the bytes as they appear on the wire (network order). They are typed
//!   as byte arrays here, so no integer byte-order mistake is possible;
//! - ifindexes, network ids, VNIs, flags, prefix lengths and configured port
//!   ranges are host-order integers.
//!
//! IPv4 addresses are stored in their RFC 6052 form `64:ff9b::a.b.c.d`, so
//! IPv6 and a future NAT64 slot in without a map ABI change.
//!
//! Everything here that restates `bpf/` (struct sizes and field offsets,
//! [`DropReason`], the constants, and `MAP_SPECS` in `datapath.rs`) is
//! compared with the compiled object by unprivileged tests
//! (`abi/object_check.rs`), and the C side asserts its layouts at compile
//! time, so a drift on either side fails the build or `cargo test` anywhere.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Network id of the default (system) pod network.
pub const NET_DEFAULT: u32 = 0;
/// VNI that carries the default network between nodes.
pub const VNI_DEFAULT: u32 = 1;
/// MAC of every node's overlay device; the encap path rewrites the inner
/// destination MAC to it so decapsulated frames are PACKET_HOST.
pub const OVERLAY_MAC: [u8; 6] = [0x02, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf];
/// IPv4 on-link gateway of every pod (answered by proxy_arp on the host veth).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// IPv6 gateway of every pod (assigned to every host veth).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// `skb->mark` bit from_pod sets on packets it encapsulated and redirected
/// to the overlay device; to_overlay clears it (`CP_MARK_ENCAP`).
pub const MARK_ENCAP: u32 = 0x0080_0000;
/// [`Params::flags`]: same-node net-0 traffic goes through the kernel
/// instead of a redirect (needed with an iptables kube-proxy, whose
/// conntrack must see both directions of a ClusterIP flow).
pub const PARAM_F_KERNEL_LOCAL: u32 = 0x1;
/// [`Params::flags`]: deliver into local pods with `bpf_redirect` to the
/// host veth's egress instead of `bpf_redirect_peer` into the pod
/// (`CP_PARAM_F_DELIVER_EGRESS`). Slower by a veth hop, but `tcpdump` on
/// the host veth sees pod-bound traffic again: a debugging switch.
pub const PARAM_F_DELIVER_EGRESS: u32 = 0x2;
/// [`Params::flags`]: encapsulate in tc and send to the uplink with
/// `bpf_redirect_neigh`, and decapsulate at the uplink's tc ingress what is
/// for a local pod (`CP_PARAM_F_TC_TUNNEL`, `bpf/encap.h`). Without it, or
/// for what tc cannot take, the VXLAN device does both.
pub const PARAM_F_TC_TUNNEL: u32 = 0x4;
/// Bits of an [`LpmKey`] before the address: the fully specified network id.
pub const LPM_NET_BITS: u32 = 32;
/// UDP port of the overlay (`CP_VXLAN_PORT`): the VXLAN device's `dstport`.
/// The datapath delivers pod traffic to it only to pods.
pub const VXLAN_PORT: u16 = 4789;
/// `cp_vteps` value bit: the tunnel endpoint is a cluster node's, written by
/// the agent's topology sync (`CP_VTEP_F_NODE`). Other writers use other bits.
pub const VTEP_F_NODE: u32 = 0x1;
/// How long a `cp_learned` entry stays usable (`CP_LEARN_TTL_NS`).
pub const LEARN_TTL_NS: u64 = 10_000_000_000;
/// [`Port::flags`]: the port is severed (`CP_PORT_F_QUARANTINE`): `from_pod`
/// drops everything the pod sends (ARP and ND too) and the destination gate
/// delivers nothing into it. Bit 31 stays reserved (gateway leg).
pub const PORT_F_QUARANTINE: u32 = 0x1;
/// [`MeterKey::kind`]: delivered into a pod of the network (`CP_METER_INGRESS`).
pub const METER_INGRESS: u32 = 0;
/// [`MeterKey::kind`]: sent by a pod of the network and forwarded
/// (`CP_METER_EGRESS`).
pub const METER_EGRESS: u32 = 1;
/// [`MeterKey::kind`]: `METER_DROP + reason` counts the network's drops by
/// [`DropReason`] (`CP_METER_DROP`).
pub const METER_DROP: u32 = 0x100;
/// First port `169.254.1.1` speaks from to a bridged VPC pod (host order,
/// `CP_BRIDGE_PORT_MIN`).
pub const BRIDGE_PORT_MIN: u16 = 1024;
/// Last such port, inclusive (`CP_BRIDGE_PORT_MAX`).
pub const BRIDGE_PORT_MAX: u16 = 65535;

/// The `64:ff9b::/96` prefix IPv4 addresses are embedded in.
const NAT64_PREFIX: [u8; 12] = [0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0];

/// A 128-bit address in network byte order (`struct addr128`).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr128(pub [u8; 16]);

impl Addr128 {
    /// IPv4 in RFC 6052 form `64:ff9b::a.b.c.d`.
    pub fn from_v4(ip: Ipv4Addr) -> Self {
        let mut b = [0u8; 16];
        b[..12].copy_from_slice(&NAT64_PREFIX);
        b[12..].copy_from_slice(&ip.octets());
        Self(b)
    }

    /// IPv6 as is.
    pub fn from_v6(ip: Ipv6Addr) -> Self {
        Self(ip.octets())
    }

    /// The address back as an [`IpAddr`]: `64:ff9b::/96` is IPv4.
    pub fn to_ip(self) -> IpAddr {
        if self.0[..12] == NAT64_PREFIX {
            IpAddr::V4(Ipv4Addr::new(
                self.0[12], self.0[13], self.0[14], self.0[15],
            ))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.0))
        }
    }

    /// Prefix length of `len` bits of `ip` within the 128-bit space (IPv4
    /// lives in the last 32 bits).
    pub fn prefix_bits(ip: IpAddr, len: u8) -> Option<u32> {
        match ip {
            IpAddr::V4(_) if len <= 32 => Some(96 + u32::from(len)),
            IpAddr::V6(_) if len <= 128 => Some(u32::from(len)),
            _ => None,
        }
    }
}

impl From<IpAddr> for Addr128 {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::from_v4(v4),
            IpAddr::V6(v6) => Self::from_v6(v6),
        }
    }
}

impl From<Ipv4Addr> for Addr128 {
    fn from(ip: Ipv4Addr) -> Self {
        Self::from_v4(ip)
    }
}

impl From<Ipv6Addr> for Addr128 {
    fn from(ip: Ipv6Addr) -> Self {
        Self::from_v6(ip)
    }
}

/// `{network id, address}`: endpoint identity (`struct cp_ep_key`), also the
/// data part of every scoped LPM key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EpKey {
    /// Network id (host order); 0 is the default network.
    pub net: u32,
    /// The address.
    pub addr: Addr128,
}

impl EpKey {
    /// Key of `ip` on network `net`.
    pub fn new(net: u32, ip: impl Into<Addr128>) -> Self {
        Self {
            net,
            addr: ip.into(),
        }
    }
}

/// A scoped LPM key (`struct cp_lpm_key`) as aya's `lpm_trie::Key` data:
/// the prefix length counts the 32 network bits plus the address bits.
pub type LpmKey = aya::maps::lpm_trie::Key<EpKey>;

/// Build the LPM key of `ip/len` on network `net`; `None` if `len` is too
/// long for the family.
pub fn lpm_key(net: u32, ip: IpAddr, len: u8) -> Option<LpmKey> {
    let bits = Addr128::prefix_bits(ip, len)?;
    Some(LpmKey::new(LPM_NET_BITS + bits, EpKey::new(net, ip)))
}

/// A pod on this node (`struct cp_endpoint`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// ifindex of the host-side veth.
    pub ifindex: u32,
    /// The pod's own MAC (its eth0).
    pub mac: [u8; 6],
    /// Reserved, 0.
    pub flags: u16,
}

/// Where a remote address lives (`struct cp_remote`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Remote {
    /// Tunnel endpoint (IPv4) of the owning node, network order.
    pub tunnel_ip: [u8; 4],
    /// Reserved, 0.
    pub flags: u32,
}

impl Remote {
    /// A remote reached through the tunnel endpoint `ip`.
    pub fn new(ip: Ipv4Addr) -> Self {
        Self {
            tunnel_ip: ip.octets(),
            flags: 0,
        }
    }

    /// The tunnel endpoint.
    pub fn tunnel_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.tunnel_ip)
    }
}

/// A remote address learned by `from_overlay` from a decapsulated packet
/// (`struct cp_learned`, the value of `cp_learned`, keyed by [`EpKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Learned {
    /// Outer source of the packet it was learned from: the sending node's
    /// tunnel endpoint, network order.
    pub tunnel_ip: [u8; 4],
    /// Padding, 0.
    pub pad: u32,
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`) after which the
    /// datapath ignores the entry.
    pub expires_ns: u64,
}

impl Learned {
    /// The tunnel endpoint.
    pub fn tunnel_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.tunnel_ip)
    }
}

/// The key of `cp_vteps`: a tunnel endpoint (IPv4, network order).
pub fn vtep_key(ip: Ipv4Addr) -> [u8; 4] {
    ip.octets()
}

/// What a host-side pod veth belongs to (`struct cp_port`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Port {
    /// Network id of the pod behind the veth.
    pub net: u32,
    /// `PORT_F_*` bits ([`PORT_F_QUARANTINE`]); bit 31 reserved (gateway leg).
    pub flags: u32,
}

/// Key of `cp_meters` (`struct cp_meter_key`): a network and what is
/// counted for it ([`METER_INGRESS`], [`METER_EGRESS`], `METER_DROP + reason`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MeterKey {
    /// Network id (a VPC's VNI; net 0 is not metered).
    pub net: u32,
    /// `METER_*`.
    pub kind: u32,
}

/// One CPU's count in `cp_meters` (`struct cp_meter_val`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MeterVal {
    /// Packets.
    pub packets: u64,
    /// Bytes (`skb->len`: the Ethernet frame, the inner one for overlay traffic).
    pub bytes: u64,
}

/// Node configuration (`struct cp_params`, entry 0 of `cp_params`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Params {
    /// ifindex of the overlay (VXLAN) device.
    pub vxlan_ifindex: u32,
    /// ifindex of the default-route uplink (informational).
    pub uplink_ifindex: u32,
    /// This node's tunnel endpoint, network order.
    pub node_ip: [u8; 4],
    /// Masquerade source address, network order; all zero disables masquerade.
    pub masq_ip: [u8; 4],
    /// First masquerade port, host order, inclusive.
    pub masq_port_min: u16,
    /// Last masquerade port, host order, inclusive.
    pub masq_port_max: u16,
    /// `PARAM_F_*` bits.
    pub flags: u32,
    /// This node's IPv6 address, the per-packet load balancer's SNAT source
    /// for IPv6 flows (`bpf/lb.h`); all zero: the node has none, and IPv6 flows
    /// that need SNAT are dropped.
    pub node_ip6: Addr128,
    /// Reserved for growth without an ABI break, 0.
    pub reserved: [u32; 6],
}

/// Masquerade connection key (`struct cp_masq_key`): a wire 5-tuple.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MasqKey {
    /// Source address.
    pub src: Addr128,
    /// Destination address.
    pub dst: Addr128,
    /// Source port (or ICMP echo id on the pod side), network order.
    pub sport: [u8; 2],
    /// Destination port (or ICMP echo id on the pod side), network order.
    pub dport: [u8; 2],
    /// IP protocol number.
    pub proto: u8,
    /// Zero.
    pub pad: [u8; 3],
}

/// Masquerade translation (`struct cp_masq_val`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MasqVal {
    /// Forward: the translated source address; reverse: the pod's address.
    pub addr: Addr128,
    /// Forward: the allocated port; reverse: the pod's port. Network order.
    pub port: [u8; 2],
    /// Reverse: `NAT_S_*` (replied, closing).
    pub state: u16,
    /// Reverse: when the port may be taken over by another flow
    /// (CLOCK_MONOTONIC seconds); 0: never.
    pub expires_s: u32,
}

/// [`MasqVal::state`]: the peer has replied (`CP_NAT_S_REPLIED`).
pub const NAT_S_REPLIED: u16 = 0x1;
/// [`MasqVal::state`]: a TCP FIN or RST was seen (`CP_NAT_S_CLOSING`).
pub const NAT_S_CLOSING: u16 = 0x2;

/// A VPC pod behind its fabric address (`struct cp_bridge`, the value of
/// `cp_bridges`, keyed by the fabric address at net 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bridge {
    /// The pod's VPC network id (its VNI).
    pub net: u32,
    /// Its host veth.
    pub ifindex: u32,
    /// Its VPC address.
    pub vpc: Addr128,
}

/// Bridge connection key (`struct cp_bridge_key`): a wire 5-tuple on a
/// network. Forward: net 0, node → fabric address; reverse: the pod's net,
/// VPC address → `169.254.1.1` with the claimed port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BridgeKey {
    /// Network id (host order).
    pub net: u32,
    /// The tuple.
    pub t: MasqKey,
}

/// Bridge translation (`struct cp_bridge_ct`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BridgeCt {
    /// Forward: the VPC address; reverse: the node address.
    pub addr: Addr128,
    /// The fabric address.
    pub fabric: Addr128,
    /// Forward: the claimed port; reverse: the node's port. Network order.
    pub port: [u8; 2],
    /// Zero.
    pub pad: u16,
    /// Reserved, 0.
    pub flags: u32,
}

/// What the test build (`CP_TEST_HOOKS`) records about the last
/// encapsulation (`struct cp_test_encap`); never present in production.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TestEncap {
    /// VNI written into the tunnel key.
    pub vni: u32,
    /// Remote tunnel endpoint, network order.
    pub remote: [u8; 4],
    /// Redirect target (the overlay device).
    pub ifindex: u32,
    /// Packets encapsulated so far.
    pub count: u32,
    /// The remote as handed to `bpf_skb_set_tunnel_key`: host order.
    pub key_remote: u32,
    /// The outer source handed to `bpf_skb_set_tunnel_key` (this node's
    /// tunnel endpoint, pinned so receivers recognise the sender): host order.
    pub key_local: u32,
}

/// What the test build (`CP_TEST_HOOKS`) records about the last delivery
/// into a local pod (`struct cp_test_deliver`); never present in production.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TestDeliver {
    /// Redirect target: the destination pod's host-side veth.
    pub ifindex: u32,
    /// 1 for `bpf_redirect_peer` (into the pod), 0 for `bpf_redirect` (host veth egress).
    pub peer: u32,
    /// Deliveries so far.
    pub count: u32,
    /// Padding, 0.
    pub pad: u32,
}

// SAFETY: every type below is `#[repr(C)]`, `Copy`, built only from integers
// and byte arrays with no padding (sizes and offsets are locked by the tests
// in this module), so any bit pattern the kernel hands back is a valid value.
unsafe impl aya::Pod for Addr128 {}
// SAFETY: see above.
unsafe impl aya::Pod for EpKey {}
// SAFETY: see above.
unsafe impl aya::Pod for Endpoint {}
// SAFETY: see above.
unsafe impl aya::Pod for Remote {}
// SAFETY: see above.
unsafe impl aya::Pod for Learned {}
// SAFETY: see above.
unsafe impl aya::Pod for Port {}
// SAFETY: see above.
unsafe impl aya::Pod for MeterKey {}
// SAFETY: see above.
unsafe impl aya::Pod for MeterVal {}
// SAFETY: see above.
unsafe impl aya::Pod for Params {}
// SAFETY: see above.
unsafe impl aya::Pod for MasqKey {}
// SAFETY: see above.
unsafe impl aya::Pod for MasqVal {}
// SAFETY: see above.
unsafe impl aya::Pod for Bridge {}
// SAFETY: see above.
unsafe impl aya::Pod for BridgeKey {}
// SAFETY: see above.
unsafe impl aya::Pod for BridgeCt {}
// SAFETY: see above.
unsafe impl aya::Pod for TestEncap {}
// SAFETY: see above.
unsafe impl aya::Pod for TestDeliver {}

/// Why the datapath dropped a packet (`enum cp_drop_reason`): the index into
/// the per-CPU `cp_drops` array and the `reason` label of the drop metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DropReason {
    /// Unclassified.
    Unknown = 0,
    /// Truncated or unparsable headers.
    Malformed = 1,
    /// Neither IPv4, IPv6 nor ARP from a pod.
    UnsupportedL3 = 2,
    /// `from_pod` ran on a veth without a `cp_ports` entry.
    NoPort = 3,
    /// A pod sent with a source address that is not its own.
    Rpf = 4,
    /// Overlay packet without tunnel metadata.
    NoTunnelKey = 5,
    /// VNI of a network this node does not serve.
    UnknownVni = 6,
    /// Overlay packet for an unknown pod of a non-default network.
    NoEndpoint = 7,
    /// `cp_params` lacks the overlay device.
    NoConfig = 8,
    /// Setting the tunnel key failed.
    Encap = 9,
    /// Masquerade port range exhausted.
    MasqNoPort = 10,
    /// Packet rewrite failed.
    MasqRewrite = 11,
    /// `to_pod`: the destination is not this veth's pod.
    Misdelivered = 12,
    /// `to_overlay`: the node routed a packet into the overlay for an
    /// address no remote node owns.
    NoRemote = 13,
    /// `from_overlay`: the outer source is not a known node tunnel
    /// endpoint (not in `cp_vteps`).
    UnknownVtep = 14,
    /// Pod traffic to the overlay port ([`VXLAN_PORT`]) of anything but a
    /// pod: a node's address, the outside, a Service (`from_pod`, and
    /// `to_uplink` before the masquerade), or a tunnel inside the tunnel
    /// for the receiving node itself (`from_overlay`).
    OverlayPort = 15,
    /// `to_uplink`: an IPv4 fragment from a pod the masquerade would have to
    /// translate.
    MasqFragment = 16,
    /// `to_uplink`: an IPv4 packet with IP options from a pod the masquerade
    /// would have to translate.
    MasqIpOptions = 17,
    /// `to_uplink`: a protocol (or ICMP type) from a pod the masquerade
    /// cannot translate (anything but TCP, UDP, ICMP echo request).
    MasqProto = 18,
    /// IPv6 link-scope or multicast traffic from a pod that is not neighbour
    /// discovery or an MLD report to its host veth, or link-scope traffic
    /// that came through the overlay.
    LinkScope = 19,
    /// `from_pod`: a VPC pod's packet for anything but an endpoint of its own
    /// VPC (a node, a default-network pod, another VPC, the outside).
    VpcIsolated = 20,
    /// `from_overlay`: the inner source of a VPC packet is no Port of that
    /// VPC on another node (no `cp_remotes` entry on its network).
    VpcSource = 21,
    /// `from_overlay`: the inner source of a VPC packet is a Port of another
    /// node than the one that sent it (outer source).
    VpcSender = 22,
    /// `to_pod`: the kernel routed a packet into a VPC port (only the
    /// dual-address bridge may).
    VpcKernelPath = 23,
    /// From or into a severed (quarantined) port.
    Quarantined = 24,
    /// `to_pod`: the node's packet for a VPC pod's fabric address that the
    /// dual-address bridge cannot translate (a fragment, IP options, a
    /// protocol or ICMP type other than TCP, UDP, echo request and errors
    /// about a bridged flow).
    BridgeUntranslatable = 25,
    /// `to_pod`: no free bridge port for a node → fabric address flow.
    BridgeNoPort = 26,
    /// A SecurityGroup endpoint's ingress: no group of the destination
    /// admits the packet, and no flow it admitted covers it (`bpf/policy.h`).
    SgIngress = 27,
    /// A SecurityGroup endpoint's egress: no group of the source admits
    /// the packet, and no flow it admitted covers it.
    SgEgress = 28,
    /// A packet to or from a SecurityGroup endpoint without an L4 header to
    /// judge (a later IPv4 fragment, a truncated header): fail closed.
    SgNoL4 = 29,
    /// A wire-scope Service frontend (NodePort, LoadBalancer IP,
    /// externalIP from outside) without a usable backend (`bpf/lb.h`).
    LbNoBackend = 30,
    /// Per-packet Service translation failed: no SNAT port left, a rewrite
    /// failed, or no way out for the translated packet.
    LbNat = 31,
    /// A new flow to a LoadBalancer IP from a source outside the Service's
    /// `loadBalancerSourceRanges`.
    LbSourceRange = 32,
    /// NetworkPolicy: the destination pod is isolated for ingress and none
    /// of its policies admits the packet's flow (`bpf/netpol.h`).
    NpIngress = 33,
    /// NetworkPolicy: the source pod is isolated for egress and none of its
    /// policies admits the packet's flow.
    NpEgress = 34,
    /// NetworkPolicy: an isolated pod's packet without an L4 header to
    /// judge (a later IPv4 fragment, a truncated header): fail closed.
    NpNoL4 = 35,
    /// Host firewall: the node is isolated for ingress (or has deny rules)
    /// and its policies do not admit the packet (`bpf/hostfw.h`).
    HostIngress = 36,
    /// Host firewall: likewise for the node's outgoing packet.
    HostEgress = 37,
}

impl DropReason {
    /// Entries of the `cp_drops` array (`CP_DROP_MAX`).
    pub const SLOTS: u32 = 48;

    /// Every reason, in index order.
    pub const ALL: [DropReason; 38] = [
        DropReason::Unknown,
        DropReason::Malformed,
        DropReason::UnsupportedL3,
        DropReason::NoPort,
        DropReason::Rpf,
        DropReason::NoTunnelKey,
        DropReason::UnknownVni,
        DropReason::NoEndpoint,
        DropReason::NoConfig,
        DropReason::Encap,
        DropReason::MasqNoPort,
        DropReason::MasqRewrite,
        DropReason::Misdelivered,
        DropReason::NoRemote,
        DropReason::UnknownVtep,
        DropReason::OverlayPort,
        DropReason::MasqFragment,
        DropReason::MasqIpOptions,
        DropReason::MasqProto,
        DropReason::LinkScope,
        DropReason::VpcIsolated,
        DropReason::VpcSource,
        DropReason::VpcSender,
        DropReason::VpcKernelPath,
        DropReason::Quarantined,
        DropReason::BridgeUntranslatable,
        DropReason::BridgeNoPort,
        DropReason::SgIngress,
        DropReason::SgEgress,
        DropReason::SgNoL4,
        DropReason::LbNoBackend,
        DropReason::LbNat,
        DropReason::LbSourceRange,
        DropReason::NpIngress,
        DropReason::NpEgress,
        DropReason::NpNoL4,
        DropReason::HostIngress,
        DropReason::HostEgress,
    ];

    /// The reason with index `n` in `cp_drops` (and `cp_meters` drop kinds).
    pub fn from_index(n: u32) -> Option<DropReason> {
        DropReason::ALL.get(usize::try_from(n).ok()?).copied()
    }

    /// Stable snake_case label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::Unknown => "unknown",
            DropReason::Malformed => "malformed",
            DropReason::UnsupportedL3 => "unsupported_l3",
            DropReason::NoPort => "no_port",
            DropReason::Rpf => "rpf",
            DropReason::NoTunnelKey => "no_tunnel_key",
            DropReason::UnknownVni => "unknown_vni",
            DropReason::NoEndpoint => "no_endpoint",
            DropReason::NoConfig => "no_config",
            DropReason::Encap => "encap",
            DropReason::MasqNoPort => "masq_no_port",
            DropReason::MasqRewrite => "masq_rewrite",
            DropReason::Misdelivered => "misdelivered",
            DropReason::NoRemote => "no_remote",
            DropReason::UnknownVtep => "unknown_vtep",
            DropReason::OverlayPort => "overlay_port",
            DropReason::MasqFragment => "masq_fragment",
            DropReason::MasqIpOptions => "masq_ip_options",
            DropReason::MasqProto => "masq_proto",
            DropReason::LinkScope => "link_scope",
            DropReason::VpcIsolated => "vpc_isolated",
            DropReason::VpcSource => "vpc_source",
            DropReason::VpcSender => "vpc_sender",
            DropReason::VpcKernelPath => "vpc_kernel_path",
            DropReason::Quarantined => "quarantined",
            DropReason::BridgeUntranslatable => "bridge_untranslatable",
            DropReason::BridgeNoPort => "bridge_no_port",
            DropReason::SgIngress => "sg_ingress",
            DropReason::SgEgress => "sg_egress",
            DropReason::SgNoL4 => "sg_no_l4",
            DropReason::LbNoBackend => "lb_no_backend",
            DropReason::LbNat => "lb_nat",
            DropReason::LbSourceRange => "lb_source_range",
            DropReason::NpIngress => "np_ingress",
            DropReason::NpEgress => "np_egress",
            DropReason::NpNoL4 => "np_no_l4",
            DropReason::HostIngress => "host_ingress",
            DropReason::HostEgress => "host_egress",
        }
    }
}

mod netpol;
mod service;
mod sg;
pub use netpol::*;
pub use service::*;
pub use sg::*;

#[cfg(test)]
mod btf;
#[cfg(test)]
mod object_check;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    /// View a `Pod` value as the bytes the kernel sees.
    fn bytes<T: aya::Pod>(v: &T) -> Vec<u8> {
        // SAFETY: `T: Pod` has no padding and is `size_of::<T>()` readable bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    // Sizes and field offsets are compared with the compiled object's BTF
    // (object_check.rs); BTF does not record alignment, so it is locked here
    // (and by CP_ABI_ALIGN in bpf/).
    #[test]
    fn alignment_matches_the_c_headers() {
        assert_eq!(align_of::<Addr128>(), 4);
        assert_eq!(align_of::<Learned>(), 8);
        assert_eq!(align_of::<MasqKey>(), 4);
        assert_eq!(align_of::<BridgeKey>(), 4);
        assert_eq!(align_of::<CtKey>(), 4);
        assert_eq!(align_of::<CtEntry>(), 8);
    }

    #[test]
    fn ipv4_is_stored_in_rfc6052_form() {
        let a = Addr128::from_v4(Ipv4Addr::new(10, 0, 0, 1));
        let expected: Ipv6Addr = "64:ff9b::a00:1".parse().unwrap();
        assert_eq!(a.0, expected.octets());
        assert_eq!(a.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let v6: Ipv6Addr = "fd00::1".parse().unwrap();
        assert_eq!(Addr128::from_v6(v6).to_ip(), IpAddr::V6(v6));
        // ::ffff:a.b.c.d is *not* the IPv4 form
        let mapped = Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped();
        assert_ne!(Addr128::from_v6(mapped), a);
    }

    #[test]
    fn keys_lay_out_net_host_order_then_address_wire_order() {
        let k = EpKey::new(0x0102_0304, Ipv4Addr::new(10, 244, 1, 2));
        let b = bytes(&k);
        assert_eq!(&b[..4], &0x0102_0304u32.to_ne_bytes());
        assert_eq!(&b[4..8], &[0x00, 0x64, 0xff, 0x9b]);
        assert_eq!(&b[16..], &[10, 244, 1, 2]);
    }

    #[test]
    fn lpm_prefix_lengths_count_net_and_address_bits() {
        let host = lpm_key(0, "10.244.1.2".parse().unwrap(), 32).unwrap();
        assert_eq!(host.prefix_len(), 160);
        let cidr = lpm_key(7, "10.244.0.0".parse().unwrap(), 16).unwrap();
        assert_eq!(cidr.prefix_len(), 32 + 96 + 16);
        assert_eq!(cidr.data().net, 7);
        let v6 = lpm_key(0, "fd00::".parse().unwrap(), 64).unwrap();
        assert_eq!(v6.prefix_len(), 32 + 64);
        assert!(lpm_key(0, "10.0.0.0".parse().unwrap(), 33).is_none());
        let b = bytes(&host);
        assert_eq!(&b[..4], &160u32.to_ne_bytes());
        assert_eq!(&b[20..], &[10, 244, 1, 2]);
    }

    #[test]
    fn ipv4_fields_are_network_order_and_ranges_host_order() {
        let p = Params {
            node_ip: Ipv4Addr::new(192, 168, 0, 10).octets(),
            masq_ip: Ipv4Addr::new(192, 168, 0, 11).octets(),
            masq_port_min: 16384,
            masq_port_max: 29999,
            ..Params::default()
        };
        let b = bytes(&p);
        assert_eq!(&b[8..12], &[192, 168, 0, 10]);
        assert_eq!(&b[12..16], &[192, 168, 0, 11]);
        assert_eq!(&b[16..18], &16384u16.to_ne_bytes());
        let p6 = Params {
            node_ip6: Addr128::from_v6("fd00:18::b".parse().unwrap()),
            ..Params::default()
        };
        let b = bytes(&p6);
        assert_eq!(
            &b[24..40],
            &"fd00:18::b".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        let r = Remote::new(Ipv4Addr::new(10, 250, 0, 2));
        assert_eq!(&bytes(&r)[..4], &[10, 250, 0, 2]);
        assert_eq!(r.tunnel_ip(), Ipv4Addr::new(10, 250, 0, 2));
    }

    #[test]
    fn learned_tunnel_is_network_order_and_expiry_host_order() {
        let l = Learned {
            tunnel_ip: Ipv4Addr::new(10, 250, 0, 2).octets(),
            pad: 0,
            expires_ns: 0x0102_0304_0506_0708,
        };
        let b = bytes(&l);
        assert_eq!(&b[..4], &[10, 250, 0, 2]);
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(l.tunnel_ip(), Ipv4Addr::new(10, 250, 0, 2));
        // the cp_vteps key is the address as on the wire
        assert_eq!(vtep_key(Ipv4Addr::new(10, 250, 0, 2)), [10, 250, 0, 2]);
    }

    #[test]
    fn drop_reasons_are_dense_and_fit_the_array() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert!((*r as u32) < DropReason::SLOTS);
            assert_eq!(*r as usize, i, "{r:?} out of place");
        }
        let labels: std::collections::HashSet<_> =
            DropReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), DropReason::ALL.len());
    }
}

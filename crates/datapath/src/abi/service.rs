//! The Services map ABI (`bpf/service.h`), mirrored like the rest of
//! [`super`]: frontends, backend ranges, backends, the reverse table, and the
//! socket-LB state the datapath keeps (reverse translations, affinity).

use std::net::IpAddr;

use super::Addr128;

/// [`SvcKey::scope`]: seen from a socket on this node (`CP_SVC_SCOPE_INTERNAL`).
pub const SVC_SCOPE_INTERNAL: u8 = 0;
/// [`SvcKey::scope`]: seen on the wire (`CP_SVC_SCOPE_EXTERNAL`).
pub const SVC_SCOPE_EXTERNAL: u8 = 1;
/// [`Svc::flags`]: sessionAffinity ClientIP (`CP_SVC_F_AFFINITY`).
pub const SVC_F_AFFINITY: u32 = 0x1;
/// [`Svc::flags`]: `loadBalancerSourceRanges` apply: new flows only from the
/// prefixes in `cp_lb_src` under the frontend's `rev_id` (`CP_SVC_F_SOURCE_RANGES`).
pub const SVC_F_SOURCE_RANGES: u32 = 0x2;
/// Entries of `cp_lb_src` (`CP_MAX_LB_SRC`): source ranges of all frontends.
pub const MAX_LB_SRC: u32 = 16384;
/// [`Backend::flags`]: the backend runs on this node (`CP_BACKEND_F_LOCAL`).
pub const BACKEND_F_LOCAL: u8 = 0x1;
/// [`Backend::flags`]: a terminating endpoint (`CP_BACKEND_F_TERMINATING`).
pub const BACKEND_F_TERMINATING: u8 = 0x2;
/// [`LbVal::flags`]: the client's source was translated to the node (`CP_LB_F_SNAT`).
pub const LB_F_SNAT: u32 = 0x1;
/// [`LbVal::flags`] (reverse): the backend has replied (`CP_LB_F_REPLIED`).
pub const LB_F_REPLIED: u32 = 0x2;
/// [`LbVal::flags`] (reverse): a TCP FIN or RST was seen (`CP_LB_F_CLOSING`).
pub const LB_F_CLOSING: u32 = 0x4;
/// [`LbVal::flags`] (reverse): a pod's own per-packet ClusterIP flow whose
/// backend is the pod itself, SNATed to the node; the entry's `ifindex` is
/// the pod's host veth (`CP_LB_F_HAIRPIN`).
pub const LB_F_HAIRPIN: u32 = 0x8;
/// Entries of each per-packet flow table (`CP_MAX_LB_CT`).
pub const MAX_LB_CT: u32 = 131072;
/// Slots of `cp_svc_slots` (`CP_MAX_SVC_SLOTS`): backend ranges and Maglev
/// tables of all frontends together.
pub const MAX_SVC_SLOTS: u32 = 1 << 20;

/// A frontend's key (`struct cp_svc_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvcKey {
    /// The network (host order; 0 is the default network).
    pub net: u32,
    /// The Service address.
    pub addr: Addr128,
    /// The port, network order.
    pub port: [u8; 2],
    /// IP protocol.
    pub proto: u8,
    /// [`SVC_SCOPE_INTERNAL`] or [`SVC_SCOPE_EXTERNAL`].
    pub scope: u8,
}

impl SvcKey {
    /// The key of `addr:port` over `proto` in `scope`, at network `net`.
    pub fn new(net: u32, addr: IpAddr, port: u16, proto: u8, scope: u8) -> Self {
        Self {
            net,
            addr: addr.into(),
            port: port.to_be_bytes(),
            proto,
            scope,
        }
    }
}

/// A frontend (`struct cp_svc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Svc {
    /// Key of this frontend's address in `cp_svc_revs`.
    pub rev_id: u32,
    /// First slot of the backend range in `cp_svc_slots`.
    pub base: u32,
    /// Backends in the range; 0 refuses connections.
    pub count: u32,
    /// How many of the range's first backends are this node's.
    pub local_count: u32,
    /// First slot of the Maglev table.
    pub maglev_base: u32,
    /// Maglev table size, 0 without one.
    pub maglev_m: u32,
    /// ClientIP affinity timeout, seconds.
    pub affinity_s: u32,
    /// `SVC_F_*`.
    pub flags: u32,
}

/// A backend (`struct cp_backend`); also a frontend's address in `cp_svc_revs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// The network (host order).
    pub net: u32,
    /// The address.
    pub addr: Addr128,
    /// The port, network order.
    pub port: [u8; 2],
    /// IP protocol.
    pub proto: u8,
    /// `BACKEND_F_*` (0 in `cp_svc_revs`).
    pub flags: u8,
}

impl Backend {
    /// `addr:port` over `proto` at network `net`.
    pub fn new(net: u32, addr: IpAddr, port: u16, proto: u8, flags: u8) -> Self {
        Self {
            net,
            addr: addr.into(),
            port: port.to_be_bytes(),
            proto,
            flags,
        }
    }
}

/// A translated socket's backend (`struct cp_sock_rev_key`), written by the
/// datapath.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevKey {
    /// The socket's cookie.
    pub cookie: u64,
    /// The backend's address.
    pub addr: Addr128,
    /// The backend's port, network order.
    pub port: [u8; 2],
    /// Zero.
    pub pad: [u8; 6],
}

/// A connected socket's translation (`struct cp_sock_own`), kept by the
/// datapath in the socket's own storage (`cp_sock_own`, `BPF_MAP_TYPE_SK_STORAGE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockOwn {
    /// The backend's address.
    pub addr: Addr128,
    /// The backend's port, network order.
    pub port: [u8; 2],
    /// Zero.
    pub pad: [u8; 2],
    /// The frontend's `rev_id`.
    pub rev_id: u32,
}

/// A client's pinned backend's key (`struct cp_affinity_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// The client's network namespace cookie (socket-LB), else 0.
    pub netns: u64,
    /// The client's address (per-packet LB), else 0.
    pub client: Addr128,
    /// The frontend.
    pub rev_id: u32,
    /// Zero.
    pub pad: u32,
}

/// A client's pinned backend (`struct cp_affinity`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Affinity {
    /// `CLOCK_MONOTONIC` nanoseconds of the last pick.
    pub last_ns: u64,
    /// The backend id.
    pub backend_id: u32,
    /// Where the backend was: an index into the frontend's range, or (high bit
    /// set) into its Maglev table; the pin counts only while the backend is there.
    pub slot: u32,
}

/// A per-packet flow (`struct cp_lb_val`, `bpf/lb.h`), written by the
/// datapath: `cp_lb_fwd` (request tuple → backend) and `cp_lb_rev` (reply
/// tuple → frontend and client); both keyed by a [`super::MasqKey`] tuple.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LbVal {
    /// Reverse: the client, restored as the reply's destination.
    pub client: Addr128,
    /// Forward: the flow's backend id.
    pub backend_id: u32,
    /// The frontend's `rev_id`.
    pub rev_id: u32,
    /// Reverse: the client's port, network order.
    pub client_port: [u8; 2],
    /// The node port the client was translated to (network order), 0 without SNAT.
    pub snat_port: [u8; 2],
    /// Reverse: the uplink the request came in on, 0 for the overlay.
    pub ifindex: u32,
    /// `LB_F_*`.
    pub flags: u32,
    /// Reverse, SNATed: when the port may be taken over by another flow
    /// (CLOCK_MONOTONIC seconds); 0: never.
    pub expires_s: u32,
}

/// The network of a pod network namespace (`struct cp_netns_val`), the
/// value of `cp_netns` keyed by the namespace's cookie (`SO_NETNS_COOKIE`):
/// the socket-LB programs look frontends up under this network, and a
/// namespace without an entry is on net 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NetnsVal {
    /// The VPC's network id (host order, never 0).
    pub net: u32,
    /// The pod's host veth: the witness a rebuild prunes stale entries by.
    pub ifindex: u32,
}

// SAFETY: `#[repr(C)]`, `Copy`, integers and byte arrays only, no padding
// (sizes and offsets locked against the object by object_check.rs), so any
// bit pattern is a valid value.
unsafe impl aya::Pod for SvcKey {}
// SAFETY: see above.
unsafe impl aya::Pod for Svc {}
// SAFETY: see above.
unsafe impl aya::Pod for Backend {}
// SAFETY: see above.
unsafe impl aya::Pod for SockRevKey {}
// SAFETY: see above.
unsafe impl aya::Pod for SockOwn {}
// SAFETY: see above.
unsafe impl aya::Pod for AffinityKey {}
// SAFETY: see above.
unsafe impl aya::Pod for Affinity {}
// SAFETY: see above.
unsafe impl aya::Pod for LbVal {}
// SAFETY: see above.
unsafe impl aya::Pod for NetnsVal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_ports_in_network_order_and_v4_in_its_nat64_form() {
        let k = SvcKey::new(0, "10.96.0.10".parse().unwrap(), 443, 6, SVC_SCOPE_INTERNAL);
        assert_eq!(k.port, [0x01, 0xbb]);
        assert_eq!(
            k.addr,
            Addr128::from("10.96.0.10".parse::<IpAddr>().unwrap())
        );
        assert_eq!(k.addr.to_ip(), "10.96.0.10".parse::<IpAddr>().unwrap());
        let b = Backend::new(0, "fd00::7".parse().unwrap(), 8080, 17, BACKEND_F_LOCAL);
        assert_eq!(b.port, 8080u16.to_be_bytes());
        assert_eq!(b.addr.to_ip(), "fd00::7".parse::<IpAddr>().unwrap());
    }
}

//! NetworkPolicy's map ABI (`bpf/netpol.h`), mirrored like the rest of
//! [`super`].

use std::net::IpAddr;

use super::{Addr128, EpKey, NET_DEFAULT};

/// [`NpEp::flags`]: a policy selects the pod for ingress (`CP_NP_F_ISOLATED_IN`).
pub const NP_F_ISOLATED_IN: u32 = 0x1;
/// [`NpEp::flags`]: a policy selects the pod for egress (`CP_NP_F_ISOLATED_OUT`).
pub const NP_F_ISOLATED_OUT: u32 = 0x2;
/// [`NpEp::flags`]: the pod has ingress deny rules (`CP_NP_F_DENY_IN`).
pub const NP_F_DENY_IN: u32 = 0x4;
/// [`NpEp::flags`]: the pod has egress deny rules (`CP_NP_F_DENY_OUT`).
pub const NP_F_DENY_OUT: u32 = 0x8;
/// `cp_np_eps` key net of the host's pseudo endpoint (`CP_NP_HOST_NET`,
/// bpf/hostfw.h); its address is `::`.
pub const NP_HOST_NET: u32 = 0xffff_ffff;
/// The host's identity in the rule maps (`CP_NP_HOST_ID`): no pod has it.
pub const NP_HOST_ID: u32 = 0x7fff_ffff;
/// `cp_ct` zone of the node's own UDP/SCTP flows (`CP_CT_ZONE_HOST`).
pub const CT_ZONE_HOST: u32 = 0xffff_fffe;
/// Direction of a rule: traffic into the subject (`CP_NP_INGRESS`).
pub const NP_INGRESS: u8 = 1;
/// Direction of a rule: traffic out of the subject (`CP_NP_EGRESS`).
pub const NP_EGRESS: u8 = 2;
/// [`NpRule::peer`] of a rule without peers: any peer (`CP_NP_PEER_ANY`).
pub const NP_PEER_ANY: u32 = 0xffff_ffff;
/// [`NpRule::peer`] bit of a CIDR class (`CP_NP_PEER_CIDR`); identities are
/// below it.
pub const NP_PEER_CIDR: u32 = 0x8000_0000;
/// Bits of an [`NpRule`] before the protocol (`CP_NP_RULE_FIXED_BITS`).
pub const NP_RULE_FIXED_BITS: u32 = 96;
/// Bits of an [`NpCidr`] before the address (`CP_NP_CIDR_FIXED_BITS`).
pub const NP_CIDR_FIXED_BITS: u32 = 64;

/// A pod as NetworkPolicy knows it (`struct cp_np_ep`, the value of
/// `cp_np_eps`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NpEp {
    /// The pod's identity, `1..NP_PEER_CIDR`.
    pub id: u32,
    /// `NP_F_*`.
    pub flags: u32,
}

/// The data of a `cp_np_rules` key (`struct cp_np_rule_key` after its
/// prefix length): see `bpf/netpol.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NpRule {
    /// The identity whose policies the rule is.
    pub subject: u32,
    /// [`NP_INGRESS`] or [`NP_EGRESS`].
    pub dir: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// An identity, [`NP_PEER_ANY`], or [`NP_PEER_CIDR`] | a CIDR class.
    pub peer: u32,
    /// IP protocol (zero in a rule for any protocol).
    pub proto: u8,
    /// Zero.
    pub pad2: u8,
    /// Destination port prefix, network order.
    pub port: [u8; 2],
}

/// A `cp_np_rules` key as aya's LPM key.
pub type NpRuleKey = aya::maps::lpm_trie::Key<NpRule>;

/// What a rule matches of a packet beyond its subject, direction and peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NpMatch {
    /// Any protocol, any port.
    Any,
    /// Any port of the protocol.
    Proto(u8),
    /// Ports of the protocol whose first `bits` bits equal `start`'s.
    Ports {
        /// IP protocol.
        proto: u8,
        /// The block's first port.
        start: u16,
        /// Prefix length over the 16 port bits, 0..=16.
        bits: u8,
    },
}

impl NpRule {
    /// The LPM key of `subject`'s rule for `dir` traffic with `peer`.
    pub fn key(subject: u32, dir: u8, peer: u32, what: NpMatch) -> NpRuleKey {
        let (len, proto, port) = match what {
            NpMatch::Any => (NP_RULE_FIXED_BITS, 0, 0),
            NpMatch::Proto(p) => (NP_RULE_FIXED_BITS + 8, p, 0),
            NpMatch::Ports { proto, start, bits } => {
                let bits = bits.min(16);
                let mask = if bits == 0 {
                    0
                } else {
                    u16::MAX << (16 - u32::from(bits))
                };
                (
                    NP_RULE_FIXED_BITS + 16 + u32::from(bits),
                    proto,
                    start & mask,
                )
            }
        };
        NpRuleKey::new(
            len,
            NpRule {
                subject,
                dir,
                pad: [0; 3],
                peer,
                proto,
                pad2: 0,
                port: port.to_be_bytes(),
            },
        )
    }
}

/// The data of a `cp_np_cidrs` key (`struct cp_np_cidr_key` after its
/// prefix length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NpCidr {
    /// The subject identity.
    pub subject: u32,
    /// [`NP_INGRESS`] or [`NP_EGRESS`].
    pub dir: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// The peer prefix's address.
    pub addr: Addr128,
}

/// A `cp_np_cidrs` key as aya's LPM key.
pub type NpCidrKey = aya::maps::lpm_trie::Key<NpCidr>;

/// The `cp_np_cidrs` key of `ip/len` for `subject`'s `dir` rules; `None` if
/// `len` is too long for the family.
pub fn np_cidr_key(subject: u32, dir: u8, ip: IpAddr, len: u8) -> Option<NpCidrKey> {
    let bits = Addr128::prefix_bits(ip, len)?;
    Some(NpCidrKey::new(
        NP_CIDR_FIXED_BITS + bits,
        NpCidr {
            subject,
            dir,
            pad: [0; 3],
            addr: ip.into(),
        },
    ))
}

/// The `cp_np_eps` key of a default-network pod address.
pub fn np_ep_key(ip: IpAddr) -> EpKey {
    EpKey::new(NET_DEFAULT, ip)
}

// SAFETY: `#[repr(C)]`, `Copy`, integers and byte arrays only, no padding
// (sizes and offsets locked against the object by object_check.rs), so any
// bit pattern is a valid value.
unsafe impl aya::Pod for NpEp {}
// SAFETY: see above.
unsafe impl aya::Pod for NpRule {}
// SAFETY: see above.
unsafe impl aya::Pod for NpCidr {}

/// The `cp_np_eps` key of the host's pseudo endpoint (bpf/hostfw.h).
pub fn np_host_key() -> EpKey {
    EpKey {
        net: NP_HOST_NET,
        addr: Addr128([0; 16]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_keys_mask_the_port_beyond_the_prefix_and_keep_network_order() {
        let k = NpRule::key(
            7,
            NP_INGRESS,
            9,
            NpMatch::Ports {
                proto: 6,
                start: 0x1f91,
                bits: 15,
            },
        );
        assert_eq!(k.prefix_len(), 96 + 16 + 15);
        assert_eq!(k.data().port, [0x1f, 0x90]);
        let any = NpRule::key(7, NP_EGRESS, NP_PEER_ANY, NpMatch::Any);
        assert_eq!(any.prefix_len(), 96);
        assert_eq!(any.data().proto, 0);
        let proto = NpRule::key(7, NP_EGRESS, 3, NpMatch::Proto(17));
        assert_eq!(proto.prefix_len(), 104);
        assert_eq!(proto.data().proto, 17);
    }

    #[test]
    fn cidr_keys_count_the_fixed_bits() {
        let k = np_cidr_key(3, NP_EGRESS, "10.0.0.0".parse().unwrap(), 8).unwrap();
        assert_eq!(k.prefix_len(), 64 + 96 + 8);
        assert!(np_cidr_key(3, NP_EGRESS, "10.0.0.0".parse().unwrap(), 33).is_none());
    }
}

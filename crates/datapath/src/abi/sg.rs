//! The connection tracker's and the SecurityGroup engine's map ABI
//! (`bpf/ct.h`, `bpf/policy.h`), mirrored like the rest of [`super`].

use std::net::IpAddr;

use super::{Addr128, EpKey};

/// Groups one endpoint can be a member of (`CP_SG_MAX_GROUPS`).
pub const SG_MAX_GROUPS: usize = 16;
/// [`SgRule::peer_net`] of a CIDR class peer (`CP_SG_PEER_CIDR`).
pub const SG_PEER_CIDR: u32 = 0xffff_ffff;
/// Direction of a rule: traffic into the subject (`CP_SG_INGRESS`).
pub const SG_INGRESS: u8 = 1;
/// Direction of a rule: traffic out of the subject (`CP_SG_EGRESS`).
pub const SG_EGRESS: u8 = 2;
/// Bits of an [`SgRule`] before the port (`CP_SG_RULE_FIXED_BITS`).
pub const SG_RULE_FIXED_BITS: u32 = 144;
/// Bits of an [`SgCidr`] before the address (`CP_SG_CIDR_FIXED_BITS`).
pub const SG_CIDR_FIXED_BITS: u32 = 96;

/// `cp_ct` flag: a packet went the reply direction.
pub const CT_F_SEEN_REPLY: u32 = 0x1;
/// `cp_ct` flag: the originator sent FIN.
pub const CT_F_FIN_ORIG: u32 = 0x2;
/// `cp_ct` flag: the responder sent FIN.
pub const CT_F_FIN_REPLY: u32 = 0x4;
/// `cp_ct` flag: RST seen, or FIN both ways.
pub const CT_F_CLOSED: u32 = 0x8;
/// `cp_ct` flag: the originator's egress policy admitted the flow here.
pub const CT_F_SRC_OK: u32 = 0x100;
/// `cp_ct` flag: the responder's ingress policy admitted the flow here.
pub const CT_F_DST_OK: u32 = 0x200;
/// `cp_ct` flag: NetworkPolicy — the originator's egress admitted the flow
/// (valid for the entry's epoch).
pub const CT_F_NP_SRC: u32 = 0x1000;
/// `cp_ct` flag: NetworkPolicy — the responder's ingress admitted the flow.
pub const CT_F_NP_DST: u32 = 0x2000;
/// `cp_ct` flag: NetworkPolicy — the local node's own flow into its pod.
pub const CT_F_NP_NODE: u32 = 0x4000;

/// Idle timeout of a TCP flow without a reply yet (`CP_CT_TCP_SYN_NS`).
pub const CT_TCP_SYN_NS: u64 = 60_000_000_000;
/// Idle timeout of an established TCP flow (`CP_CT_TCP_EST_NS`, 6 h).
pub const CT_TCP_EST_NS: u64 = 6 * 3600 * 1_000_000_000;
/// Timeout after RST or FIN both ways (`CP_CT_TCP_CLOSE_NS`).
pub const CT_TCP_CLOSE_NS: u64 = 10_000_000_000;
/// Idle timeout of UDP and other flows (`CP_CT_UDP_NS`).
pub const CT_UDP_NS: u64 = 60_000_000_000;
/// Idle timeout of an ICMP echo flow (`CP_CT_ICMP_NS`).
pub const CT_ICMP_NS: u64 = 30_000_000_000;
/// Idle timeout of an answered SCTP association (`CP_CT_SCTP_EST_NS`, 1 h).
pub const CT_SCTP_EST_NS: u64 = 3600 * 1_000_000_000;
/// How much of an idle timer must have run down before a packet rewrites it
/// (`CP_CT_RENEW_SLACK_NS`).
pub const CT_RENEW_SLACK_NS: u64 = 1_000_000_000;

/// A tracked flow's key (`struct cp_ct_key`): zone and 5-tuple in the
/// originator's direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtKey {
    /// The network the flow lives in (host order).
    pub zone: u32,
    /// Source address.
    pub src: Addr128,
    /// Destination address.
    pub dst: Addr128,
    /// Source port, or the echo id of a request; network order.
    pub sport: [u8; 2],
    /// Destination port, or the echo id of a reply; network order.
    pub dport: [u8; 2],
    /// IP protocol.
    pub proto: u8,
    /// Zero.
    pub pad: [u8; 3],
}

/// A tracked flow (`struct cp_ct_entry`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtEntry {
    /// `CLOCK_MONOTONIC` nanoseconds after which the entry is dead.
    pub expires_ns: u64,
    /// `CT_F_*`.
    pub flags: u32,
    /// NetworkPolicy: the `cp_np_epoch` its `CT_F_NP_*` bits hold for.
    pub epoch: u32,
}

/// An endpoint's groups (`struct cp_sg_groups`, the value of `cp_sg_members`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SgGroups {
    /// How many of `ids` are used.
    pub count: u32,
    /// The group ids (host order), sorted, unused ones 0.
    pub ids: [u32; SG_MAX_GROUPS],
}

impl SgGroups {
    /// The value for `ids` (sorted and deduplicated here); `None` if there
    /// are more than [`SG_MAX_GROUPS`].
    pub fn new(ids: &[u32]) -> Option<Self> {
        let mut v = ids.to_vec();
        v.sort_unstable();
        v.dedup();
        if v.len() > SG_MAX_GROUPS {
            return None;
        }
        let mut out = Self {
            count: u32::try_from(v.len()).ok()?,
            ids: [0; SG_MAX_GROUPS],
        };
        out.ids[..v.len()].copy_from_slice(&v);
        Some(out)
    }

    /// The used ids.
    pub fn ids(&self) -> &[u32] {
        let n = (self.count as usize).min(SG_MAX_GROUPS);
        &self.ids[..n]
    }
}

/// The data of a `cp_sg_rules` key (`struct cp_sg_rule_key` after its
/// prefix length): see `bpf/policy.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SgRule {
    /// The subject group's network.
    pub net: u32,
    /// The subject group.
    pub group: u32,
    /// The peer group's network, or [`SG_PEER_CIDR`].
    pub peer_net: u32,
    /// The peer group, or a CIDR class.
    pub peer: u32,
    /// [`SG_INGRESS`] or [`SG_EGRESS`].
    pub dir: u8,
    /// IP protocol.
    pub proto: u8,
    /// Destination port (or ICMP type) prefix, network order.
    pub port: [u8; 2],
}

/// A `cp_sg_rules` key as aya's LPM key.
pub type SgRuleKey = aya::maps::lpm_trie::Key<SgRule>;

impl SgRule {
    /// The LPM key matching ports whose first `bits` bits equal `port`'s.
    pub fn key(self, bits: u8) -> SgRuleKey {
        SgRuleKey::new(SG_RULE_FIXED_BITS + u32::from(bits.min(16)), self)
    }
}

/// The data of a `cp_sg_cidrs` key (`struct cp_sg_cidr_key` after its
/// prefix length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SgCidr {
    /// The subject group's network.
    pub net: u32,
    /// The subject group.
    pub group: u32,
    /// [`SG_INGRESS`] or [`SG_EGRESS`].
    pub dir: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// The peer prefix's address.
    pub addr: Addr128,
}

/// A `cp_sg_cidrs` key as aya's LPM key.
pub type SgCidrKey = aya::maps::lpm_trie::Key<SgCidr>;

/// The `cp_sg_cidrs` key of `ip/len` for the subject group `{net, group}`;
/// `None` if `len` is too long for the family.
pub fn sg_cidr_key(net: u32, group: u32, dir: u8, ip: IpAddr, len: u8) -> Option<SgCidrKey> {
    let bits = Addr128::prefix_bits(ip, len)?;
    Some(SgCidrKey::new(
        SG_CIDR_FIXED_BITS + bits,
        SgCidr {
            net,
            group,
            dir,
            pad: [0; 3],
            addr: ip.into(),
        },
    ))
}

/// The endpoint key of `cp_sg_members`.
pub fn sg_member_key(net: u32, ip: IpAddr) -> EpKey {
    EpKey::new(net, ip)
}

/// The fewest `(start, prefix bits)` blocks of the 16-bit port space that
/// cover exactly `lo..=hi` (at most 30; one for the whole space). Empty if
/// `lo > hi`.
pub fn port_range_prefixes(lo: u16, hi: u16) -> Vec<(u16, u8)> {
    PortPrefixes::new(lo, hi).collect()
}

/// [`port_range_prefixes`] without the allocation, for hot loops.
#[derive(Debug, Clone)]
pub struct PortPrefixes {
    lo: u32,
    hi: u32,
}

impl PortPrefixes {
    /// The blocks of `lo..=hi`.
    pub fn new(lo: u16, hi: u16) -> Self {
        Self {
            lo: u32::from(lo),
            hi: u32::from(hi),
        }
    }
}

impl Iterator for PortPrefixes {
    type Item = (u16, u8);

    fn next(&mut self) -> Option<(u16, u8)> {
        let (lo, hi) = (self.lo, self.hi);
        if lo > hi {
            return None;
        }
        // the largest aligned block starting at lo that stays within hi
        let mut size: u32 = if lo == 0 {
            1 << 16
        } else {
            lo & lo.wrapping_neg()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        let bits = 16 - size.trailing_zeros();
        self.lo = lo + size;
        Some((lo as u16, bits as u8))
    }
}

// SAFETY: `#[repr(C)]`, `Copy`, integers and byte arrays only, no padding
// (sizes and offsets locked against the object by object_check.rs), so any
// bit pattern is a valid value.
unsafe impl aya::Pod for CtKey {}
// SAFETY: see above.
unsafe impl aya::Pod for CtEntry {}
// SAFETY: see above.
unsafe impl aya::Pod for SgGroups {}
// SAFETY: see above.
unsafe impl aya::Pod for SgRule {}
// SAFETY: see above.
unsafe impl aya::Pod for SgCidr {}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(blocks: &[(u16, u8)]) -> Vec<u32> {
        let mut v = Vec::new();
        for &(start, bits) in blocks {
            let size = 1u32 << (16 - u32::from(bits));
            assert_eq!(
                u32::from(start) % size,
                0,
                "block {start}/{bits} is aligned"
            );
            v.extend(u32::from(start)..u32::from(start) + size);
        }
        v
    }

    #[test]
    fn port_ranges_become_exact_prefix_covers() {
        assert_eq!(port_range_prefixes(0, 65535), vec![(0, 0)]);
        assert_eq!(port_range_prefixes(8000, 8000), vec![(8000, 16)]);
        assert_eq!(port_range_prefixes(8000, 8001), vec![(8000, 15)]);
        assert!(port_range_prefixes(9, 8).is_empty());
        for (lo, hi) in [
            (1, 65535),
            (1, 65534),
            (8000, 8100),
            (1024, 2047),
            (7, 9),
            (65535, 65535),
        ] {
            let blocks = port_range_prefixes(lo, hi);
            assert!(blocks.len() <= 30, "{lo}-{hi}: {} blocks", blocks.len());
            assert_eq!(
                expand(&blocks),
                (u32::from(lo)..=u32::from(hi)).collect::<Vec<_>>()
            );
        }
        assert_eq!(port_range_prefixes(1, 65534).len(), 30);
    }

    #[test]
    fn groups_are_sorted_bounded_and_padded() {
        let g = SgGroups::new(&[7, 3, 7]).unwrap();
        assert_eq!(g.count, 2);
        assert_eq!(g.ids(), &[3, 7]);
        assert_eq!(g.ids[2], 0);
        let too_many: Vec<u32> = (1..=17).collect();
        assert!(SgGroups::new(&too_many).is_none());
        assert!(SgGroups::new(&too_many[..16]).is_some());
    }

    #[test]
    fn rule_and_cidr_keys_count_fixed_bits() {
        let r = SgRule {
            net: 100,
            group: 1,
            peer_net: 100,
            peer: 2,
            dir: SG_INGRESS,
            proto: 6,
            port: 8000u16.to_be_bytes(),
        };
        assert_eq!(r.key(16).prefix_len(), 160);
        assert_eq!(r.key(0).prefix_len(), 144);
        let c = sg_cidr_key(100, 1, SG_INGRESS, "10.0.0.0".parse().unwrap(), 8).unwrap();
        assert_eq!(c.prefix_len(), 96 + 96 + 8);
        let c6 = sg_cidr_key(100, 1, SG_EGRESS, "fd00::".parse().unwrap(), 64).unwrap();
        assert_eq!(c6.prefix_len(), 96 + 64);
        assert!(sg_cidr_key(100, 1, SG_EGRESS, "10.0.0.0".parse().unwrap(), 33).is_none());
    }
}

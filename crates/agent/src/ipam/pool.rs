//! Address pools: one cluster pod CIDR per family, walked as a ring of
//! candidate indexes.
//!
//! A pool is addressed by *index* (`0..usable()`), not by address, so the
//! allocator can start anywhere and wrap with plain integer arithmetic, for
//! IPv4 and for IPv6 prefixes far too large to enumerate. The addresses no
//! pod may hold are cut off the ends of the range (the IPv4 network and
//! broadcast addresses, the IPv6 subnet-router anycast address) or listed in
//! the pool's reserved set (node addresses, anything the operator holds back).

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv6Net};

/// `64:ff9b::/96`, where the datapath keeps IPv4 addresses.
const NAT64: IpNet = IpNet::V6(Ipv6Net::new_assert(
    Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
    96,
));

/// Why a pool definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The text is not `<address>/<length>`.
    #[error("{0:?} is not a CIDR (expected <address>/<prefix length>)")]
    Syntax(String),
    /// The prefix length does not fit the family.
    #[error("{0:?}: prefix length too long for the address family")]
    PrefixTooLong(String),
    /// The address has bits set past the prefix (`10.244.0.1/16`).
    #[error("{0:?} has host bits set; did you mean {1}?")]
    HostBits(String, Cidr),
    /// The prefix leaves no address a pod could hold.
    #[error("{0} has no usable pod address")]
    Empty(Cidr),
    /// The IPv6 prefix is so short that the pool size overflows 128 bits.
    #[error("{0} is too large to be a pod pool")]
    TooLarge(Cidr),
    /// IPv6 inside `64:ff9b::/96` would alias IPv4 in the datapath's keys.
    #[error("{0} overlaps 64:ff9b::/96, where the datapath keeps IPv4 addresses")]
    Nat64Overlap(Cidr),
    /// Two pools of one family.
    #[error("more than one {0} pool ({1} and {2}); give one cluster CIDR per family")]
    DuplicateFamily(&'static str, Cidr, Cidr),
}

/// An IP prefix (`10.244.0.0/16`, `fd00:10:244::/56`) with its host bits clear:
/// an [`IpNet`] that [`Cidr::new`] or the parser has checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr(IpNet);

impl Cidr {
    /// A prefix; refuses lengths too long for the family and set host bits.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, PoolError> {
        let net =
            IpNet::new(addr, len).map_err(|_| PoolError::PrefixTooLong(format!("{addr}/{len}")))?;
        if net.trunc() != net {
            return Err(PoolError::HostBits(net.to_string(), Cidr(net.trunc())));
        }
        Ok(Cidr(net))
    }

    /// The prefix as an ipnet value.
    pub fn net(&self) -> IpNet {
        self.0
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    /// The prefix length.
    pub fn len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Never true: a prefix always holds at least one address. (Present so the
    /// `len` accessor does not read as a collection without `is_empty`.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Is `ip` inside this prefix? (Never across families.)
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip)
    }

    /// Do the two prefixes share an address?
    fn overlaps(&self, other: &IpNet) -> bool {
        self.0.contains(other) || other.contains(&self.0)
    }

    /// The number of host bits (the pool has `2^host_bits` addresses).
    fn host_bits(&self) -> u32 {
        u32::from(self.0.max_prefix_len() - self.0.prefix_len())
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Cidr {
    type Err = PoolError;

    /// Reads the address with the standard library, not ipnet's parser, which
    /// still takes IPv4 octets with leading zeros (`010.0.0.0`) as decimal.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || PoolError::Syntax(s.to_string());
        let (a, l) = s.trim().split_once('/').ok_or_else(syntax)?;
        if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let addr: IpAddr = a.parse().map_err(|_| syntax())?;
        let len: u8 = l.parse().map_err(|_| syntax())?;
        Cidr::new(addr, len)
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Rebuild an address of `family`'s family from its integer form.
fn from_u128(family: IpAddr, v: u128) -> IpAddr {
    match family {
        // Truncation is intended: v4 values never exceed 32 bits here.
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// The address family of a pool, for messages and labels.
pub fn family_name(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// One family's pod address pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    cidr: Cidr,
    /// Integer form of the first usable address.
    first: u128,
    /// How many addresses lie in the usable range (reserved ones included).
    usable: u128,
    reserved: BTreeSet<IpAddr>,
}

impl Pool {
    /// A pool over `cidr`, minus the addresses no pod may hold.
    ///
    /// IPv4: the network and broadcast addresses are skipped, except in a /31
    /// or /32 where every address is a host (RFC 3021). IPv6: the
    /// subnet-router anycast address (all host bits zero) is skipped, except
    /// in a /128.
    pub fn new(cidr: Cidr, reserved: impl IntoIterator<Item = IpAddr>) -> Result<Self, PoolError> {
        let bits = cidr.host_bits();
        if bits >= 128 {
            return Err(PoolError::TooLarge(cidr));
        }
        if cidr.overlaps(&NAT64) {
            return Err(PoolError::Nat64Overlap(cidr));
        }
        let size: u128 = 1u128 << bits;
        let base = to_u128(cidr.addr());
        let (first, usable) = match cidr.addr() {
            IpAddr::V4(_) if bits <= 1 => (base, size),
            IpAddr::V4(_) => (base + 1, size - 2),
            IpAddr::V6(_) if bits == 0 => (base, size),
            IpAddr::V6(_) => (base + 1, size - 1),
        };
        let reserved: BTreeSet<IpAddr> = reserved
            .into_iter()
            .filter(|ip| cidr.contains(*ip))
            .collect();
        let pool = Pool {
            cidr,
            first,
            usable,
            reserved,
        };
        if pool.capacity() == 0 {
            return Err(PoolError::Empty(cidr));
        }
        Ok(pool)
    }

    /// The prefix the pool draws from.
    pub fn cidr(&self) -> Cidr {
        self.cidr
    }

    /// Is this an IPv4 pool?
    pub fn is_ipv4(&self) -> bool {
        self.cidr.addr().is_ipv4()
    }

    /// The number of indexes in the ring (reserved addresses included).
    pub fn ring_len(&self) -> u128 {
        self.usable
    }

    /// How many addresses pods can actually hold.
    pub fn capacity(&self) -> u128 {
        let reserved_in_range = self
            .reserved
            .iter()
            .filter(|ip| {
                let v = to_u128(**ip);
                v >= self.first && v - self.first < self.usable
            })
            .count();
        self.usable - reserved_in_range as u128
    }

    /// The address at ring position `index` (taken modulo the ring length).
    pub fn at(&self, index: u128) -> IpAddr {
        from_u128(self.cidr.addr(), self.first + index % self.usable)
    }

    /// Would the allocator ever hand out `ip`?
    pub fn is_allocatable(&self, ip: IpAddr) -> bool {
        if !self.cidr.contains(ip) || self.reserved.contains(&ip) {
            return false;
        }
        let v = to_u128(ip);
        v >= self.first && v - self.first < self.usable
    }

    /// Is `ip` held back from allocation?
    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        self.reserved.contains(&ip)
    }
}

/// The cluster's pools: at most one per family, IPv4 first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools(Vec<Pool>);

impl Pools {
    /// Checks there is at least one pool and at most one per family.
    pub fn new(mut pools: Vec<Pool>) -> Result<Self, PoolError> {
        pools.sort_by_key(|p| !p.is_ipv4());
        for w in pools.windows(2) {
            if w[0].is_ipv4() == w[1].is_ipv4() {
                return Err(PoolError::DuplicateFamily(
                    family_name(w[0].cidr.addr()),
                    w[0].cidr,
                    w[1].cidr,
                ));
            }
        }
        Ok(Pools(pools))
    }

    /// Parses `--cluster-cidr` (a comma list, one CIDR per family), reserving
    /// `reserved` in whichever pool contains each.
    pub fn parse(list: &str, reserved: &[IpAddr]) -> Result<Self, PoolError> {
        let pools = list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| Pool::new(s.parse()?, reserved.iter().copied()))
            .collect::<Result<Vec<_>, _>>()?;
        if pools.is_empty() {
            return Err(PoolError::Syntax(list.to_string()));
        }
        Pools::new(pools)
    }

    /// The pools, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = &Pool> {
        self.0.iter()
    }

    /// The pool holding `ip`, if any.
    pub fn pool_of(&self, ip: IpAddr) -> Option<&Pool> {
        self.0.iter().find(|p| p.cidr.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parse_and_errors() {
        let c: Cidr = "10.244.0.0/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.0.0/16");
        assert!(c.contains(ip("10.244.255.255")));
        assert!(!c.contains(ip("10.245.0.0")));
        assert!(!c.contains(ip("fd00::1")));
        assert_eq!(
            "10.244.0.1/16".parse::<Cidr>(),
            Err(PoolError::HostBits(
                "10.244.0.1/16".into(),
                "10.244.0.0/16".parse().unwrap()
            ))
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "x/8",
            "10.0.0.0/33",
            "010.0.0.0/8",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!(matches!(
            "fd00::/129".parse::<Cidr>(),
            Err(PoolError::PrefixTooLong(_))
        ));
        assert!("::/0".parse::<Cidr>().is_ok());
    }

    #[test]
    fn v4_pool_skips_network_and_broadcast() {
        let p = Pool::new("10.0.0.0/30".parse().unwrap(), []).unwrap();
        assert_eq!(p.capacity(), 2);
        assert_eq!(p.at(0), ip("10.0.0.1"));
        assert_eq!(p.at(1), ip("10.0.0.2"));
        assert_eq!(p.at(2), ip("10.0.0.1"), "the ring wraps");
        assert!(!p.is_allocatable(ip("10.0.0.0")));
        assert!(!p.is_allocatable(ip("10.0.0.3")));
        // RFC 3021: a /31 has two hosts, a /32 one
        assert_eq!(
            Pool::new("10.0.0.0/31".parse().unwrap(), [])
                .unwrap()
                .capacity(),
            2
        );
        assert_eq!(
            Pool::new("10.0.0.7/32".parse().unwrap(), [])
                .unwrap()
                .capacity(),
            1
        );
    }

    #[test]
    fn v6_pool_skips_anycast_and_handles_huge_prefixes() {
        let p = Pool::new("fd00:10:244::/56".parse().unwrap(), []).unwrap();
        assert_eq!(p.at(0), ip("fd00:10:244::1"));
        assert_eq!(p.capacity(), (1u128 << 72) - 1);
        assert_eq!(
            p.at(p.ring_len() - 1),
            ip("fd00:10:244:ff:ffff:ffff:ffff:ffff")
        );
        assert!(!p.is_allocatable(ip("fd00:10:244::")));
        assert!(matches!(
            Pool::new("::/0".parse().unwrap(), []),
            Err(PoolError::TooLarge(_))
        ));
        assert!(matches!(
            Pool::new("64:ff9b::/120".parse().unwrap(), []),
            Err(PoolError::Nat64Overlap(_))
        ));
        assert!(matches!(
            Pool::new("64::/16".parse().unwrap(), []),
            Err(PoolError::Nat64Overlap(_))
        ));
    }

    #[test]
    fn reserved_addresses_reduce_capacity() {
        let p = Pool::new(
            "10.0.0.0/29".parse().unwrap(),
            [ip("10.0.0.1"), ip("10.0.0.0"), ip("192.168.0.1")],
        )
        .unwrap();
        // 6 hosts, one reserved inside the range; the network address and an
        // outside address do not count twice
        assert_eq!(p.capacity(), 5);
        assert!(!p.is_allocatable(ip("10.0.0.1")));
        assert!(p.is_reserved(ip("10.0.0.1")));
        assert!(matches!(
            Pool::new("10.0.0.4/32".parse().unwrap(), [ip("10.0.0.4")]),
            Err(PoolError::Empty(_))
        ));
    }

    #[test]
    fn pools_one_per_family() {
        let pools = Pools::parse("fd00:10:244::/56, 10.244.0.0/16", &[]).unwrap();
        let fams: Vec<bool> = pools.iter().map(Pool::is_ipv4).collect();
        assert_eq!(fams, vec![true, false], "IPv4 first");
        assert_eq!(
            pools
                .pool_of(ip("10.244.3.4"))
                .map(|p| p.cidr().to_string()),
            Some("10.244.0.0/16".to_string())
        );
        assert!(pools.pool_of(ip("10.0.0.1")).is_none());
        assert!(matches!(
            Pools::parse("10.244.0.0/16,10.245.0.0/16", &[]),
            Err(PoolError::DuplicateFamily("IPv4", _, _))
        ));
        assert!(Pools::parse(" , ", &[]).is_err());
    }
}

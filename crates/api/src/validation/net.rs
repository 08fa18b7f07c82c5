//! Strict parsing of addresses and CIDRs as they appear in specs.
//!
//! "Canonical" means the text is exactly what we would print for the parsed
//! value: IPv4 dotted-quad without leading zeros, IPv6 in RFC 5952 form (lower
//! case, no leading zeros in a group, the longest run of zero groups compressed),
//! and for a CIDR additionally host bits zero and a plain decimal prefix length.
//! Storing only canonical text means string equality is address equality, which
//! the claim names, field selectors and every controller comparison rely on.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::names::NAT64_PREFIX;

/// Why an address or CIDR string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("not an IP address")]
    Address,
    #[error("not a CIDR (expected <address>/<prefix length>)")]
    Cidr,
    #[error("prefix length must be 0-{0}")]
    PrefixRange(u8),
    #[error("not in canonical form, use {0}")]
    NotCanonical(String),
    #[error("IPv4-mapped IPv6 addresses are not allowed, use the IPv4 form {0}")]
    Mapped(String),
    #[error("addresses in 64:ff9b::/96 are reserved (the datapath stores IPv4 there)")]
    Nat64,
}

/// A parsed CIDR with host bits zero: an [`IpNet`] that [`parse_canonical_cidr`]
/// has checked. The newtype carries that rule; the arithmetic is ipnet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Cidr {
    /// The network as an ipnet value.
    pub fn net(&self) -> IpNet {
        self.0
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// The range in the datapath's 128-bit space: the [`addr128`](crate::names::addr128)
    /// of the network and the prefix length there (IPv4 `/n` is `/(96+n)` under
    /// `64:ff9b::/96`). LPM map keys add their own scope bits on top.
    pub fn to_addr128(&self) -> ([u8; 16], u8) {
        let extra = if self.0.addr().is_ipv4() { 96 } else { 0 };
        (crate::names::addr128(self.0.addr()), self.prefix() + extra)
    }

    /// True for an IPv6 CIDR.
    pub fn is_ipv6(&self) -> bool {
        matches!(self.0, IpNet::V6(_))
    }

    /// Whether the two ranges share any address (always false across families).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        // Two prefixes overlap exactly when one contains the other.
        self.0.contains(&other.0) || other.0.contains(&self.0)
    }
}

/// Parse an address, requiring canonical text.
pub fn parse_canonical_ip(s: &str) -> Result<IpAddr, NetError> {
    let ip: IpAddr = s.parse().map_err(|_| NetError::Address)?;
    let canonical = ip.to_string();
    if canonical != s {
        return Err(NetError::NotCanonical(canonical));
    }
    Ok(ip)
}

/// Refuse IPv6 addresses that alias IPv4 ones (IPv4-mapped, or the NAT64
/// prefix the datapath uses for IPv4 keys): a claim on one would collide with
/// the IPv4 address in the datapath's 16-byte key.
pub fn check_not_ipv4_alias(ip: IpAddr) -> Result<(), NetError> {
    if let IpAddr::V6(v6) = ip {
        if let Some(v4) = v6.to_ipv4_mapped() {
            return Err(NetError::Mapped(v4.to_string()));
        }
        if v6.octets()[..12] == NAT64_PREFIX {
            return Err(NetError::Nat64);
        }
    }
    Ok(())
}

/// Parse a CIDR, requiring canonical text (which includes host bits zero).
/// The error for non-canonical input names the canonical form.
///
/// The address is read by the standard library, not by ipnet's own parser, which
/// still takes IPv4 octets with leading zeros (`010.0.0.0/8`) as decimal where
/// other parsers read them as octal.
pub fn parse_canonical_cidr(s: &str) -> Result<Cidr, NetError> {
    let (a, p) = s.split_once('/').ok_or(NetError::Cidr)?;
    let addr: IpAddr = a.parse().map_err(|_| NetError::Cidr)?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 3 {
        return Err(NetError::Cidr);
    }
    let prefix: u8 = p.parse().map_err(|_| NetError::Cidr)?;
    let net = IpNet::new(addr, prefix)
        .map_err(|_| NetError::PrefixRange(if addr.is_ipv4() { 32 } else { 128 }))?;
    let cidr = Cidr(net.trunc());
    let canonical = cidr.to_string();
    if canonical != s {
        return Err(NetError::NotCanonical(canonical));
    }
    Ok(cidr)
}

/// Whether two canonical CIDRs share an address (different families never do).
pub fn cidrs_overlap(a: &str, b: &str) -> bool {
    fn parse(s: &str) -> Option<(std::net::IpAddr, u8)> {
        let (ip, len) = s.split_once('/')?;
        Some((ip.parse().ok()?, len.parse().ok()?))
    }
    let (Some((a, la)), Some((b, lb))) = (parse(a), parse(b)) else {
        // Unparseable (the API server validates CIDRs): assume the worst.
        return true;
    };
    let bits = |ip: std::net::IpAddr| -> (u128, u8) {
        match ip {
            std::net::IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
            std::net::IpAddr::V6(v) => (u128::from(v), 128),
        }
    };
    let ((a, wa), (b, wb)) = (bits(a), bits(b));
    if wa != wb {
        return false;
    }
    let len = u32::from(la.min(lb).min(wa));
    let shift = u32::from(wa) - len;
    let top = |x: u128| x.checked_shr(shift).unwrap_or(0);
    top(a) == top(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_cidrs_parse() {
        for s in [
            "10.0.0.0/8",
            "192.168.1.0/24",
            "0.0.0.0/0",
            "10.0.0.1/32",
            "fd00::/64",
            "2001:db8:1::/48",
            "::/0",
            "fd00::1/128",
        ] {
            let c = parse_canonical_cidr(s).unwrap();
            assert_eq!(c.to_string(), s);
        }
    }

    #[test]
    fn non_canonical_cidrs_name_the_canonical_form() {
        let cases = [
            ("10.0.0.1/8", "10.0.0.0/8"),
            ("192.168.1.77/24", "192.168.1.0/24"),
            ("10.0.0.0/08", "10.0.0.0/8"),
            ("FD00::/64", "fd00::/64"),
            ("fd00:0::/64", "fd00::/64"),
            ("fd00:0:0:0:0:0:0:0/64", "fd00::/64"),
            ("fd00::1/64", "fd00::/64"),
            ("2001:db8:0:0:1:0:0:1/128", "2001:db8::1:0:0:1/128"),
            ("fd00:0abc::/32", "fd00:abc::/32"),
        ];
        for (input, canon) in cases {
            assert_eq!(
                parse_canonical_cidr(input),
                Err(NetError::NotCanonical(canon.to_string())),
                "{input}"
            );
        }
    }

    #[test]
    fn malformed_cidrs_are_refused() {
        for s in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/8/8",
            "x/8",
            "10.0.0.0/ 8",
            "fd00::/1000",
            // leading zeros in an octet: octal to some parsers (ipnet's own parser
            // would read them as decimal, so the address is read by std)
            "010.0.0.0/8",
            "10.0.0.00/32",
        ] {
            assert_eq!(parse_canonical_cidr(s), Err(NetError::Cidr), "{s}");
        }
        assert_eq!(
            parse_canonical_cidr("10.0.0.0/33"),
            Err(NetError::PrefixRange(32))
        );
        assert_eq!(
            parse_canonical_cidr("fd00::/129"),
            Err(NetError::PrefixRange(128))
        );
    }

    #[test]
    fn masks_every_prefix_length() {
        // All ones with every prefix length: the suggested canonical form keeps
        // exactly the prefix's bits.
        let v4 = "255.255.255.255";
        let v6 = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        let network = |s: String| match parse_canonical_cidr(&s) {
            Ok(c) => c.addr(),
            Err(NetError::NotCanonical(canon)) => parse_canonical_cidr(&canon).unwrap().addr(),
            Err(e) => panic!("{s}: {e}"),
        };
        for p in 0..=32u8 {
            let IpAddr::V4(a) = network(format!("{v4}/{p}")) else {
                panic!("family changed")
            };
            assert_eq!(u32::from(a).count_ones(), u32::from(p), "/{p}");
            assert_eq!(u32::from(a).leading_ones(), u32::from(p), "/{p}");
        }
        for p in 0..=128u8 {
            let IpAddr::V6(a) = network(format!("{v6}/{p}")) else {
                panic!("family changed")
            };
            assert_eq!(u128::from(a).leading_ones(), u32::from(p), "/{p}");
            assert_eq!(u128::from(a).count_ones(), u32::from(p), "/{p}");
        }
    }

    #[test]
    fn overlap() {
        let c = |s: &str| parse_canonical_cidr(s).unwrap();
        assert!(c("10.0.0.0/8").overlaps(&c("10.1.0.0/16")));
        assert!(c("10.1.0.0/16").overlaps(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/16").overlaps(&c("10.1.0.0/16")));
        assert!(!c("0.0.0.0/0").overlaps(&c("::/0")));
        assert!(c("fe80::/10").overlaps(&c("fe80::/64")));
    }

    #[test]
    fn cidr_in_128_bit_space() {
        let c = parse_canonical_cidr("10.1.0.0/16").unwrap();
        assert_eq!(
            c.to_addr128(),
            (
                [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 10, 1, 0, 0],
                112
            )
        );
        let c = parse_canonical_cidr("fd00:1::/64").unwrap();
        assert_eq!(
            c.to_addr128(),
            ([0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 64)
        );
    }

    #[test]
    fn ips() {
        assert_eq!(
            parse_canonical_ip("10.0.0.1"),
            Ok("10.0.0.1".parse().unwrap())
        );
        assert_eq!(
            parse_canonical_ip("fd00::1"),
            Ok("fd00::1".parse().unwrap())
        );
        assert_eq!(
            parse_canonical_ip("FD00::1"),
            Err(NetError::NotCanonical("fd00::1".into()))
        );
        assert_eq!(
            parse_canonical_ip("fd00:0:0::1"),
            Err(NetError::NotCanonical("fd00::1".into()))
        );
        assert_eq!(parse_canonical_ip("10.0.0.01"), Err(NetError::Address));
        assert_eq!(parse_canonical_ip("10.0.0.1/32"), Err(NetError::Address));
        assert_eq!(parse_canonical_ip(""), Err(NetError::Address));
        let mapped = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            check_not_ipv4_alias(mapped),
            Err(NetError::Mapped("10.0.0.1".into()))
        );
        assert_eq!(
            check_not_ipv4_alias("64:ff9b::a00:1".parse().unwrap()),
            Err(NetError::Nat64)
        );
        assert_eq!(check_not_ipv4_alias("fd00::1".parse().unwrap()), Ok(()));
        assert_eq!(check_not_ipv4_alias("10.0.0.1".parse().unwrap()), Ok(()));
    }
}

//! Claim names and the datapath's 128-bit address form.
//!
//! # Why names are claims
//! A `Port`, `ServiceVIP` or `FabricIP` object *is* the claim on its address: the
//! object name is derived from the address, so two creates of the same address
//! collide on name uniqueness and the store gives us atomic IPAM without an
//! allocator. That only works if the name is a pure function of the address and
//! the parse is its exact inverse, which is what this module guarantees.
//!
//! | Kind       | Name                       | Example (v4)        | Example (v6)          |
//! |------------|----------------------------|---------------------|-----------------------|
//! | Port       | `v<vni>.<escaped ip>`      | `v100.10.0.0.5`     | `v100.fd00--5`        |
//! | ServiceVIP | `sv<vni>.<escaped ip>`     | `sv100.10.96.0.10`  | `sv100.fd00-1--a`     |
//! | FabricIP   | `f-<escaped ip>`           | `f-10-244-0-7`      | `f-fd00-10--7`        |
//!
//! # The escaping
//! Names must be DNS-1123 subdomains (lower-case `[a-z0-9.-]`, every dot-separated
//! label starting and ending with an alphanumeric), so an IPv6 address cannot be
//! used verbatim. The rule:
//!
//! 1. Write the address in RFC 5952 canonical text, **always in pure hexadecimal**
//!    (`::ffff:102:304`, never the dotted `::ffff:1.2.3.4` form, so every `.` in a
//!    name is an IPv4 separator and the mapping stays injective).
//! 2. Replace every `:` with `-`.
//! 3. If the result starts with `-` (the address starts with `::`) prepend `0`;
//!    if it ends with `-` (the address ends with `::`) append `0`. So `::1` is
//!    `0--1`, `fd00::` is `fd00--0` and `::` is `0--0`. Without this a label could
//!    start or end with a hyphen, which is not a valid name.
//!
//! IPv4 addresses keep their dotted form in `Port`/`ServiceVIP` names (each octet
//! is a valid label); in `FabricIP` names the dots also become `-` (as the prior
//! implementation did), giving exactly three single hyphens and no `--`, while an
//! IPv6 escape always has either seven hyphens or a `--`, so the family is never
//! ambiguous.
//!
//! Parsing reverses the steps and then **re-builds the name and requires it to be
//! byte-identical**, so every address has exactly one name and every accepted name
//! exactly one address (`v100.10.0.0.05`, `0-0-0-0-0-0-0-1` or upper-case hex are
//! rejected rather than silently aliased).
//!
//! # `addr128`
//! The datapath keys every address as 16 bytes in network order; IPv4 is stored in
//! the RFC 6052 well-known-prefix form `64:ff9b::a.b.c.d` (never `::ffff:a.b.c.d`).
//! The consequence is that a real IPv6 address inside `64:ff9b::/96` would alias an
//! IPv4 one, which is why validation refuses such addresses and CIDRs.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The largest VNI a claim can carry. Geneve VNIs are 24 bits, but the datapath
/// uses bit 23 as the "gateway-forwarded" flag, so real VNIs stay below 2^23.
pub const MAX_VNI: u32 = (1 << 23) - 1;

/// The RFC 6052 well-known prefix `64:ff9b::/96` under which IPv4 is stored.
pub const NAT64_PREFIX: [u8; 12] = [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0];

/// Why a string is not a claim name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{0:?} does not start with {1:?}")]
    Prefix(String, &'static str),
    #[error("{0:?}: the VNI must be a decimal number from 1 to {MAX_VNI} without leading zeros")]
    Vni(String),
    #[error("{0:?}: {1:?} is not an escaped IP address")]
    Address(String, String),
    #[error("{0:?} is not canonical; the claim name for that address is {1:?}")]
    NotCanonical(String, String),
}

/// Escape an address for use inside a name (see the module docs).
/// `v4_sep` is the separator IPv4 octets get (`.` or `-`).
fn escape(ip: IpAddr, v4_sep: char) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}{v4_sep}{}{v4_sep}{}{v4_sep}{}", o[0], o[1], o[2], o[3])
        }
        IpAddr::V6(v6) => {
            let mut s = hex_rfc5952(v6).replace(':', "-");
            if s.starts_with('-') {
                s.insert(0, '0');
            }
            if s.ends_with('-') {
                s.push('0');
            }
            s
        }
    }
}

/// Four decimal octets separated by `sep`, each without a leading zero: the
/// only text [`escape`] (or `Display`, with '.') makes of that address, so a
/// match is canonical without formatting it again. `None` for anything else
/// (IPv6, or IPv4 text that is not canonical: the slow path decides).
fn canonical_v4_octets(s: &str, sep: char) -> Option<Ipv4Addr> {
    let mut o = [0u8; 4];
    let mut parts = s.split(sep);
    for slot in &mut o {
        let p = parts.next()?;
        let canonical = match p.as_bytes() {
            [] => false,
            [b'0'] => true,
            [first, ..] => *first != b'0' && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()),
        };
        if !canonical {
            return None;
        }
        *slot = p.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(o))
}

/// The address of canonical dotted-quad text (`10.0.0.1`, never `010.0.0.1`),
/// without allocating: the hot check of every claim the agent compiles.
pub fn canonical_v4(text: &str) -> Option<Ipv4Addr> {
    canonical_v4_octets(text, '.')
}

/// Undo [`escape`] (without the canonical re-check, which the callers do).
fn unescape(s: &str, v4_sep: char) -> Option<IpAddr> {
    // IPv4: exactly four decimal octets separated by `v4_sep`.
    let parts: Vec<&str> = s.split(v4_sep).collect();
    if parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        let mut o = [0u8; 4];
        for (slot, p) in o.iter_mut().zip(&parts) {
            *slot = p.parse().ok()?;
        }
        return Some(IpAddr::V4(Ipv4Addr::from(o)));
    }
    if s.contains('.') || s.contains(':') {
        return None;
    }
    let text = s.replace('-', ":");
    text.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// RFC 5952 text in pure hex: lower case, no leading zeros, the longest run (first
/// on a tie) of two or more zero groups compressed to `::`.
pub fn hex_rfc5952(ip: Ipv6Addr) -> String {
    let seg = ip.segments();
    // Find the longest run of zero groups (length >= 2).
    let (mut best_start, mut best_len) = (0usize, 0usize);
    let mut i = 0;
    while i < 8 {
        if seg[i] == 0 {
            let start = i;
            while i < 8 && seg[i] == 0 {
                i += 1;
            }
            if i - start > best_len {
                best_start = start;
                best_len = i - start;
            }
        } else {
            i += 1;
        }
    }
    let mut out = String::with_capacity(39);
    let write_groups = |out: &mut String, groups: &[u16]| {
        for (n, g) in groups.iter().enumerate() {
            if n > 0 {
                out.push(':');
            }
            // Writing to a String cannot fail.
            let _ = write!(out, "{g:x}");
        }
    };
    if best_len >= 2 {
        write_groups(&mut out, &seg[..best_start]);
        out.push_str("::");
        write_groups(&mut out, &seg[best_start + best_len..]);
    } else {
        write_groups(&mut out, &seg);
    }
    out
}

/// Parse a strictly canonical decimal VNI in 1..=MAX_VNI.
fn parse_vni(name: &str, digits: &str) -> Result<u32, NameError> {
    let ok = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !(digits.len() > 1 && digits.starts_with('0'));
    let vni: u32 = if ok {
        digits
            .parse()
            .map_err(|_| NameError::Vni(name.to_string()))?
    } else {
        0
    };
    if vni == 0 || vni > MAX_VNI {
        return Err(NameError::Vni(name.to_string()));
    }
    Ok(vni)
}

/// The first VNI a VPC gets; 1 is the default network's, 2–99 are reserved.
pub const FIRST_VPC_VNI: u32 = 100;

/// The claim name of a VPC id: `vni-<vni>` (a `VNIClaim`).
pub fn vni_claim_name(vni: u32) -> String {
    format!("vni-{vni}")
}

/// Parse a `VNIClaim` name; the exact inverse of [`vni_claim_name`], for VNIs
/// from [`FIRST_VPC_VNI`] to [`MAX_VNI`].
pub fn parse_vni_claim_name(name: &str) -> Result<u32, NameError> {
    let digits = name
        .strip_prefix("vni-")
        .ok_or_else(|| NameError::Prefix(name.to_string(), "vni-"))?;
    let vni = parse_vni(name, digits)?;
    if vni < FIRST_VPC_VNI {
        return Err(NameError::Vni(name.to_string()));
    }
    Ok(vni)
}

/// The claim name of a VPC address: `v<vni>.<escaped ip>` (a `Port`).
pub fn port_name(vni: u32, ip: IpAddr) -> String {
    format!("v{vni}.{}", escape(ip, '.'))
}

/// The claim name of a ServiceVIP: `sv<vni>.<escaped ip>`.
pub fn service_vip_name(vni: u32, ip: IpAddr) -> String {
    format!("sv{vni}.{}", escape(ip, '.'))
}

/// The claim name of a fabric address: `f-<escaped ip>` (a `FabricIP`).
pub fn fabric_ip_name(ip: IpAddr) -> String {
    format!("f-{}", escape(ip, '-'))
}

fn parse_vni_claim(
    name: &str,
    prefix: &'static str,
    build: fn(u32, IpAddr) -> String,
) -> Result<(u32, IpAddr), NameError> {
    let rest = name
        .strip_prefix(prefix)
        .ok_or_else(|| NameError::Prefix(name.to_string(), prefix))?;
    let (digits, esc) = rest
        .split_once('.')
        .ok_or_else(|| NameError::Vni(name.to_string()))?;
    let vni = parse_vni(name, digits)?;
    let ip =
        unescape(esc, '.').ok_or_else(|| NameError::Address(name.to_string(), esc.to_string()))?;
    let canonical = build(vni, ip);
    if canonical != name {
        return Err(NameError::NotCanonical(name.to_string(), canonical));
    }
    Ok((vni, ip))
}

/// Parse a `Port` claim name back into `(vni, ip)`; the exact inverse of [`port_name`].
pub fn parse_port_name(name: &str) -> Result<(u32, IpAddr), NameError> {
    parse_vni_claim(name, "v", port_name)
}

/// Parse a `ServiceVIP` claim name; the exact inverse of [`service_vip_name`].
pub fn parse_service_vip_name(name: &str) -> Result<(u32, IpAddr), NameError> {
    parse_vni_claim(name, "sv", service_vip_name)
}

/// Parse a `FabricIP` claim name; the exact inverse of [`fabric_ip_name`].
pub fn parse_fabric_ip_name(name: &str) -> Result<IpAddr, NameError> {
    let esc = name
        .strip_prefix("f-")
        .ok_or_else(|| NameError::Prefix(name.to_string(), "f-"))?;
    // Canonical IPv4 (every net-0 claim of an IPv4 cluster) without
    // formatting the name again.
    if let Some(v4) = canonical_v4_octets(esc, '-') {
        return Ok(IpAddr::V4(v4));
    }
    let ip =
        unescape(esc, '-').ok_or_else(|| NameError::Address(name.to_string(), esc.to_string()))?;
    let canonical = fabric_ip_name(ip);
    if canonical != name {
        return Err(NameError::NotCanonical(name.to_string(), canonical));
    }
    Ok(ip)
}

/// The 16-byte datapath key of an address: IPv6 as is, IPv4 as `64:ff9b::a.b.c.d`.
pub fn addr128(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V6(v6) => v6.octets(),
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..12].copy_from_slice(&NAT64_PREFIX);
            out[12..].copy_from_slice(&v4.octets());
            out
        }
    }
}

/// Inverse of [`addr128`]: anything under `64:ff9b::/96` is IPv4.
pub fn from_addr128(bytes: [u8; 16]) -> IpAddr {
    if bytes[..12] == NAT64_PREFIX {
        IpAddr::V4(Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic PRNG (xorshift64*) so the property tests are reproducible
    /// without pulling in a property-testing framework.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// Every zero/non-zero pattern of the eight groups (all `::` placements,
    /// including ties and the all-zero address) with random non-zero groups,
    /// plus fully random addresses and IPv4-mapped ones.
    fn v6_samples() -> Vec<Ipv6Addr> {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut out = Vec::new();
        for pattern in 0u32..256 {
            for _ in 0..4 {
                let mut seg = [0u16; 8];
                for (i, s) in seg.iter_mut().enumerate() {
                    if pattern & (1 << i) != 0 {
                        let r = (rng.next() & 0xffff) as u16;
                        *s = if r == 0 { 1 } else { r };
                    }
                }
                out.push(Ipv6Addr::from(seg));
            }
        }
        for _ in 0..2000 {
            out.push(Ipv6Addr::from(
                ((rng.next() as u128) << 64) | rng.next() as u128,
            ));
        }
        for _ in 0..200 {
            out.push(Ipv4Addr::from(rng.next() as u32).to_ipv6_mapped());
        }
        out
    }

    fn v4_samples() -> Vec<Ipv4Addr> {
        let mut rng = Rng(42);
        let mut out: Vec<Ipv4Addr> = [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.1",
            "1.2.3.4",
            "100.64.0.0",
        ]
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
        for _ in 0..3000 {
            out.push(Ipv4Addr::from(rng.next() as u32));
        }
        out
    }

    fn all_samples() -> Vec<IpAddr> {
        v4_samples()
            .into_iter()
            .map(IpAddr::V4)
            .chain(v6_samples().into_iter().map(IpAddr::V6))
            .collect()
    }

    /// DNS-1123 subdomain, as kube's `IsDNS1123Subdomain`.
    fn is_dns1123_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && l.len() <= 63
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    && b[0] != b'-'
                    && b[b.len() - 1] != b'-'
            })
    }

    #[test]
    fn hex_rfc5952_matches_std_for_non_mapped() {
        for a in v6_samples() {
            if a.to_ipv4_mapped().is_none() {
                assert_eq!(hex_rfc5952(a), a.to_string(), "{:?}", a.segments());
            }
        }
        assert_eq!(
            hex_rfc5952("::ffff:1.2.3.4".parse().unwrap()),
            "::ffff:102:304"
        );
        assert_eq!(
            hex_rfc5952("1:0:0:2:0:0:0:3".parse().unwrap()),
            "1:0:0:2::3"
        );
        assert_eq!(
            hex_rfc5952("1:0:0:2:0:0:3:4".parse().unwrap()),
            "1::2:0:0:3:4"
        );
        assert_eq!(
            hex_rfc5952("1:0:2:3:4:5:6:7".parse().unwrap()),
            "1:0:2:3:4:5:6:7"
        );
    }

    #[test]
    fn port_and_service_vip_names_round_trip() {
        let mut rng = Rng(7);
        for ip in all_samples() {
            let vni = (rng.next() as u32 % MAX_VNI) + 1;
            let n = port_name(vni, ip);
            assert!(is_dns1123_subdomain(&n), "{n} is not a DNS-1123 subdomain");
            assert_eq!(parse_port_name(&n), Ok((vni, ip)), "{n}");
            let s = service_vip_name(vni, ip);
            assert!(is_dns1123_subdomain(&s), "{s}");
            assert_eq!(parse_service_vip_name(&s), Ok((vni, ip)), "{s}");
            // The two kinds never parse as each other.
            assert!(parse_port_name(&s).is_err());
            assert!(parse_service_vip_name(&n).is_err());
        }
    }

    #[test]
    fn fabric_ip_names_round_trip() {
        for ip in all_samples() {
            let n = fabric_ip_name(ip);
            assert!(is_dns1123_subdomain(&n), "{n}");
            assert_eq!(parse_fabric_ip_name(&n), Ok(ip), "{n}");
        }
    }

    /// The allocation-free IPv4 path agrees with formatting: it accepts
    /// exactly the canonical text and leaves every other text to the slow
    /// path (which refuses it, with the canonical name in its error).
    #[test]
    fn the_v4_fast_path_accepts_exactly_the_canonical_text() {
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let v4 = Ipv4Addr::from(rng.next() as u32);
            assert_eq!(canonical_v4(&v4.to_string()), Some(v4));
            assert_eq!(
                parse_fabric_ip_name(&fabric_ip_name(IpAddr::V4(v4))),
                Ok(IpAddr::V4(v4))
            );
        }
        for bad in [
            "010.0.0.1",
            "10.0.0.01",
            "10.0.0.256",
            "10.0.0",
            "10.0.0.1.2",
            "10..0.1",
            "10.0.0.1 ",
            "+10.0.0.1",
            "1000.0.0.1",
            "",
        ] {
            assert_eq!(canonical_v4(bad), None, "{bad}");
        }
        for bad in [
            "f-010-0-0-1",
            "f-10-0-0-01",
            "f-10-0-0-256",
            "f-10-0-0",
            "f-10-0-0-1-2",
        ] {
            assert!(parse_fabric_ip_name(bad).is_err(), "{bad}");
        }
        assert_eq!(canonical_v4("0.0.0.0"), Some(Ipv4Addr::UNSPECIFIED));
        assert_eq!(canonical_v4("255.255.255.255"), Some(Ipv4Addr::BROADCAST));
    }

    #[test]
    fn vni_claim_names_round_trip_and_refuse_the_reserved_and_the_odd() {
        assert_eq!(vni_claim_name(100), "vni-100");
        for vni in [FIRST_VPC_VNI, 4096, MAX_VNI] {
            assert_eq!(parse_vni_claim_name(&vni_claim_name(vni)), Ok(vni));
        }
        for bad in [
            "vni-1",
            "vni-99",
            "vni-0100",
            "vni-",
            "vni-8388608",
            "v100",
            "vni-1e3",
            "vni-+100",
        ] {
            assert!(parse_vni_claim_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_the_documented_strings() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(port_name(100, ip("10.0.0.5")), "v100.10.0.0.5");
        assert_eq!(port_name(100, ip("fd00::5")), "v100.fd00--5");
        assert_eq!(port_name(7, ip("::1")), "v7.0--1");
        assert_eq!(port_name(7, ip("fd00::")), "v7.fd00--0");
        assert_eq!(port_name(7, ip("::")), "v7.0--0");
        assert_eq!(port_name(7, ip("::ffff:1.2.3.4")), "v7.0--ffff-102-304");
        assert_eq!(service_vip_name(100, ip("10.96.0.10")), "sv100.10.96.0.10");
        assert_eq!(fabric_ip_name(ip("10.244.0.7")), "f-10-244-0-7");
        assert_eq!(fabric_ip_name(ip("fd00:10::7")), "f-fd00-10--7");
        assert_eq!(fabric_ip_name(ip("fd00::")), "f-fd00--0");
        assert_eq!(fabric_ip_name(ip("1:2:3:4:5:6:7:8")), "f-1-2-3-4-5-6-7-8");
    }

    #[test]
    fn vni_bounds() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(parse_port_name("v1.10.0.0.1"), Ok((1, ip)));
        assert_eq!(parse_port_name("v8388607.10.0.0.1"), Ok((MAX_VNI, ip)));
        assert_eq!(
            parse_port_name("v8388608.10.0.0.1"),
            Err(NameError::Vni("v8388608.10.0.0.1".into()))
        );
        assert_eq!(
            parse_port_name("v99999999999.10.0.0.1"),
            Err(NameError::Vni("v99999999999.10.0.0.1".into()))
        );
    }

    #[test]
    fn non_canonical_and_malformed_names_are_rejected() {
        for bad in [
            "v0.10.0.0.1",        // VNI 0
            "v016.10.0.0.1",      // leading zero
            "v8388608.10.0.0.1",  // VNI with the gateway flag bit
            "v16777216.10.0.0.1", // VNI > 24 bits
            "v.10.0.0.1",
            "v100",
            "x100.10.0.0.1",
            "v100.10.0.0.01",
            "v100.10.0.0.256",
            "v100.10.0.0",
            "v100.0-0-0-0-0-0-0-1", // uncompressed
            "v100.FD00--1",         // upper case
            "v100.--1",             // missing 0 pad
            "v100.fd00--",
            "v100.fd00:1",
            "v100.0--ffff-1.2.3.4",
            "v+100.10.0.0.1",
        ] {
            assert!(parse_port_name(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            parse_port_name("v100.10.0.0.01"),
            Err(NameError::NotCanonical(
                "v100.10.0.0.01".into(),
                "v100.10.0.0.1".into()
            ))
        );
        for bad in [
            "f-10.0.0.1",
            "f-10-0-0",
            "f--1",
            "f-fd00--",
            "f-010-0-0-1",
            "fabric-10-0-0-1",
            "f-1-2-3-4-5",
        ] {
            assert!(parse_fabric_ip_name(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn addr128_locks_the_bytes() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            addr128(v4),
            [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 10, 1, 2, 3]
        );
        let v6: IpAddr = "fd00::1:2".parse().unwrap();
        assert_eq!(
            addr128(v6),
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2]
        );
        // Same bytes as the textual RFC 6052 address.
        let wkp: Ipv6Addr = "64:ff9b::10.1.2.3".parse().unwrap();
        assert_eq!(addr128(v4), wkp.octets());
        // IPv4-mapped stays IPv6 (only the NAT64 prefix means IPv4).
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(from_addr128(addr128(mapped)), mapped);
    }

    #[test]
    fn addr128_round_trips_outside_the_nat64_prefix() {
        for ip in all_samples() {
            if let IpAddr::V6(v6) = ip {
                if v6.octets()[..12] == NAT64_PREFIX {
                    continue;
                }
            }
            assert_eq!(from_addr128(addr128(ip)), ip);
        }
    }
}

//! Small value types: MAC addresses and IP prefixes.
//!
//! A prefix always carries its own length and the length is checked against the
//! address family (lesson 16 of the upstream notes: an 8-byte mask on a 16-byte
//! address silently became `/0` and hijacked a node's default route).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::error::{Error, Result};

/// An Ethernet (EUI-48) address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The MAC every node's overlay device shares, so decapsulated frames are addressed
    /// to the receiving host (lesson 10).
    pub const OVERLAY: MacAddr = MacAddr([0x02, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf]);

    /// Parses the raw bytes of a netlink address attribute.
    pub fn from_bytes(bytes: &[u8]) -> Option<MacAddr> {
        <[u8; 6]>::try_from(bytes).ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<MacAddr> {
        let bad = || Error::invalid("MAC address", format!("{s:?}: want xx:xx:xx:xx:xx:xx"));
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

/// An address with a prefix length valid for its family (`10.0.0.5/32`, `fd00::5/128`).
///
/// A thin newtype over [`IpNet`] (which does the arithmetic): it adds the netlink
/// module's error type and a different text form, where a bare address is a host
/// prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPrefix(IpNet);

impl IpPrefix {
    /// Checks `len` against the family: at most 32 for IPv4, 128 for IPv6.
    pub fn new(addr: IpAddr, len: u8) -> Result<IpPrefix> {
        IpNet::new(addr, len).map(IpPrefix).map_err(|_| {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            Error::invalid(
                "prefix length",
                format!("{addr}/{len}: at most {max} for this family"),
            )
        })
    }

    /// A single host: `/32` for IPv4, `/128` for IPv6.
    pub fn host(addr: IpAddr) -> IpPrefix {
        IpPrefix(IpNet::from(addr))
    }

    /// The default route of the address's family (`0.0.0.0/0` or `::/0`).
    pub fn default_for(addr: IpAddr) -> IpPrefix {
        IpPrefix(match addr {
            IpAddr::V4(_) => IpNet::V4(Ipv4Net::default()),
            IpAddr::V6(_) => IpNet::V6(Ipv6Net::default()),
        })
    }

    /// The address as given (host bits are kept: this is also an interface address).
    pub fn addr(&self) -> IpAddr {
        self.0.addr()
    }

    /// The prefix length.
    pub fn len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// True for `/0`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The network address (host bits cleared): what a route destination must be.
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }
}

impl From<IpNet> for IpPrefix {
    fn from(net: IpNet) -> IpPrefix {
        IpPrefix(net)
    }
}

impl From<IpPrefix> for IpNet {
    fn from(p: IpPrefix) -> IpNet {
        p.0
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for IpPrefix {
    type Err = Error;

    /// Parses `addr/len`; a bare address is a host prefix. The address is read
    /// by the standard library (ipnet's own parser takes `010.0.0.1` as decimal).
    fn from_str(s: &str) -> Result<IpPrefix> {
        let bad = |why: &str| Error::invalid("IP prefix", format!("{s:?}: {why}"));
        match s.split_once('/') {
            None => Ok(IpPrefix::host(s.parse().map_err(|_| bad("bad address"))?)),
            Some((a, l)) => IpPrefix::new(
                a.parse().map_err(|_| bad("bad address"))?,
                l.parse().map_err(|_| bad("bad prefix length"))?,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips_and_rejects_garbage() {
        let m: MacAddr = "02:cf:cf:cf:cf:cf".parse().unwrap();
        assert_eq!(m, MacAddr::OVERLAY);
        assert_eq!(m.to_string(), "02:cf:cf:cf:cf:cf");
        for bad in [
            "",
            "02:cf:cf:cf:cf",
            "02:cf:cf:cf:cf:cf:00",
            "2:cf:cf:cf:cf:cf",
            "zz:cf:cf:cf:cf:cf",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} accepted");
        }
        assert_eq!(MacAddr::from_bytes(&[1, 2, 3]), None);
    }

    #[test]
    fn prefix_length_is_checked_per_family() {
        assert!("10.0.0.1/33".parse::<IpPrefix>().is_err());
        assert!("fd00::1/129".parse::<IpPrefix>().is_err());
        // A v6 address with a 64-bit prefix is fine; the length is never reinterpreted.
        let p: IpPrefix = "fd00::1/64".parse().unwrap();
        assert_eq!(p.len(), 64);
        assert_eq!(IpPrefix::host("fd00::1".parse().unwrap()).len(), 128);
        assert_eq!(IpPrefix::host("10.1.2.3".parse().unwrap()).len(), 32);
        assert_eq!("10.1.2.3".parse::<IpPrefix>().unwrap().len(), 32);
        assert!("10.1.2.3/x".parse::<IpPrefix>().is_err());
        assert!("010.1.2.3/32".parse::<IpPrefix>().is_err());
        assert!("010.1.2.3".parse::<IpPrefix>().is_err());
    }

    #[test]
    fn network_clears_host_bits() {
        let p: IpPrefix = "10.1.2.3/16".parse().unwrap();
        assert_eq!(p.network().to_string(), "10.1.0.0");
        let p: IpPrefix = "fd00:1:2:3::9/48".parse().unwrap();
        assert_eq!(p.network().to_string(), "fd00:1:2::");
        let p = IpPrefix::default_for("10.0.0.1".parse().unwrap());
        assert_eq!(p.to_string(), "0.0.0.0/0");
        assert_eq!(p.network().to_string(), "0.0.0.0");
        assert!(p.is_empty());
    }
}

//! The neutral (version-independent) attachment result.
//!
//! The agent answers with this shape, [`crate::result`] renders it for the
//! runtime's cniVersion, and a `prevResult` of any supported version parses
//! back into it. Its JSON form is the CNI 1.1.0 result minus `cniVersion`, so
//! it is readable on the wire and a superset of every older result.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An address with a prefix length, written in CIDR notation (`10.1.0.5/32`).
///
/// The address keeps its host bits: a CNI result says "this interface has
/// 10.1.0.5/24", not "the network 10.1.0.0/24". [`IpNet`] keeps them too
/// (its `trunc()` is the network) and prints `addr/len`, which is the CNI text.
pub use ipnet::IpNet;

/// Why a CIDR string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {input:?}: {reason}")]
pub struct PrefixParseError {
    input: String,
    reason: &'static str,
}

/// Parses `addr/len` as a CNI result writes it, keeping host bits.
///
/// The address is read by the standard library rather than ipnet's own
/// parser, which still takes IPv4 octets with leading zeros (`010.0.0.1`) as
/// decimal where other tools read them as octal.
pub fn parse_prefix(s: &str) -> Result<IpNet, PrefixParseError> {
    let err = |reason| PrefixParseError {
        input: s.to_owned(),
        reason,
    };
    let (addr, len) = s.split_once('/').ok_or_else(|| err("missing '/len'"))?;
    let addr: IpAddr = addr.parse().map_err(|_| err("bad address"))?;
    // u8::from_str accepts a leading '+', which no CIDR writer emits
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("bad prefix length"));
    }
    let len: u8 = len.parse().map_err(|_| err("bad prefix length"))?;
    IpNet::new(addr, len).map_err(|_| err("prefix length too long for the family"))
}

/// Serde for an [`IpNet`] field as CNI text (`"10.1.0.5/24"`), parsed by
/// [`parse_prefix`] so a bad value names itself in the error.
mod prefix_text {
    use super::{parse_prefix, IpNet};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &IpNet, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(p)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
        let s = String::deserialize(d)?;
        parse_prefix(&s).map_err(serde::de::Error::custom)
    }
}

/// An interface created by the attachment (in the sandbox or on the host).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// The interface name.
    pub name: String,
    /// The hardware address, if L2 addresses are meaningful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The MTU (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path for sandbox interfaces; absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// A socket path for this interface (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// A PCI id for this interface (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "pciID")]
    pub pci_id: Option<String>,
}

/// An address assigned by the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The address in CIDR notation, host bits kept.
    #[serde(with = "prefix_text")]
    pub address: IpNet,
    /// The default gateway for this subnet, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into [`AttachmentResult::interfaces`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
}

/// A route created by the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The destination in CIDR notation.
    #[serde(with = "prefix_text")]
    pub dst: IpNet,
    /// The next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Path MTU (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority, lower is preferred (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Route scope: 0 global, 253 link, 254 host (1.1.0 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    /// A plain route (destination and optional next hop), valid in every version.
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        Self {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings for the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Nameserver addresses, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// The result of an attachment, independent of the CNI version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentResult {
    /// Interfaces created.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes created.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default)]
    pub dns: Dns,
}

/// Why a result is inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    /// An `ips[].interface` index points past the `interfaces` list.
    #[error("ips[{ip}].interface = {index} but there are only {count} interfaces")]
    InterfaceIndex {
        /// Position in `ips`.
        ip: usize,
        /// The bad index.
        index: u32,
        /// `interfaces.len()`.
        count: usize,
    },
    /// An interface has an empty name.
    #[error("interfaces[{0}].name is empty")]
    EmptyInterfaceName(usize),
    /// A gateway's family differs from its address's family.
    #[error("ips[{0}]: gateway and address are of different IP families")]
    GatewayFamily(usize),
}

impl AttachmentResult {
    /// Checks the internal references a runtime relies on.
    pub fn validate(&self) -> Result<(), ResultError> {
        for (i, iface) in self.interfaces.iter().enumerate() {
            if iface.name.is_empty() {
                return Err(ResultError::EmptyInterfaceName(i));
            }
        }
        for (i, ip) in self.ips.iter().enumerate() {
            if let Some(index) = ip.interface {
                if index as usize >= self.interfaces.len() {
                    return Err(ResultError::InterfaceIndex {
                        ip: i,
                        index,
                        count: self.interfaces.len(),
                    });
                }
            }
            if let Some(gw) = ip.gateway {
                if gw.is_ipv4() != ip.address.addr().is_ipv4() {
                    return Err(ResultError::GatewayFamily(i));
                }
            }
        }
        Ok(())
    }

    /// Appends `self` after a chained `prev` result: the spec says a plugin
    /// given a `prevResult` must output it, with its own changes included.
    /// Our interface indexes shift by the number of interfaces already there.
    pub fn chained_after(self, prev: AttachmentResult) -> AttachmentResult {
        let offset = u32::try_from(prev.interfaces.len()).unwrap_or(u32::MAX);
        let mut out = prev;
        out.interfaces.extend(self.interfaces);
        out.ips.extend(self.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i.saturating_add(offset));
            ip
        }));
        out.routes.extend(self.routes);
        if out.dns.is_empty() {
            out.dns = self.dns;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trips_and_rejects_junk() {
        for s in ["10.1.0.5/32", "0.0.0.0/0", "fd00::5/128", "::/0"] {
            assert_eq!(parse_prefix(s).map(|p| p.to_string()).as_deref(), Ok(s));
        }
        for s in [
            "10.1.0.5",
            "10.1.0.5/33",
            "fd00::/129",
            "x/8",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            // octal to some parsers; ipnet's own parser would take it as decimal
            "010.1.0.5/32",
        ] {
            assert!(parse_prefix(s).is_err(), "{s}");
        }
        assert_eq!(
            parse_prefix("10.1.0.5/33").unwrap_err().to_string(),
            "invalid CIDR \"10.1.0.5/33\": prefix length too long for the family"
        );
    }

    #[test]
    fn wire_prefixes_keep_host_bits() {
        // An interface address inside its prefix, as a runtime's prevResult has it.
        let json = r#"{"address":"10.244.1.5/24","gateway":"10.244.1.1"}"#;
        let ip: IpConfig = serde_json::from_str(json).unwrap();
        assert_eq!(ip.address.addr().to_string(), "10.244.1.5");
        assert_eq!(ip.address.prefix_len(), 24);
        assert_eq!(ip.address.trunc().to_string(), "10.244.1.0/24");
        assert_eq!(serde_json::to_string(&ip).unwrap(), json);
        let route: Route = serde_json::from_str(r#"{"dst":"fd00:1::9/64"}"#).unwrap();
        assert_eq!(route.dst.to_string(), "fd00:1::9/64");
        let err = serde_json::from_str::<Route>(r#"{"dst":"10.0.0.0/+8"}"#).unwrap_err();
        assert!(
            err.to_string().contains("invalid CIDR \"10.0.0.0/+8\""),
            "{err}"
        );
    }

    #[test]
    fn validate_catches_dangling_interface_index_and_family_mix() {
        let mut r = AttachmentResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.0.0.2/32".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        assert_eq!(r.validate(), Ok(()));
        r.ips[0].interface = Some(1);
        assert_eq!(
            r.validate(),
            Err(ResultError::InterfaceIndex {
                ip: 0,
                index: 1,
                count: 1
            })
        );
        r.ips[0].interface = Some(0);
        r.ips[0].gateway = Some("fe80::1".parse().unwrap());
        assert_eq!(r.validate(), Err(ResultError::GatewayFamily(0)));
    }

    #[test]
    fn chaining_shifts_our_interface_indexes() {
        let prev = AttachmentResult {
            interfaces: vec![Interface {
                name: "lo-ish".into(),
                ..Default::default()
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let ours = AttachmentResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.0.0.2/32".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            dns: Dns {
                nameservers: vec!["1.1.1.1".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let merged = ours.chained_after(prev);
        assert_eq!(merged.interfaces.len(), 2);
        assert_eq!(merged.ips[0].interface, Some(1));
        // the earlier plugin's DNS wins: we add, we do not override
        assert_eq!(merged.dns.nameservers, vec!["10.96.0.10".to_string()]);
        assert_eq!(merged.validate(), Ok(()));
    }
}

//! `--service-cluster-ip-range` and `--service-node-port-range`: parsed and
//! checked as kube-apiserver checks them.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// kube-apiserver's default service range when the flag is not given
/// (`DefaultServiceIPCIDR`, with a warning at start).
pub const DEFAULT_SERVICE_CIDR: &str = "10.0.0.0/24";

/// kube-apiserver's default node port range.
pub const DEFAULT_NODE_PORT_RANGE: PortRange = PortRange {
    first: 30000,
    last: 32767,
};

/// The most host bits a service range may have: 20, as kube-apiserver
/// (`/12` for IPv4, `/108` for IPv6); each allocated IP is an object.
pub const MAX_HOST_BITS: u8 = 20;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The API's spelling (`IPv4`, `IPv6`).
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Parse the API's spelling.
    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }
}

/// Why a flag value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceFlagError {
    #[error("{value:?} is not a CIDR (like 10.96.0.0/16 or fd00:10:96::/112)")]
    NotACidr { value: String },
    #[error("empty; give one CIDR, or two of different IP families separated by a comma")]
    Empty,
    #[error("{count} ranges given; at most two (one IPv4, one IPv6)")]
    TooMany { count: usize },
    #[error("{first} and {second} are both {family}; a dual-stack range needs one of each family")]
    SameFamily {
        first: IpNet,
        second: IpNet,
        family: &'static str,
    },
    #[error("{cidr} is too large; the mask must be >= {min_prefix} for {family} (at most 2^20 addresses)")]
    TooLarge {
        cidr: IpNet,
        min_prefix: u8,
        family: &'static str,
    },
    #[error("{cidr} is too small; it must hold at least 4 addresses")]
    TooSmall { cidr: IpNet },
    #[error("{value:?} is not a port range (like 30000-32767, or 30000+2767)")]
    NotAPortRange { value: String },
    #[error("{value:?}: the ports must be 1-65535 and the first no larger than the last")]
    BadPortRange { value: String },
}

/// The service IP ranges: one, or two of different families (the first
/// is the primary: single-stack Services get its family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCidrs {
    cidrs: Vec<IpNet>,
}

impl ServiceCidrs {
    /// The ranges, primary first.
    pub fn cidrs(&self) -> &[IpNet] {
        &self.cidrs
    }

    /// The primary range's family.
    pub fn primary(&self) -> Family {
        self.cidrs
            .first()
            .map(|c| Family::of(&c.network()))
            .unwrap_or(Family::V4)
    }

    /// Whether both families are configured.
    pub fn dual_stack(&self) -> bool {
        self.cidrs.len() == 2
    }

    /// The range of `family`, if configured.
    pub fn of(&self, family: Family) -> Option<&IpNet> {
        self.cidrs
            .iter()
            .find(|c| Family::of(&c.network()) == family)
    }

    /// `a,b` as given to the flag.
    pub fn to_flag(&self) -> String {
        self.cidrs
            .iter()
            .map(IpNet::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Default for ServiceCidrs {
    fn default() -> Self {
        ServiceCidrs {
            cidrs: vec![IpNet::V4(ipnet::Ipv4Net::new_assert(
                std::net::Ipv4Addr::new(10, 0, 0, 0),
                24,
            ))],
        }
    }
}

impl FromStr for ServiceCidrs {
    type Err = ServiceFlagError;

    /// One CIDR or two of different families, comma-separated. Host bits
    /// are dropped (`10.96.0.1/16` is `10.96.0.0/16`), as kube's parser
    /// does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if parts.is_empty() {
            return Err(ServiceFlagError::Empty);
        }
        if parts.len() > 2 {
            return Err(ServiceFlagError::TooMany { count: parts.len() });
        }
        let mut cidrs = Vec::new();
        for p in parts {
            let cidr: IpNet = p.parse().map_err(|_| ServiceFlagError::NotACidr {
                value: p.to_string(),
            })?;
            let cidr = cidr.trunc();
            let family = Family::of(&cidr.network());
            let host_bits = cidr.max_prefix_len() - cidr.prefix_len();
            if host_bits > MAX_HOST_BITS {
                return Err(ServiceFlagError::TooLarge {
                    cidr,
                    min_prefix: cidr.max_prefix_len() - MAX_HOST_BITS,
                    family: family.name(),
                });
            }
            if host_bits < 2 {
                return Err(ServiceFlagError::TooSmall { cidr });
            }
            cidrs.push(cidr);
        }
        if let [a, b] = cidrs[..] {
            if Family::of(&a.network()) == Family::of(&b.network()) {
                return Err(ServiceFlagError::SameFamily {
                    first: a,
                    second: b,
                    family: Family::of(&a.network()).name(),
                });
            }
        }
        Ok(ServiceCidrs { cidrs })
    }
}

/// A node port range, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: i64) -> bool {
        (i64::from(self.first)..=i64::from(self.last)).contains(&port)
    }

    /// How many ports.
    pub fn size(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl Default for PortRange {
    fn default() -> Self {
        DEFAULT_NODE_PORT_RANGE
    }
}

impl FromStr for PortRange {
    type Err = ServiceFlagError;

    /// `first-last`, `first+size-1` or a single port, as kube's flag.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value = s.trim();
        let not = || ServiceFlagError::NotAPortRange {
            value: s.to_string(),
        };
        let bad = || ServiceFlagError::BadPortRange {
            value: s.to_string(),
        };
        let num = |t: &str| t.trim().parse::<u32>().map_err(|_| not());
        let (first, last) = if let Some((a, b)) = value.split_once('-') {
            (num(a)?, num(b)?)
        } else if let Some((a, b)) = value.split_once('+') {
            let a = num(a)?;
            (a, a.checked_add(num(b)?).ok_or_else(bad)?)
        } else {
            let a = num(value)?;
            (a, a)
        };
        let port = |p: u32| u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(bad);
        let (first, last) = (port(first)?, port(last)?);
        if first > last {
            return Err(bad());
        }
        Ok(PortRange { first, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ranges_parse_as_kube_apiserver_checks_them() {
        let one: ServiceCidrs = "10.96.0.0/16".parse().unwrap_or_default();
        assert_eq!(one.to_flag(), "10.96.0.0/16");
        assert!(!one.dual_stack());
        let two: Result<ServiceCidrs, _> = "fd00:10:96::/112, 10.96.0.0/16".parse();
        let two = two.map(|c| (c.primary(), c.dual_stack(), c.to_flag()));
        assert_eq!(
            two,
            Ok((Family::V6, true, "fd00:10:96::/112,10.96.0.0/16".into()))
        );
        assert_eq!(
            "10.96.0.7/16".parse::<ServiceCidrs>().map(|c| c.to_flag()),
            Ok("10.96.0.0/16".into())
        );
        let err = |s: &str| s.parse::<ServiceCidrs>().err().map(|e| e.to_string());
        assert!(err("10.96.0.0").is_some_and(|e| e.contains("is not a CIDR")));
        assert!(err("").is_some_and(|e| e.contains("empty")));
        assert!(err("10.0.0.0/24,10.1.0.0/24").is_some_and(|e| e.contains("both IPv4")));
        assert!(
            err("10.0.0.0/24,fd00::/112,10.1.0.0/24").is_some_and(|e| e.contains("at most two"))
        );
        assert!(err("10.0.0.0/8").is_some_and(|e| e.contains("the mask must be >= 12 for IPv4")));
        assert!(err("fd00::/64").is_some_and(|e| e.contains("the mask must be >= 108 for IPv6")));
        assert!(err("10.0.0.0/31").is_some_and(|e| e.contains("too small")));
        assert_eq!(ServiceCidrs::default().to_flag(), DEFAULT_SERVICE_CIDR);
    }

    #[test]
    fn node_port_ranges_parse_as_kube_flags() {
        let r = |s: &str| s.parse::<PortRange>().map(|r| r.to_string());
        assert_eq!(r("30000-32767"), Ok("30000-32767".into()));
        assert_eq!(r("30000+100"), Ok("30000-30100".into()));
        assert_eq!(r("31000"), Ok("31000-31000".into()));
        assert!(r("x-1").is_err_and(|e| e.to_string().contains("not a port range")));
        assert!(r("0-100").is_err_and(|e| e.to_string().contains("1-65535")));
        assert!(r("200-100").is_err());
        assert!(r("65000-70000").is_err());
        assert_eq!(PortRange::default().size(), 2768);
    }
}

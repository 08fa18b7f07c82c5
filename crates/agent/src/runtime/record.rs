//! The rebuild record: what the agent writes into a host veth's alias.
//!
//! The per-pod datapath state (`ports`, `locals`, the tcx links) is written
//! by CNI ADDs and cannot be derived from the API, so after a restart or an
//! incompatible-map upgrade the agent needs a record of it that lives as
//! long as the pod's interface does: the host veth's alias (docs/lessons.md #22).
//! It dies with the veth, so it can never describe a pod that is gone.
//!
//! Format, one line of space-separated fields (CNI container ids and
//! interface names contain no spaces):
//!
//! ```text
//! cp1 <container id> <ifname> <pod mac> <addr>[,<addr>]
//! cp1 <container id> <ifname> <pod mac> <addr>[,<addr>] n<vni> <fabric addr>[,<fabric addr>]
//! cp1 <container id> <ifname> <pod mac> <addr>[,<addr>] n<vni> <fabric addr>[,<fabric addr>] c<cookie>
//! ```
//!
//! The second form is a VPC pod: `<addr>` are its VPC addresses (inside the
//! pod), `n<vni>` its network, and the fabric addresses the net-0 ones the
//! host routes to the veth (the dual-address bridge). A net-0 pod's fabric
//! addresses are its own addresses. `s<vni>` instead of `n<vni>` marks a
//! pod severed from its VPC (its binding was revoked): a restarted agent
//! restores it quarantined, never connected. `c<cookie>` is the pod
//! network namespace's cookie (decimal), the key of its `cp_netns` entry
//! (the socket-LB programs look its sockets' frontends up under its VPC);
//! records written before that entry existed lack it.

use std::net::IpAddr;

/// Version tag of the record format.
const TAG: &str = "cp1";

/// The alias of a veth whose deletion has begun (DEL answers before the
/// kernel finishes deleting it). Not a record: a restarted agent must not
/// restore its state, only finish the deletion.
pub const DELETING: &str = "cp-deleting";

/// One attachment as recorded on its host veth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod interface's MAC.
    pub pod_mac: [u8; 6],
    /// The addresses inside the pod (a VPC pod's: in its VPC).
    pub addresses: Vec<IpAddr>,
    /// The pod's network (0: default; else its VPC's VNI).
    pub net: u32,
    /// The pod's net-0 addresses (the same as `addresses` on net 0).
    pub fabric: Vec<IpAddr>,
    /// Cut off from its VPC (quarantined) until a new attach.
    pub severed: bool,
    /// A VPC pod's network namespace cookie (`SO_NETNS_COOKIE`), if recorded.
    pub netns_cookie: Option<u64>,
}

impl Record {
    /// The alias text.
    pub fn encode(&self) -> String {
        let list = |a: &[IpAddr]| {
            a.iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut text = format!(
            "{TAG} {} {} {} {}",
            self.container_id,
            self.ifname,
            format_mac(self.pod_mac),
            list(&self.addresses)
        );
        if self.net != 0 {
            let tag = if self.severed { 's' } else { 'n' };
            text.push_str(&format!(" {tag}{} {}", self.net, list(&self.fabric)));
            if let Some(c) = self.netns_cookie {
                text.push_str(&format!(" c{c}"));
            }
        }
        text
    }

    /// Parses an alias; `None` if it is not a record of ours.
    pub fn decode(alias: &str) -> Option<Record> {
        let mut f = alias.split(' ');
        if f.next()? != TAG {
            return None;
        }
        let container_id = f.next().filter(|s| !s.is_empty())?.to_string();
        let ifname = f.next().filter(|s| !s.is_empty())?.to_string();
        let pod_mac = parse_mac(f.next()?)?;
        let addresses = parse_list(f.next()?)?;
        let (net, fabric, severed, netns_cookie) = match f.next() {
            None => (0, addresses.clone(), false, None),
            Some(n) => {
                let (severed, digits) = match n.strip_prefix('n') {
                    Some(d) => (false, d),
                    None => (true, n.strip_prefix('s')?),
                };
                let net: u32 = digits.parse().ok().filter(|n| *n != 0)?;
                let fabric = parse_list(f.next()?)?;
                let cookie = match f.next() {
                    None => None,
                    Some(c) => Some(c.strip_prefix('c')?.parse().ok().filter(|c| *c != 0)?),
                };
                (net, fabric, severed, cookie)
            }
        };
        if f.next().is_some() {
            return None;
        }
        Some(Record {
            container_id,
            ifname,
            pod_mac,
            addresses,
            net,
            fabric,
            severed,
            netns_cookie,
        })
    }
}

/// `aa:bb:cc:dd:ee:ff`.
/// A non-empty comma list of addresses.
fn parse_list(text: &str) -> Option<Vec<IpAddr>> {
    let list = text
        .split(',')
        .map(|a| a.parse().ok())
        .collect::<Option<Vec<IpAddr>>>()?;
    (!list.is_empty()).then_some(list)
}

pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            container_id: "0123abcd".into(),
            ifname: "eth0".into(),
            pod_mac: [0x0a, 0x58, 0, 1, 0xfe, 0xff],
            addresses: vec!["10.244.3.7".parse().unwrap(), "fd00::7".parse().unwrap()],
            net: 0,
            fabric: vec!["10.244.3.7".parse().unwrap(), "fd00::7".parse().unwrap()],
            severed: false,
            netns_cookie: None,
        }
    }

    #[test]
    fn vpc_records_round_trip_and_fit() {
        let r = Record {
            container_id: "f".repeat(64),
            net: 8_388_607,
            addresses: vec![
                "255.255.255.254".parse().unwrap(),
                "fd00:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap(),
            ],
            fabric: vec![
                "10.244.255.254".parse().unwrap(),
                "fd11:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap(),
            ],
            netns_cookie: Some(u64::MAX),
            ..sample()
        };
        let text = r.encode();
        assert!(
            text.len() <= cozyplane_datapath::netlink::MAX_ALIAS_LEN,
            "{}",
            text.len()
        );
        assert_eq!(Record::decode(&text), Some(r.clone()));
        // A record of an agent before cp_netns: no cookie.
        let old = Record {
            netns_cookie: None,
            ..r
        };
        assert!(!old.encode().contains(" c"));
        assert_eq!(Record::decode(&old.encode()), Some(old));
        assert_eq!(
            Record::decode("cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 s100 10.244.0.1 c4097")
                .and_then(|r| r.netns_cookie.filter(|_| r.severed)),
            Some(4097)
        );
        for bad in [
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100 10.244.0.1 c0",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100 10.244.0.1 4097",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100 10.244.0.1 cx",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100 10.244.0.1 c1 c2",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100 10.244.0.1 x",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n0 10.244.0.1",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 n100",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 100 10.244.0.1",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn records_round_trip() {
        let r = sample();
        let text = r.encode();
        assert_eq!(
            text,
            "cp1 0123abcd eth0 0a:58:00:01:fe:ff 10.244.3.7,fd00::7"
        );
        assert_eq!(Record::decode(&text), Some(r));
    }

    #[test]
    fn foreign_or_damaged_aliases_are_not_records() {
        for bad in [
            "",
            "some admin note",
            DELETING,
            "cp2 a eth0 0a:58:00:01:fe:ff 10.0.0.1",
            "cp1 a eth0 0a:58:00:01:fe 10.0.0.1",
            "cp1 a eth0 0a:58:00:01:fe:ff",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.300",
            "cp1 a eth0 0a:58:00:01:fe:ff 10.0.0.1 extra",
            "cp1  eth0 0a:58:00:01:fe:ff 10.0.0.1",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_long_container_id_still_fits_an_alias() {
        let r = Record {
            container_id: "f".repeat(64),
            ..sample()
        };
        assert!(r.encode().len() <= cozyplane_datapath::netlink::MAX_ALIAS_LEN);
    }
}

//! Routes and permanent neighbour entries.

use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteScope, RouteType,
};
use netlink_packet_route::AddressFamily;
use rtnetlink::RouteMessageBuilder;

use super::error::{Error, Result};
use super::handle::NlHandle;
use super::types::{IpPrefix, MacAddr};

/// Route scope, as far as cozyplane needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Reaches beyond this host (the default for routes with a gateway).
    Universe,
    /// Directly on the link: no gateway, the destination answers ARP/ND itself.
    Link,
    /// This host only.
    Host,
    /// Anything else the kernel reports.
    Other(u8),
}

impl From<Scope> for RouteScope {
    fn from(s: Scope) -> RouteScope {
        match s {
            Scope::Universe => RouteScope::Universe,
            Scope::Link => RouteScope::Link,
            Scope::Host => RouteScope::Host,
            Scope::Other(v) => RouteScope::from(v),
        }
    }
}

impl From<RouteScope> for Scope {
    fn from(s: RouteScope) -> Scope {
        match s {
            RouteScope::Universe => Scope::Universe,
            RouteScope::Link => Scope::Link,
            RouteScope::Host => Scope::Host,
            other => Scope::Other(u8::from(other)),
        }
    }
}

/// A unicast route to add, delete, or as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix (host bits must be clear).
    pub dst: IpPrefix,
    /// Next hop, if any (same family as `dst`).
    pub gateway: Option<IpAddr>,
    /// Output device.
    pub oif: Option<u32>,
    /// Scope.
    pub scope: Scope,
    /// `RTNH_F_ONLINK`: treat the gateway as on-link even without a covering route.
    pub onlink: bool,
    /// Routing table (254 = main).
    pub table: u32,
    /// Preferred source address.
    pub pref_src: Option<IpAddr>,
}

impl Route {
    /// The main table's route table id.
    pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

    /// A route to `dst` straight out of device `oif` (scope link): e.g. a node's /32 to
    /// one of its pods, or a pod's /32 to its on-link gateway.
    pub fn on_link(dst: IpPrefix, oif: u32) -> Route {
        Route {
            dst,
            gateway: None,
            oif: Some(oif),
            scope: Scope::Link,
            onlink: false,
            table: Route::MAIN_TABLE,
            pref_src: None,
        }
    }

    /// A route to `dst` via `gateway` out of `oif` (scope universe).
    pub fn via(dst: IpPrefix, gateway: IpAddr, oif: u32) -> Route {
        Route {
            dst,
            gateway: Some(gateway),
            oif: Some(oif),
            scope: Scope::Universe,
            onlink: false,
            table: Route::MAIN_TABLE,
            pref_src: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.dst.addr() != self.dst.network() {
            return Err(Error::invalid(
                "route destination",
                format!(
                    "{} has host bits set (want {}/{})",
                    self.dst,
                    self.dst.network(),
                    self.dst.len()
                ),
            ));
        }
        for (what, ip) in [
            ("gateway", self.gateway),
            ("preferred source", self.pref_src),
        ] {
            if let Some(ip) = ip {
                if ip.is_ipv4() != self.dst.addr().is_ipv4() {
                    return Err(Error::invalid(
                        "route",
                        format!("{what} {ip} is not in the family of {}", self.dst),
                    ));
                }
            }
        }
        Ok(())
    }

    fn to_message(&self) -> Result<RouteMessage> {
        self.validate()?;
        fn invalid(e: impl std::fmt::Display) -> Error {
            Error::invalid("route", e.to_string())
        }
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(self.dst.addr(), self.dst.len())
            .map_err(invalid)?
            .scope(self.scope.into())
            .table_id(self.table);
        if let Some(gw) = self.gateway {
            b = b.gateway(gw).map_err(invalid)?;
        }
        if let Some(src) = self.pref_src {
            b = b.pref_source(src).map_err(invalid)?;
        }
        if let Some(oif) = self.oif {
            b = b.output_interface(oif);
        }
        if self.onlink {
            b = b.onlink();
        }
        Ok(b.build())
    }

    fn from_message(msg: &RouteMessage) -> Option<Route> {
        let family_any = match msg.header.address_family {
            AddressFamily::Inet => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        let ip = |a: &RouteAddress| match a {
            RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        };
        let mut route = Route {
            dst: IpPrefix::new(family_any, msg.header.destination_prefix_length).ok()?,
            gateway: None,
            oif: None,
            scope: msg.header.scope.into(),
            onlink: msg.header.flags.contains(RouteFlags::Onlink),
            table: u32::from(msg.header.table),
            pref_src: None,
        };
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => {
                    route.dst = IpPrefix::new(ip(a)?, msg.header.destination_prefix_length).ok()?
                }
                RouteAttribute::Gateway(a) => route.gateway = ip(a),
                RouteAttribute::PrefSource(a) => route.pref_src = ip(a),
                RouteAttribute::Oif(i) => route.oif = Some(*i),
                RouteAttribute::Table(t) => route.table = *t,
                _ => {}
            }
        }
        Some(route)
    }
}

impl NlHandle {
    /// Adds a route; fails with `EEXIST` ([`Error::is_exists`]) if the same destination
    /// is already routed in that table, so a conflicting pod route is never overwritten.
    pub async fn add_route(&self, route: &Route) -> Result<()> {
        let msg = route.to_message()?;
        self.inner
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("add route {}", route.dst), e))
    }

    /// Adds or replaces a route.
    pub async fn replace_route(&self, route: &Route) -> Result<()> {
        let msg = route.to_message()?;
        self.inner
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("replace route {}", route.dst), e))
    }

    /// Deletes a route. Idempotent: `false` if there was no such route.
    pub async fn del_route(&self, route: &Route) -> Result<bool> {
        let msg = route.to_message()?;
        match self.inner.route().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) => {
                let err = Error::netlink(format!("delete route {}", route.dst), e);
                if err.is_not_found() {
                    Ok(false)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Unicast routes of one family (`ipv6 = false` for IPv4) in every table.
    pub async fn list_routes(&self, ipv6: bool) -> Result<Vec<Route>> {
        let mut query = RouteMessage::default();
        query.header.address_family = if ipv6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let msgs: Vec<RouteMessage> = self
            .inner
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("list routes", e))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.kind == RouteType::Unicast)
            .filter_map(Route::from_message)
            .collect())
    }

    /// Adds (or replaces) a permanent neighbour entry: `ip` is at `mac` on link
    /// `index`. Needed where nothing answers ARP/ND for an address (lesson 12).
    pub async fn add_permanent_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: MacAddr,
    ) -> Result<()> {
        self.inner
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac.0)
            .replace()
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("add neighbour {ip} lladdr {mac} on #{index}"), e))
    }

    /// Deletes a neighbour entry. Idempotent: `false` if there was none.
    pub async fn del_neighbour(&self, index: u32, ip: IpAddr) -> Result<bool> {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = index;
        msg.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.attributes
            .push(NeighbourAttribute::Destination(match ip {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        match self.inner.neighbours().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) => {
                let err = Error::netlink(format!("delete neighbour {ip} on #{index}"), e);
                if err.is_not_found() {
                    Ok(false)
                } else {
                    Err(err)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> IpPrefix {
        s.parse().unwrap()
    }

    #[test]
    fn rejects_host_bits_and_mixed_families() {
        let r = Route::on_link(p("10.0.0.5/24"), 1);
        assert!(matches!(r.to_message(), Err(Error::InvalidInput { .. })));
        let r = Route::via(p("0.0.0.0/0"), "fe80::1".parse().unwrap(), 1);
        assert!(matches!(r.to_message(), Err(Error::InvalidInput { .. })));
    }

    #[test]
    fn message_round_trips_through_the_parser() {
        let mut r = Route::via(p("::/0"), "fe80::1".parse().unwrap(), 9);
        r.onlink = true;
        let msg = r.to_message().unwrap();
        assert_eq!(msg.header.destination_prefix_length, 0);
        assert_eq!(msg.header.address_family, AddressFamily::Inet6);
        assert_eq!(Route::from_message(&msg), Some(r));

        let r = Route::on_link(p("169.254.1.1/32"), 4);
        let msg = r.to_message().unwrap();
        assert_eq!(msg.header.scope, RouteScope::Link);
        assert_eq!(msg.header.destination_prefix_length, 32);
        assert_eq!(Route::from_message(&msg), Some(r));
    }
}

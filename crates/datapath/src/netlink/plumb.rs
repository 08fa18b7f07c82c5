//! Plumbing a pod: the veth pair, its addresses, routes and sysctls, in one call that
//! either completes or leaves nothing behind.
//!
//! # Shape
//!
//! * Pod side (`eth0`): its /32 (/128), `lo` up, a scope-link /32 route to the on-link
//!   gateway `169.254.1.1` and a default route via it; for IPv6 a default route via
//!   `fe80::1`. Nothing in the pod needs to know the node's addressing.
//! * Host side (`cph…`): `proxy_arp` (answers ARP for 169.254.1.1), `proxy_delay` 0,
//!   forwarding, `rp_filter` 0, `fe80::1/64` for IPv6 (proxy NDP does not cover
//!   link-local targets, lesson 16), a host route to each pod address, and the alias
//!   rebuild record.
//!
//! # Rollback
//!
//! The veth pair is created in one request with the peer already inside the pod
//! namespace under its final name, so creation itself is all-or-nothing. Everything made
//! afterwards (addresses, routes, neighbour entries, per-device sysctls) hangs off one
//! of the two ends, and deleting one end of a veth deletes both. So the rollback is a
//! single step, "delete the host end by the ifindex we created", and can neither miss a
//! piece nor touch anything that existed before (a pre-existing link with our name makes
//! creation fail, and then there is nothing of ours to delete).
//!
//! The alias record is written first thing in the second half ([`configure_pair`]),
//! so a process killed mid-way leaves either a veth with no alias at all (only the
//! pair: the agent's rebuild deletes it, a retried ADD of its container finds it by
//! name) or one that the rebuild/GC can attribute to its container.
//!
//! # Two halves
//!
//! [`create_pair`] does what needs no address: the pair, the host end's IPv4 sysctls,
//! the pod's `lo`. [`configure_pair`] does the rest once the addresses are claimed:
//! the record, the pod MAC (set while the peer is still down), addresses, routes,
//! IPv6 sysctls, the peer up. The agent runs the first half while the address claim
//! is in flight (an API round trip), which takes it off the ADD's critical path.
//! [`plumb`] is both in one task.
//!
//! [`plumb`] runs in its own task, so dropping its future (a cancelled request) does
//! not stop it between two steps: it completes or rolls back regardless.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use cozyplane_errors::Chain;

use super::error::{Error, Result};
use super::handle::{NetnsHandle, NlHandle};
use super::link::{validate_ifname, LinkInfo, VethSpec, MAX_ALIAS_LEN};
use super::netns::Netns;
use super::route::Route;
use super::sysctl::{self, ConfTarget};
use super::types::{IpPrefix, MacAddr};

/// The pod's IPv4 default gateway, answered by proxy ARP on the host veth.
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 default gateway, assigned to every host veth.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Prefix of host-side pod veth names (`cph` + 12 hex digits).
pub const HOST_VETH_PREFIX: &str = "cph";

/// The host-side veth name for a pod interface: `cph` + the first 12 hex digits of a
/// 64-bit FNV-1a hash of `container_id`, NUL, `ifname`.
///
/// A hash rather than a prefix of the id, because container ids are not required to be
/// hex and differ in any position; including `ifname` keeps a second interface of the
/// same pod distinct. The result is stable across releases (DEL recomputes it from the
/// CNI arguments), and 48 bits make a collision between the pods of one node
/// practically impossible — and a collision fails ADD with `EEXIST` rather than
/// touching the other pod.
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let mut hash = Fnv1a::new();
    hash.write(container_id.as_bytes());
    hash.write(&[0]);
    hash.write(ifname.as_bytes());
    let hex = format!("{:016x}", hash.finish());
    format!("{HOST_VETH_PREFIX}{}", &hex[..12])
}

/// 64-bit FNV-1a: tiny, stable, and good enough to spread names (not a security hash).
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What to plumb.
#[derive(Clone, Debug)]
pub struct PlumbRequest<'a> {
    /// The pod's namespace (`CNI_NETNS`).
    pub pod_netns: &'a Path,
    /// Interface name inside the pod (`CNI_IFNAME`, usually `eth0`).
    pub ifname: &'a str,
    /// Host-side name, see [`host_veth_name`].
    pub host_ifname: &'a str,
    /// MTU of both ends.
    pub mtu: u32,
    /// The pod's IPv4 address, if any.
    pub ipv4: Option<Ipv4Addr>,
    /// The pod's IPv6 address, if any.
    pub ipv6: Option<Ipv6Addr>,
    /// A fixed MAC for the pod side (persistent ports); `None` = kernel-chosen.
    pub pod_mac: Option<MacAddr>,
    /// The rebuild record stored as the host veth's alias.
    pub alias: &'a str,
    /// The addresses the host routes to this veth; `None`: the pod's own.
    /// A VPC pod holds only its VPC address inside, which the host must
    /// never route (VPC addresses overlap); the host routes its fabric
    /// address instead, which the datapath's bridge translates.
    pub host_routes: Option<&'a [IpAddr]>,
}

impl PlumbRequest<'_> {
    fn validate(&self) -> Result<()> {
        validate_ifname(self.ifname)?;
        validate_ifname(self.host_ifname)?;
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(Error::invalid("plumb request", "no pod address given"));
        }
        let min_mtu = if self.ipv6.is_some() { 1280 } else { 68 };
        if !(min_mtu..=65535).contains(&self.mtu) {
            return Err(Error::invalid(
                "mtu",
                format!(
                    "{} (want {min_mtu}..=65535 for these address families)",
                    self.mtu
                ),
            ));
        }
        if self.alias.len() > MAX_ALIAS_LEN {
            return Err(Error::invalid(
                "alias",
                format!("{} bytes, at most {MAX_ALIAS_LEN}", self.alias.len()),
            ));
        }
        Ok(())
    }
}

/// What the agent records after plumbing (all read back from the kernel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plumbed {
    /// Host-side ifindex (where the agent attaches `from_pod` / `to_pod`).
    pub host_ifindex: u32,
    /// Host-side MAC.
    pub host_mac: MacAddr,
    /// Pod-side ifindex (inside the pod namespace).
    pub pod_ifindex: u32,
    /// Pod-side MAC.
    pub pod_mac: MacAddr,
}

/// What [`create_pair`] makes: the pair's names, namespace and MTU, everything that
/// does not depend on the pod's addresses.
#[derive(Clone, Debug)]
pub struct PairRequest<'a> {
    /// The pod's namespace (`CNI_NETNS`).
    pub pod_netns: &'a Path,
    /// Interface name inside the pod (`CNI_IFNAME`, usually `eth0`).
    pub ifname: &'a str,
    /// Host-side name, see [`host_veth_name`].
    pub host_ifname: &'a str,
    /// MTU of both ends.
    pub mtu: u32,
}

impl PairRequest<'_> {
    fn validate(&self) -> Result<()> {
        validate_ifname(self.ifname)?;
        validate_ifname(self.host_ifname)?;
        if !(68..=65535).contains(&self.mtu) {
            return Err(Error::invalid(
                "mtu",
                format!("{} (want 68..=65535)", self.mtu),
            ));
        }
        Ok(())
    }
}

impl<'a> PlumbRequest<'a> {
    /// The pair this request plumbs.
    pub fn pair(&self) -> PairRequest<'a> {
        PairRequest {
            pod_netns: self.pod_netns,
            ifname: self.ifname,
            host_ifname: self.host_ifname,
            mtu: self.mtu,
        }
    }
}

/// A pod's veth pair made before its addresses are known ([`create_pair`]): the
/// host end up with its IPv4 sysctls, the peer inside the pod namespace under its
/// final name and still down, the pod's `lo` up. No alias, no address, no route: it
/// carries nothing. [`configure_pair`] finishes it; [`discard_pair`] deletes it.
pub struct Pair {
    host: NetnsHandle,
    pod: NlHandle,
    pod_netns: Netns,
    pod_netns_path: PathBuf,
    host_link: LinkInfo,
    pod_link: LinkInfo,
    ifname: String,
    mtu: u32,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("host_ifname", &self.host_link.name)
            .field("host_ifindex", &self.host_link.index)
            .field("pod_netns", &self.pod_netns_path)
            .field("ifname", &self.ifname)
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// The host end's ifindex.
    pub fn host_ifindex(&self) -> u32 {
        self.host_link.index
    }

    /// Deletes the host end, which takes the peer with it.
    async fn delete(&self) -> Result<bool> {
        self.host.nl.delete_link(self.host_link.index).await
    }
}

/// Creates a pod's veth pair (the first half of [`plumb`]): what it can do before
/// the pod's addresses are claimed, so the agent runs it while the claim is in
/// flight. On failure nothing is left; in its own task like [`plumb`].
pub async fn create_pair(host: &NetnsHandle, req: &PairRequest<'_>) -> Result<Pair> {
    req.validate()?;
    let host = NetnsHandle {
        netns: host.netns.try_clone()?,
        nl: host.nl.clone(),
    };
    let (pod_netns, ifname, host_ifname, mtu) = (
        req.pod_netns.to_path_buf(),
        req.ifname.to_string(),
        req.host_ifname.to_string(),
        req.mtu,
    );
    tokio::spawn(async move { pair_in_task(host, pod_netns, ifname, host_ifname, mtu).await })
        .await
        .map_err(Error::TaskFailed)?
}

async fn pair_in_task(
    host: NetnsHandle,
    pod_netns_path: PathBuf,
    ifname: String,
    host_ifname: String,
    mtu: u32,
) -> Result<Pair> {
    let pod_netns = Netns::open(&pod_netns_path)?;
    let spec = VethSpec {
        name: &host_ifname,
        peer_name: &ifname,
        peer_netns: Some(&pod_netns),
        mtu: Some(mtu),
        peer_mac: None,
        up: true,
    };
    // Opening the pod-side socket (a thread hop) overlaps with creating the pair.
    let (pod, created) = tokio::join!(NlHandle::connect(&pod_netns), host.nl.create_veth(&spec));
    // Nothing was made if creation failed.
    let host_link = created?;
    let prepared = match pod {
        Ok(pod) => {
            let dev = host_ifname.clone();
            let (h, p) = tokio::join!(
                host.netns.run_async(move || host_sysctls(&dev)),
                prepare_pod(&pod, &ifname)
            );
            match (h.and_then(|r| r), p) {
                (Ok(()), Ok(pod_link)) => Ok((pod, pod_link)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    match prepared {
        Ok((pod, pod_link)) => Ok(Pair {
            host,
            pod,
            pod_netns,
            pod_netns_path,
            host_link,
            pod_link,
            ifname,
            mtu,
        }),
        Err(err) => Err(roll_back(&host.nl, &host_ifname, host_link.index, err).await),
    }
}

/// Deletes the pair a failed step made, returning the step's error (with the
/// rollback's, if that failed too).
async fn roll_back(nl: &NlHandle, name: &str, index: u32, err: Error) -> Error {
    tracing::debug!(link = name, error = %Chain(&err), "plumb failed, rolling back");
    match nl.delete_link(index).await {
        Ok(_) => err,
        Err(rollback) => Error::RollbackFailed {
            error: Box::new(err),
            rollback: Box::new(rollback),
        },
    }
}

/// Finishes a pair [`create_pair`] made (the second half of [`plumb`]): the alias
/// record, addresses, routes, the pod MAC, the peer up. `req` must name the pair's
/// namespace, interfaces and MTU. On failure the pair is deleted; in its own task.
pub async fn configure_pair(pair: Pair, req: &PlumbRequest<'_>) -> Result<Plumbed> {
    let checked = req.validate().and_then(|()| {
        let same = req.pod_netns == pair.pod_netns_path
            && req.ifname == pair.ifname
            && req.host_ifname == pair.host_link.name
            && req.mtu == pair.mtu;
        if same {
            Ok(())
        } else {
            Err(Error::invalid(
                "plumb request",
                format!("does not describe the prepared pair {pair:?}"),
            ))
        }
    });
    if let Err(err) = checked {
        let index = pair.host_link.index;
        return Err(roll_back(&pair.host.nl, req.host_ifname, index, err).await);
    }
    let req = OwnedRequest::new(req);
    tokio::spawn(async move { configure_in_task(&pair, &req.borrow()).await })
        .await
        .map_err(Error::TaskFailed)?
}

/// Deletes a pair [`create_pair`] made that will not be configured; `Ok(false)` if
/// it was already gone.
pub async fn discard_pair(pair: Pair) -> Result<bool> {
    pair.delete().await
}

/// An owned copy of a [`PlumbRequest`], so the work can move into its own task.
struct OwnedRequest {
    pod_netns: PathBuf,
    ifname: String,
    host_ifname: String,
    mtu: u32,
    ipv4: Option<Ipv4Addr>,
    ipv6: Option<Ipv6Addr>,
    pod_mac: Option<MacAddr>,
    alias: String,
    host_routes: Option<Vec<IpAddr>>,
}

impl OwnedRequest {
    fn new(req: &PlumbRequest<'_>) -> OwnedRequest {
        OwnedRequest {
            pod_netns: req.pod_netns.to_path_buf(),
            ifname: req.ifname.to_string(),
            host_ifname: req.host_ifname.to_string(),
            mtu: req.mtu,
            ipv4: req.ipv4,
            ipv6: req.ipv6,
            pod_mac: req.pod_mac,
            alias: req.alias.to_string(),
            host_routes: req.host_routes.map(<[IpAddr]>::to_vec),
        }
    }

    fn borrow(&self) -> PlumbRequest<'_> {
        PlumbRequest {
            pod_netns: &self.pod_netns,
            ifname: &self.ifname,
            host_ifname: &self.host_ifname,
            mtu: self.mtu,
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            pod_mac: self.pod_mac,
            alias: &self.alias,
            host_routes: self.host_routes.as_deref(),
        }
    }
}

/// Creates and configures the veth pair for one pod interface ([`create_pair`], then
/// [`configure_pair`]). On any failure, everything it made is removed before the error
/// is returned (see the module docs).
///
/// The work runs in its own tokio task: if the caller's future is dropped half-way
/// (e.g. an HTTP handler whose client hung up), the task still finishes — and rolls
/// back on failure — instead of stopping between two steps.
pub async fn plumb(host: &NetnsHandle, req: &PlumbRequest<'_>) -> Result<Plumbed> {
    req.validate()?;
    let host = NetnsHandle {
        netns: host.netns.try_clone()?,
        nl: host.nl.clone(),
    };
    let req = OwnedRequest::new(req);
    tokio::spawn(async move {
        let req = req.borrow();
        let pair = pair_in_task(
            host,
            req.pod_netns.to_path_buf(),
            req.ifname.to_string(),
            req.host_ifname.to_string(),
            req.mtu,
        )
        .await?;
        configure_in_task(&pair, &req).await
    })
    .await
    .map_err(Error::TaskFailed)?
}

async fn configure_in_task(pair: &Pair, req: &PlumbRequest<'_>) -> Result<Plumbed> {
    let (h, p) = tokio::join!(
        configure_host(&pair.host, &pair.host_link, req),
        configure_pod(&pair.pod, &pair.pod_netns, &pair.pod_link, req)
    );
    let pod_link = match h.and(p) {
        Ok(pod_link) => pod_link,
        Err(err) => {
            return Err(roll_back(&pair.host.nl, req.host_ifname, pair.host_link.index, err).await)
        }
    };
    let missing_mac = |name: &str| Error::LinkMismatch {
        name: name.to_string(),
        reason: "has no hardware address".into(),
    };
    // Both links were read back after every attribute that could change a MAC was set
    // (the pod MAC is set by `configure_pod`, which re-reads the link), so these are
    // current values (lesson 17).
    let host_link = &pair.host_link;
    Ok(Plumbed {
        host_ifindex: host_link.index,
        host_mac: host_link.mac.ok_or_else(|| missing_mac(&host_link.name))?,
        pod_ifindex: pod_link.index,
        pod_mac: pod_link.mac.ok_or_else(|| missing_mac(&pod_link.name))?,
    })
}

/// Host half: alias record, IPv6 sysctls and `fe80::1`, routes to the pod. Any error
/// is rolled back by the caller.
async fn configure_host(
    host: &NetnsHandle,
    host_link: &LinkInfo,
    req: &PlumbRequest<'_>,
) -> Result<()> {
    let index = host_link.index;
    host.nl.set_alias(index, req.alias).await?;
    let dev = req.host_ifname.to_string();
    let v6 = req.ipv6.is_some()
        || req
            .host_routes
            .is_some_and(|r| r.iter().any(IpAddr::is_ipv6));
    if v6 {
        host.netns
            .run_async(move || host_v6_sysctls(&dev))
            .await??;
        host.nl
            .add_address(index, IpPrefix::new(IpAddr::V6(POD_GATEWAY_V6), 64)?)
            .await?;
    }
    // EEXIST here means another link already owns the address: never overwrite it.
    let own = [req.ipv4.map(IpAddr::V4), req.ipv6.map(IpAddr::V6)];
    let routed: Vec<IpAddr> = match req.host_routes {
        Some(r) => r.to_vec(),
        None => own.into_iter().flatten().collect(),
    };
    for a in routed {
        host.nl
            .add_route(&Route::on_link(IpPrefix::host(a), index))
            .await?;
    }
    Ok(())
}

/// Pod half before the addresses: finds the peer, brings `lo` up.
async fn prepare_pod(pod: &NlHandle, ifname: &str) -> Result<LinkInfo> {
    let pod_link = pod.require_link(ifname).await?;
    if let Some(lo) = pod.link_by_name("lo").await? {
        if !lo.up {
            pod.set_up(lo.index).await?;
        }
    }
    Ok(pod_link)
}

/// Pod half: the pod MAC, `eth0` up with its address(es) and the on-link default
/// route(s). Returns the pod link as read after its MAC was set.
async fn configure_pod(
    pod: &NlHandle,
    pod_netns: &Netns,
    pod_link: &LinkInfo,
    req: &PlumbRequest<'_>,
) -> Result<LinkInfo> {
    let index = pod_link.index;
    if req.ipv6.is_some() {
        let dev = req.ifname.to_string();
        pod_netns.run_async(move || pod_v6_sysctls(&dev)).await??;
    }
    // Set while the peer is down (a veth's address cannot change while it runs).
    let pod_link = match req.pod_mac {
        Some(mac) => pod.set_mac(index, mac).await?,
        None => pod_link.clone(),
    };
    pod.set_up(index).await?;
    if let Some(a) = req.ipv4 {
        let gw = IpAddr::V4(POD_GATEWAY_V4);
        pod.add_address(index, IpPrefix::host(IpAddr::V4(a)))
            .await?;
        // The gateway is on no subnet of the pod: make it on-link, then route via it.
        pod.add_route(&Route::on_link(IpPrefix::host(gw), index))
            .await?;
        pod.add_route(&Route::via(IpPrefix::default_for(gw), gw, index))
            .await?;
    }
    if let Some(a) = req.ipv6 {
        let gw = IpAddr::V6(POD_GATEWAY_V6);
        pod.add_address(index, IpPrefix::host(IpAddr::V6(a)))
            .await?;
        pod.add_route(&Route::via(IpPrefix::default_for(gw), gw, index))
            .await?;
    }
    Ok(pod_link)
}

/// Host-side per-device IPv4 sysctls; runs inside the host namespace.
fn host_sysctls(dev: &str) -> Result<()> {
    let t = ConfTarget::Dev(dev);
    sysctl::set_proxy_arp(t, true)?;
    sysctl::set_proxy_delay(t, 0)?;
    sysctl::set_ipv4_conf_forwarding(t, true)?;
    sysctl::set_rp_filter(t, 0)
}

/// Host-side per-device IPv6 sysctls; runs inside the host namespace.
fn host_v6_sysctls(dev: &str) -> Result<()> {
    let t = ConfTarget::Dev(dev);
    sysctl::set_disable_ipv6(t, false)?;
    sysctl::set_accept_ra(t, 0)?;
    sysctl::set_ipv6_forwarding(t, true)
}

/// Pod-side IPv6 sysctls: v6 on, and no router advertisements (routes are static).
fn pod_v6_sysctls(dev: &str) -> Result<()> {
    let t = ConfTarget::Dev(dev);
    sysctl::set_disable_ipv6(t, false)?;
    sysctl::set_accept_ra(t, 0)
}

/// Routes a VPC pod's fabric address into its host veth, the node's half of the
/// dual-address bridge (`bpf/bridge.h`, docs/datapath.md "Dual-address bridge"): a
/// permanent neighbour `fabric lladdr pod_mac` on `host_ifindex`, then the host route
/// `fabric/32` (`/128`) scope link out of it. The pod never holds the fabric address
/// and would not answer ARP for it; with the neighbour the node's stack sends straight
/// to the pod's MAC, and `to_pod` translates the packet to the pod's VPC address.
///
/// Idempotent: the neighbour is replaced, and a route that already points at this veth
/// is kept. A route of that address through another link fails with `EEXIST`
/// ([`Error::is_exists`]) and is never overwritten. Both hang off the host veth, so
/// deleting the veth (DEL, rollback) removes them; [`unplumb_bridge`] is for taking the
/// bridge down while the pod lives on (revocation).
pub async fn plumb_bridge(
    host: &NlHandle,
    host_ifindex: u32,
    fabric: IpAddr,
    pod_mac: MacAddr,
) -> Result<()> {
    host.add_permanent_neighbour(host_ifindex, fabric, pod_mac)
        .await?;
    let route = Route::on_link(IpPrefix::host(fabric), host_ifindex);
    match host.add_route(&route).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_exists() => {
            let ours = host.list_routes(fabric.is_ipv6()).await?.iter().any(|r| {
                r.dst == route.dst && r.table == route.table && r.oif == Some(host_ifindex)
            });
            if ours {
                Ok(())
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// Undoes [`plumb_bridge`]: the route, then the neighbour. Idempotent: `Ok(false)` if
/// neither was there.
pub async fn unplumb_bridge(host: &NlHandle, host_ifindex: u32, fabric: IpAddr) -> Result<bool> {
    let route = Route::on_link(IpPrefix::host(fabric), host_ifindex);
    let routed = host.del_route(&route).await?;
    let neighbour = host.del_neighbour(host_ifindex, fabric).await?;
    Ok(routed || neighbour)
}

/// Removes a pod interface by its host-side name. Idempotent: `Ok(false)` if it is
/// already gone (also when the pod namespace was deleted first, which takes the pair
/// with it). Refuses to delete a link of that name that is not a veth.
pub async fn unplumb(host: &NlHandle, host_ifname: &str) -> Result<bool> {
    let Some(link) = host.link_by_name(host_ifname).await? else {
        return Ok(false);
    };
    if link.kind.as_deref() != Some("veth") {
        return Err(Error::LinkMismatch {
            name: host_ifname.to_string(),
            reason: format!("kind is {:?}, not veth: not deleting it", link.kind),
        });
    }
    host.delete_link(link.index).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference test suite.
        let h = |s: &[u8]| {
            let mut f = Fnv1a::new();
            f.write(s);
            f.finish()
        };
        assert_eq!(h(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn host_veth_names_are_short_stable_and_distinct() {
        let a = host_veth_name("0123456789abcdef", "eth0");
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("cph"));
        assert!(validate_ifname(&a).is_ok());
        assert_eq!(a, host_veth_name("0123456789abcdef", "eth0"));
        assert_ne!(a, host_veth_name("0123456789abcdef", "eth1"));
        // Ids sharing a long prefix still get different names.
        assert_ne!(
            host_veth_name("test-pod-000000000001", "eth0"),
            host_veth_name("test-pod-000000000002", "eth0")
        );
    }

    #[test]
    fn requests_are_validated_before_touching_the_kernel() {
        let base = PlumbRequest {
            pod_netns: Path::new("/nonexistent"),
            ifname: "eth0",
            host_ifname: "cph000000000000",
            mtu: 1450,
            ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)),
            ipv6: None,
            pod_mac: None,
            alias: "x",
            host_routes: None,
        };
        assert!(base.validate().is_ok());
        let no_addr = PlumbRequest {
            ipv4: None,
            ..base.clone()
        };
        assert!(no_addr.validate().is_err());
        let small_v6 = PlumbRequest {
            ipv6: Some(Ipv6Addr::LOCALHOST),
            mtu: 1200,
            ..base.clone()
        };
        assert!(small_v6.validate().is_err());
        let long_name = PlumbRequest {
            host_ifname: "cph0000000000000",
            ..base.clone()
        };
        assert!(long_name.validate().is_err());
        let alias = "a".repeat(256);
        let long_alias = PlumbRequest {
            alias: &alias,
            ..base
        };
        assert!(long_alias.validate().is_err());
    }
}

//! One node's bring-up: everything the datapath needs around it before the first pod
//! (docs/datapath.md, "What the agent sets up around it"), as one function,
//! [`bring_up`].
//!
//! Its callers: the node agent at start-up (in its own namespace), the datapath
//! benchmark and the overlay tests (each node a network namespace). So the benchmark
//! and the tests measure and prove exactly what production builds; what stays theirs
//! is what the agent does later, per pod (plumbing, `cp_ports`/`cp_locals`, pod
//! programs) or from the API (`cp_remotes`, `cp_node_remotes`, `cp_vteps`).
//!
//! # What it does, in order
//! 1. node sysctls: IPv4 forwarding on, `rp_filter` off for `all` and `default`
//!    (decapsulated and redirected packets arrive on devices the reverse path does not
//!    name);
//! 2. the uplink: named, or the device of the main table's IPv4 default route; the
//!    node's IPv4 address is its first non-link-local one (tunnel endpoint and
//!    masquerade source);
//! 3. the pod MTU (given, or the uplink's minus the encapsulation overhead; refused
//!    below 1280 when a pod CIDR is IPv6);
//! 4. the overlay device (VXLAN external, kept if it exists), `rp_filter` 0 on it, the
//!    permanent neighbour of the on-link gateway `169.254.1.1` there, and a route per
//!    IPv4 pod CIDR via that gateway into it;
//! 5. the node maps: `cp_params`, `cp_vnis` (VNI 1 → net 0), a seed of `cp_vteps`
//!    ([`seed_vteps`]), and `cp_masq_srcs` / `cp_internal` diff-synced to the pod CIDRs;
//! 6. `from_overlay` / `to_overlay` on the overlay device and, with masquerade,
//!    `to_uplink` / `from_uplink` on the uplink; without masquerade the uplink links a
//!    previous run pinned are detached.
//!
//! Every step is idempotent and nothing is torn down first, so a restarted agent runs
//! the same sequence over what the previous one left without interrupting pod traffic
//! (links are updated in place, see [`crate::tcx`]).
//!
//! # Another namespace
//! The node is the namespace of a [`NetnsHandle`]: netlink goes through its handle,
//! and the sysctls and tcx attaches (which resolve interface indexes in the calling
//! thread's namespace) run on a thread inside it ([`crate::netlink::Netns::run`]). For
//! the agent that is its own namespace ([`NetnsHandle::current`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::{DerefMut, RangeInclusive};
use std::path::{Path, PathBuf};

use crate::abi::{
    lpm_key, vtep_key, Addr128, LpmKey, Params, NET_DEFAULT, OVERLAY_MAC, PARAM_F_KERNEL_LOCAL,
    PARAM_F_TC_TUNNEL, VNI_DEFAULT, VTEP_F_NODE,
};
use crate::netlink::{
    self, sysctl, Encapsulation, IpPrefix, LinkInfo, MacAddr, NetnsHandle, NlHandle, OverlaySpec,
    Route, POD_GATEWAY_V4,
};
use crate::{detach_tcx, Datapath, DatapathError, Direction, Iface, Program};

/// The agent's default overlay device name.
pub const DEFAULT_OVERLAY_DEVICE: &str = "cozyplane0";

/// Masquerade source ports. Linux's default ephemeral range ends at 60999, so
/// translated ports never collide with the node's own connections.
pub const MASQ_PORTS: RangeInclusive<u16> = 61000..=65535;

/// The smallest MTU IPv6 allows on a link.
const IPV6_MIN_MTU: u32 = 1280;

/// Link pin names under [`NodeSpec::links_dir`]. A restarted agent must find the same
/// names to update its links in place.
const PIN_OVERLAY_IN: &str = "overlay-in";
const PIN_OVERLAY_OUT: &str = "overlay-out";
const PIN_UPLINK_IN: &str = "uplink-in";
const PIN_UPLINK_OUT: &str = "uplink-out";

/// Masquerade of pod → outside traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Masquerade {
    /// In eBPF on the uplink (`to_uplink` / `from_uplink`).
    Bpf,
    /// Not at all (pods' addresses must be routable outside).
    Off,
}

/// Where the overlay's VXLAN headers are built and removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tunnel {
    /// In tc (`PARAM_F_TC_TUNNEL`): from_pod and to_overlay encapsulate and
    /// send to the uplink, from_uplink decapsulates what is for a local pod.
    /// The VXLAN device stays, for the rest (bpf/encap.h).
    #[default]
    Tc,
    /// By the kernel's VXLAN device, for every packet.
    Device,
}

/// Which device is the uplink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uplink {
    /// The device of the main table's IPv4 default route.
    DefaultRoute,
    /// This device.
    Named(String),
}

/// What to bring up on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The uplink: masquerade hooks, tunnel endpoint, node address.
    pub uplink: Uplink,
    /// Name of the overlay (VXLAN) device.
    pub overlay_device: String,
    /// Pod MTU; `None`: the uplink's MTU minus the encapsulation overhead.
    pub mtu: Option<u32>,
    /// The cluster's pod CIDRs: routed into the overlay (IPv4), masqueraded and
    /// internal (all).
    pub pod_cidrs: Vec<IpPrefix>,
    /// Masquerade of pod → outside traffic.
    pub masquerade: Masquerade,
    /// Masquerade source ports (used with [`Masquerade::Bpf`]).
    pub masq_ports: RangeInclusive<u16>,
    /// Where the overlay and uplink links are pinned (an existing directory on bpffs).
    pub links_dir: PathBuf,
    /// Hand same-node net-0 delivery to the kernel (`PARAM_F_KERNEL_LOCAL`):
    /// set when an iptables kube-proxy handles Services.
    pub kernel_local: bool,
    /// Where the overlay's VXLAN headers are built and removed.
    pub tunnel: Tunnel,
}

impl NodeSpec {
    /// The production defaults (default-route uplink, `cozyplane0`, MTU from the
    /// uplink, masquerade in eBPF on [`MASQ_PORTS`]) for these pod CIDRs.
    pub fn new(pod_cidrs: Vec<IpPrefix>, links_dir: impl Into<PathBuf>) -> NodeSpec {
        NodeSpec {
            uplink: Uplink::DefaultRoute,
            overlay_device: DEFAULT_OVERLAY_DEVICE.to_string(),
            mtu: None,
            pod_cidrs,
            masquerade: Masquerade::Bpf,
            masq_ports: MASQ_PORTS,
            links_dir: links_dir.into(),
            kernel_local: false,
            tunnel: Tunnel::default(),
        }
    }
}

/// What bring-up learned about the node.
#[derive(Debug, Clone)]
pub struct NodeNet {
    /// The uplink.
    pub uplink: LinkInfo,
    /// The node's IPv4 address on the uplink: tunnel endpoint and masquerade source.
    pub node_ip: Ipv4Addr,
    /// Every address on the uplink.
    pub addresses: Vec<IpAddr>,
    /// The overlay device.
    pub overlay: LinkInfo,
    /// The pod MTU.
    pub pod_mtu: u32,
}

/// Why a node could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No uplink was named and the main table has no IPv4 default route.
    #[error("no uplink named and no IPv4 default route to find one by")]
    NoDefaultRoute,
    /// The default route's device disappeared while it was looked up.
    #[error("the IPv4 default route's device #{0} vanished")]
    UplinkVanished(u32),
    /// The uplink has no IPv4 address to be the tunnel endpoint.
    #[error("uplink {0} has no IPv4 address")]
    UplinkWithoutIpv4(String),
    /// The uplink's MTU cannot carry the encapsulation.
    #[error("uplink MTU {uplink_mtu} is below the encapsulation overhead of {overhead}")]
    MtuBelowOverhead {
        /// The uplink's MTU.
        uplink_mtu: u32,
        /// Bytes the encapsulation adds.
        overhead: u32,
    },
    /// An IPv6 pod CIDR needs a pod MTU IPv6 allows.
    #[error("pod MTU {0} is outside IPv6's range of 1280-65535")]
    MtuOutsideIpv6Range(u32),
    /// A pod CIDR does not fit the LPM key.
    #[error("pod CIDR {0} has a bad prefix length")]
    PodCidr(IpPrefix),
    /// Masquerade is on but its port range is empty.
    #[error("masquerade port range {}-{} is empty", .0.start(), .0.end())]
    MasqPorts(RangeInclusive<u16>),
    /// Netlink, the namespace or a sysctl failed.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// A map write or a tcx attach failed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// Brings up the node `host` is the namespace of, as described in the module docs,
/// and returns what it learned.
///
/// `datapath` is called once, after every netlink step and before the map writes, so a
/// caller that shares the loaded datapath behind a lock holds it only for the map
/// writes and attaches, never across an await.
pub async fn bring_up<D>(
    host: &NetnsHandle,
    spec: &NodeSpec,
    datapath: impl FnOnce() -> D,
) -> Result<NodeNet, NodeError>
where
    D: DerefMut<Target = Datapath>,
{
    if spec.masquerade == Masquerade::Bpf && spec.masq_ports.is_empty() {
        return Err(NodeError::MasqPorts(spec.masq_ports.clone()));
    }
    host.netns.run(node_sysctls)??;
    let (uplink, node_ip, addresses) = discover_uplink(&host.nl, &spec.uplink).await?;
    let encap = Encapsulation::VXLAN_DEFAULT;
    let pod_mtu = pod_mtu(
        spec.mtu,
        uplink.mtu,
        encap.overhead(),
        spec.pod_cidrs.iter().any(|c| !c.addr().is_ipv4()),
    )?;
    let overlay = ensure_overlay(host, spec, encap, pod_mtu).await?;
    let net = NodeNet {
        uplink,
        node_ip,
        addresses,
        overlay,
        pod_mtu,
    };
    let mut guard = datapath();
    let dp: &mut Datapath = &mut guard;
    program_node_maps(dp, &net, spec)?;
    host.netns.run(|| {
        attach_node_programs(
            dp,
            &net,
            spec.masquerade,
            !spec.kernel_local,
            spec.tunnel,
            &spec.links_dir,
        )
    })??;
    Ok(net)
}

/// Node-wide sysctls, in the calling thread's namespace.
fn node_sysctls() -> Result<(), netlink::Error> {
    sysctl::set_ipv4_forwarding(true)?;
    sysctl::set_rp_filter(sysctl::ConfTarget::All, 0)?;
    sysctl::set_rp_filter(sysctl::ConfTarget::Default, 0)?;
    Ok(())
}

/// The uplink, its IPv4 address and every address on it.
async fn discover_uplink(
    nl: &NlHandle,
    uplink: &Uplink,
) -> Result<(LinkInfo, Ipv4Addr, Vec<IpAddr>), NodeError> {
    let link = match uplink {
        Uplink::Named(name) => nl.require_link(name).await?,
        Uplink::DefaultRoute => {
            let oif = default_route_oif(&nl.list_routes(false).await?)
                .ok_or(NodeError::NoDefaultRoute)?;
            nl.link_by_index(oif)
                .await?
                .ok_or(NodeError::UplinkVanished(oif))?
        }
    };
    let addresses: Vec<IpAddr> = nl
        .list_addresses(link.index)
        .await?
        .iter()
        .map(|p| p.addr())
        .collect();
    let node_ip =
        node_ipv4(&addresses).ok_or_else(|| NodeError::UplinkWithoutIpv4(link.name.clone()))?;
    Ok((link, node_ip, addresses))
}

/// The output device of the main table's IPv4 default route.
fn default_route_oif(routes: &[Route]) -> Option<u32> {
    routes
        .iter()
        .filter(|r| r.dst.is_empty() && r.table == Route::MAIN_TABLE)
        .find_map(|r| r.oif)
}

/// The first IPv4 address that is not link-local.
fn node_ipv4(addresses: &[IpAddr]) -> Option<Ipv4Addr> {
    addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) if !v4.is_link_local() => Some(*v4),
        _ => None,
    })
}

/// The first IPv6 address that is global unicast (ULA included): the per-packet
/// load balancer's SNAT source for IPv6 flows. Not link-local, loopback,
/// multicast, unspecified, nor in `64:ff9b::/96`, where IPv4 addresses' map keys
/// live (an address there would stand for an IPv4 one).
fn node_ipv6(addresses: &[IpAddr]) -> Option<std::net::Ipv6Addr> {
    addresses.iter().find_map(|a| match a {
        IpAddr::V6(v6)
            if !v6.is_loopback()
                && !v6.is_multicast()
                && !v6.is_unspecified()
                && !v6.is_unicast_link_local()
                && Addr128::from_v6(*v6).to_ip().is_ipv6() =>
        {
            Some(*v6)
        }
        _ => None,
    })
}

/// The pod MTU: `given`, or the uplink's minus `overhead`; IPv6 pods need 1280-65535.
fn pod_mtu(
    given: Option<u32>,
    uplink_mtu: u32,
    overhead: u32,
    ipv6: bool,
) -> Result<u32, NodeError> {
    let mtu = match given {
        Some(m) => m,
        None => uplink_mtu
            .checked_sub(overhead)
            .ok_or(NodeError::MtuBelowOverhead {
                uplink_mtu,
                overhead,
            })?,
    };
    if ipv6 && !(IPV6_MIN_MTU..=65535).contains(&mtu) {
        return Err(NodeError::MtuOutsideIpv6Range(mtu));
    }
    Ok(mtu)
}

/// The overlay device, its rp_filter, the gateway's permanent neighbour there and the
/// route of every IPv4 pod CIDR into it.
async fn ensure_overlay(
    host: &NetnsHandle,
    spec: &NodeSpec,
    encap: Encapsulation,
    pod_mtu: u32,
) -> Result<LinkInfo, NodeError> {
    let nl = &host.nl;
    let overlay = nl
        .ensure_overlay(&OverlaySpec {
            name: spec.overlay_device.clone(),
            encap,
            mtu: pod_mtu,
            mac: MacAddr(OVERLAY_MAC),
        })
        .await?;
    host.netns
        .run(|| sysctl::set_rp_filter(sysctl::ConfTarget::Dev(&overlay.name), 0))??;
    nl.add_permanent_neighbour(
        overlay.index,
        IpAddr::V4(POD_GATEWAY_V4),
        MacAddr(OVERLAY_MAC),
    )
    .await?;
    for cidr in spec.pod_cidrs.iter().filter(|c| c.addr().is_ipv4()) {
        let mut route = Route::via(
            IpPrefix::new(cidr.network(), cidr.len())?,
            IpAddr::V4(POD_GATEWAY_V4),
            overlay.index,
        );
        route.onlink = true;
        nl.replace_route(&route).await?;
    }
    Ok(overlay)
}

/// `cp_params` for this node.
fn node_params(
    net: &NodeNet,
    masquerade: Masquerade,
    ports: &RangeInclusive<u16>,
    kernel_local: bool,
    tunnel: Tunnel,
) -> Params {
    let (masq_ip, masq_port_min, masq_port_max) = match masquerade {
        Masquerade::Bpf => (net.node_ip.octets(), *ports.start(), *ports.end()),
        Masquerade::Off => ([0; 4], 0, 0),
    };
    Params {
        vxlan_ifindex: net.overlay.index,
        uplink_ifindex: net.uplink.index,
        node_ip: net.node_ip.octets(),
        node_ip6: node_ipv6(&net.addresses)
            .map(Addr128::from_v6)
            .unwrap_or_default(),
        masq_ip,
        masq_port_min,
        masq_port_max,
        flags: if kernel_local {
            PARAM_F_KERNEL_LOCAL
        } else {
            0
        } | match tunnel {
            Tunnel::Tc => PARAM_F_TC_TUNNEL,
            Tunnel::Device => 0,
        },
        ..Params::default()
    }
}

/// The default network's LPM keys of the pod CIDRs.
fn pod_cidr_keys(cidrs: &[IpPrefix]) -> Result<Vec<LpmKey>, NodeError> {
    cidrs
        .iter()
        .map(|c| lpm_key(NET_DEFAULT, c.network(), c.len()).ok_or(NodeError::PodCidr(*c)))
        .collect()
}

/// Whether `key` is a default-network entry that `want` does not hold (other networks'
/// entries belong to other writers).
fn is_stale(key: &LpmKey, want: &[LpmKey]) -> bool {
    key.data().net == NET_DEFAULT
        && !want
            .iter()
            .any(|w| w.prefix_len() == key.prefix_len() && w.data() == key.data())
}

/// `cp_params`, `cp_vnis`, a seed of `cp_vteps` (see [`seed_vteps`]), and
/// `cp_masq_srcs` / `cp_internal` diff-synced to the pod CIDRs.
fn program_node_maps(dp: &mut Datapath, net: &NodeNet, spec: &NodeSpec) -> Result<(), NodeError> {
    dp.set_params(&node_params(
        net,
        spec.masquerade,
        &spec.masq_ports,
        spec.kernel_local,
        spec.tunnel,
    ))?;
    // Other VNIs will belong to VPC writers: only ours is written.
    dp.vnis.insert(&VNI_DEFAULT, &NET_DEFAULT)?;
    let seeded = seed_vteps(dp, net.node_ip)?;
    if seeded > 0 {
        tracing::info!(seeded, "cp_vteps seeded from cp_node_remotes");
    }
    let want = pod_cidr_keys(&spec.pod_cidrs)?;
    // Diff-sync: a CIDR dropped from the configuration must not linger.
    for table in [&mut dp.masq_srcs, &mut dp.internal] {
        for key in &want {
            table.insert(key, &1)?;
        }
        for (key, _) in table.entries()? {
            if is_stale(&key, &want) {
                table.remove(&key)?;
            }
        }
    }
    Ok(())
}

/// Fills an empty `cp_vteps` with the tunnel endpoints `cp_node_remotes` already
/// names (other than `own`); returns how many were written.
///
/// Why: `from_overlay` drops packets from senders not in `cp_vteps`, and the topology
/// sync that fills it runs only after the programs are attached. A restarted agent
/// finds the map pinned and full, but one upgraded from a release without `cp_vteps`
/// (or whose pin was replaced) would drop all cross-node traffic to its pods until
/// that first sync. The endpoints the previous agent synced into `cp_node_remotes` are
/// the same nodes; the first sync then prunes whatever is stale (the entries carry the
/// topology's flag, so the sync owns them).
pub fn seed_vteps(dp: &mut Datapath, own: Ipv4Addr) -> Result<usize, DatapathError> {
    if !dp.vteps.entries()?.is_empty() {
        return Ok(0);
    }
    let endpoints: BTreeSet<Ipv4Addr> = dp
        .node_remotes
        .entries()?
        .iter()
        .map(|(_, r)| r.tunnel_ip())
        .filter(|ip| *ip != own)
        .collect();
    for ep in &endpoints {
        dp.vteps.insert(&vtep_key(*ep), &VTEP_F_NODE)?;
    }
    Ok(endpoints.len())
}

/// Attaches the overlay programs and the uplink hooks: `from_uplink` with
/// masquerade (its reverse) or with Services load-balanced here (`lb`: the
/// per-packet NodePort / LoadBalancer translation, `bpf/lb.h`), `to_uplink`
/// with masquerade only; removes uplink hooks a previous run attached that
/// are no longer wanted. Runs in the node's namespace (interface indexes are
/// resolved there).
fn attach_node_programs(
    dp: &mut Datapath,
    net: &NodeNet,
    masquerade: Masquerade,
    lb: bool,
    tunnel: Tunnel,
    links: &Path,
) -> Result<(), DatapathError> {
    let overlay = Iface::Index(net.overlay.index);
    dp.attach_tcx(
        overlay,
        Program::FromOverlay,
        Direction::Ingress,
        &links.join(PIN_OVERLAY_IN),
    )?;
    dp.attach_tcx(
        overlay,
        Program::ToOverlay,
        Direction::Egress,
        &links.join(PIN_OVERLAY_OUT),
    )?;
    let (up_in, up_out) = (links.join(PIN_UPLINK_IN), links.join(PIN_UPLINK_OUT));
    let uplink = Iface::Index(net.uplink.index);
    match masquerade {
        Masquerade::Bpf => {
            dp.attach_tcx(uplink, Program::ToUplink, Direction::Egress, &up_out)?;
        }
        Masquerade::Off => {
            detach_tcx(&up_out)?;
        }
    }
    // from_uplink: the masquerade's reverse, per-packet Service load
    // balancing, and in tc mode the overlay's decapsulation, whose tail
    // call is armed only now that the node's maps are written
    if tunnel == Tunnel::Tc {
        dp.arm_tc_decap()?;
    }
    if masquerade == Masquerade::Bpf || lb || tunnel == Tunnel::Tc {
        dp.attach_tcx(uplink, Program::FromUplink, Direction::Ingress, &up_in)?;
    } else {
        detach_tcx(&up_in)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, index: u32) -> LinkInfo {
        LinkInfo {
            index,
            name: name.into(),
            mac: None,
            mtu: 1500,
            up: true,
            alias: None,
            kind: None,
            link: None,
            master: None,
        }
    }

    fn net() -> NodeNet {
        NodeNet {
            uplink: link("eth0", 2),
            node_ip: Ipv4Addr::new(192, 168, 1, 10),
            addresses: vec![],
            overlay: link("cozyplane0", 7),
            pod_mtu: 1450,
        }
    }

    fn prefix(s: &str) -> IpPrefix {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_route_names_the_uplink() {
        let gw = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1));
        let mut other_table = Route::via(prefix("0.0.0.0/0"), gw, 9);
        other_table.table = 100;
        let routes = vec![
            Route::on_link(prefix("192.168.1.0/24"), 3),
            other_table,
            Route::via(prefix("0.0.0.0/0"), gw, 4),
        ];
        assert_eq!(default_route_oif(&routes), Some(4));
        assert_eq!(default_route_oif(&routes[..2]), None);
    }

    #[test]
    fn the_node_address_is_the_first_routable_ipv4() {
        let addrs: Vec<IpAddr> = ["fd00::1", "169.254.3.3", "192.168.1.10", "192.168.1.11"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(node_ipv4(&addrs), Some(Ipv4Addr::new(192, 168, 1, 10)));
        assert_eq!(node_ipv4(&addrs[..2]), None);
    }

    #[test]
    fn the_node_ipv6_address_is_the_first_global_one() {
        let addrs: Vec<IpAddr> = [
            "192.168.1.10",
            "fe80::1",
            "::1",
            "ff02::1",
            "64:ff9b::c0a8:10a",
            "fd00:18::b",
            "2001:db8::b",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(node_ipv6(&addrs), Some("fd00:18::b".parse().unwrap()));
        assert_eq!(node_ipv6(&addrs[..5]), None, "none of those is global");
        let mut n = net();
        n.addresses = addrs;
        let p = node_params(&n, Masquerade::Bpf, &MASQ_PORTS, false, Tunnel::Device);
        assert_eq!(p.node_ip6, Addr128::from_v6("fd00:18::b".parse().unwrap()));
        assert_eq!(
            node_params(&net(), Masquerade::Bpf, &MASQ_PORTS, false, Tunnel::Device).node_ip6,
            Addr128::default(),
            "no IPv6 address: all zero"
        );
    }

    #[test]
    fn pod_mtu_is_the_uplinks_minus_the_overhead_unless_given() {
        assert_eq!(pod_mtu(None, 1500, 50, false).unwrap(), 1450);
        assert_eq!(pod_mtu(Some(1400), 1500, 50, false).unwrap(), 1400);
        assert!(matches!(
            pod_mtu(None, 40, 50, false),
            Err(NodeError::MtuBelowOverhead {
                uplink_mtu: 40,
                overhead: 50
            })
        ));
        // IPv6 needs at least 1280, IPv4 alone does not
        assert_eq!(pod_mtu(None, 1300, 50, false).unwrap(), 1250);
        assert!(matches!(
            pod_mtu(None, 1300, 50, true),
            Err(NodeError::MtuOutsideIpv6Range(1250))
        ));
        assert!(matches!(
            pod_mtu(Some(70000), 1500, 50, true),
            Err(NodeError::MtuOutsideIpv6Range(70000))
        ));
        assert_eq!(pod_mtu(Some(1280), 1500, 50, true).unwrap(), 1280);
    }

    #[test]
    fn params_carry_masquerade_only_when_it_is_on() {
        let n = net();
        let on = node_params(&n, Masquerade::Bpf, &MASQ_PORTS, false, Tunnel::Device);
        assert_eq!(on.vxlan_ifindex, 7);
        assert_eq!(on.uplink_ifindex, 2);
        assert_eq!(on.node_ip, [192, 168, 1, 10]);
        assert_eq!(on.masq_ip, [192, 168, 1, 10]);
        assert_eq!((on.masq_port_min, on.masq_port_max), (61000, 65535));
        let off = node_params(&n, Masquerade::Off, &MASQ_PORTS, false, Tunnel::Device);
        assert_eq!(off.node_ip, [192, 168, 1, 10]);
        assert_eq!(off.masq_ip, [0; 4], "all zero disables masquerade");
        assert_eq!((off.masq_port_min, off.masq_port_max), (0, 0));
        let narrow = node_params(&n, Masquerade::Bpf, &(20000..=20999), false, Tunnel::Device);
        assert_eq!((narrow.masq_port_min, narrow.masq_port_max), (20000, 20999));
        assert_eq!(on.flags, 0);
    }

    #[test]
    fn params_hand_local_delivery_to_the_kernel_for_an_iptables_kube_proxy() {
        let p = node_params(&net(), Masquerade::Bpf, &MASQ_PORTS, true, Tunnel::Device);
        assert_eq!(p.flags, PARAM_F_KERNEL_LOCAL);
    }

    #[test]
    fn params_name_the_tunnel_mode_and_it_defaults_to_tc() {
        let tc = node_params(&net(), Masquerade::Bpf, &MASQ_PORTS, true, Tunnel::Tc);
        assert_eq!(tc.flags, PARAM_F_KERNEL_LOCAL | PARAM_F_TC_TUNNEL);
        assert_eq!(tc.uplink_ifindex, net().uplink.index, "tc mode sends there");
        let device = node_params(&net(), Masquerade::Bpf, &MASQ_PORTS, false, Tunnel::Device);
        assert_eq!(device.flags, 0);
        let spec = NodeSpec::new(vec![prefix("10.244.0.0/16")], "/links");
        assert_eq!(spec.tunnel, Tunnel::Tc);
    }

    #[test]
    fn production_masquerade_ports_sit_above_the_ephemeral_range() {
        assert_eq!(MASQ_PORTS, 61000..=65535);
        let spec = NodeSpec::new(vec![prefix("10.244.0.0/16")], "/links");
        assert_eq!(spec.masq_ports, MASQ_PORTS);
        assert_eq!(spec.masquerade, Masquerade::Bpf);
        assert_eq!(spec.uplink, Uplink::DefaultRoute);
        assert_eq!(spec.overlay_device, "cozyplane0");
    }

    #[test]
    fn only_default_network_entries_the_config_dropped_are_stale() {
        let want = pod_cidr_keys(&[prefix("10.244.0.0/16"), prefix("fd00:10:244::/56")]).unwrap();
        assert_eq!(want.len(), 2);
        for k in &want {
            assert!(!is_stale(k, &want));
        }
        let dropped = lpm_key(NET_DEFAULT, "10.245.0.0".parse().unwrap(), 16).unwrap();
        assert!(is_stale(&dropped, &want));
        // same address, other length: a different entry
        let shorter = lpm_key(NET_DEFAULT, "10.244.0.0".parse().unwrap(), 15).unwrap();
        assert!(is_stale(&shorter, &want));
        // another network's entry belongs to another writer
        let vpc = lpm_key(5, "10.245.0.0".parse().unwrap(), 16).unwrap();
        assert!(!is_stale(&vpc, &want));
    }

    #[test]
    fn pod_cidr_keys_clear_host_bits() {
        let keys = pod_cidr_keys(&[prefix("10.244.1.7/16")]).unwrap();
        let clean = lpm_key(NET_DEFAULT, "10.244.0.0".parse().unwrap(), 16).unwrap();
        assert_eq!(keys[0].prefix_len(), clean.prefix_len());
        assert_eq!(keys[0].data(), clean.data());
    }
}

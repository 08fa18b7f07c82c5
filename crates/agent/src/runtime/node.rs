//! Node setup: everything the datapath needs around it before the first pod
//! (docs/datapath.md, "What the agent sets up around it"). Every step is
//! idempotent, so a restarted agent runs the same sequence over what the
//! previous one left, without tearing anything down first.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Params, NET_DEFAULT, OVERLAY_MAC, VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::netlink::{
    sysctl, Encapsulation, IpPrefix, LinkInfo, MacAddr, NlHandle, OverlaySpec, Route,
    POD_GATEWAY_V4,
};
use cozyplane_datapath::{detach_tcx, Datapath, Direction, Iface, Program};

use super::args::{AgentArgs, Masquerade};
use super::error::AgentError;
use super::kernel::SharedDatapath;
use crate::ipam::Pools;

/// First masquerade port. Linux's default ephemeral range ends at 60999, so
/// translated ports never collide with the node's own connections.
pub const MASQ_PORT_MIN: u16 = 61000;
/// Last masquerade port.
pub const MASQ_PORT_MAX: u16 = 65535;

/// What setup learned about the node.
#[derive(Debug, Clone)]
pub struct NodeNet {
    /// The uplink.
    pub uplink: LinkInfo,
    /// The node's IPv4 address on the uplink: tunnel endpoint and
    /// masquerade source.
    pub node_ip: Ipv4Addr,
    /// Every address on the uplink.
    pub addresses: Vec<IpAddr>,
    /// The overlay device.
    pub overlay: LinkInfo,
    /// The pod MTU.
    pub pod_mtu: u32,
}

/// Mounts a bpffs at `dir` unless it already is on one (the datapath crate
/// owns every kernel call).
pub fn ensure_bpffs(dir: &Path) -> Result<(), AgentError> {
    Ok(cozyplane_datapath::ensure_bpffs(dir)?)
}

/// Node-wide sysctls: forwarding on, rp_filter off (decapsulated and
/// redirected packets arrive on devices the reverse path does not name).
pub fn node_sysctls() -> Result<(), AgentError> {
    sysctl::set_ipv4_forwarding(true)?;
    sysctl::set_rp_filter(sysctl::ConfTarget::All, 0)?;
    sysctl::set_rp_filter(sysctl::ConfTarget::Default, 0)?;
    Ok(())
}

/// Finds the uplink (named, or the device of the IPv4 default route) and
/// its IPv4 address.
pub async fn discover_uplink(
    nl: &NlHandle,
    name: Option<&str>,
) -> Result<(LinkInfo, Ipv4Addr, Vec<IpAddr>), AgentError> {
    let link = match name {
        Some(n) => nl.require_link(n).await?,
        None => {
            let routes = nl.list_routes(false).await?;
            let oif = routes
                .iter()
                .filter(|r| r.dst.is_empty() && r.table == Route::MAIN_TABLE)
                .find_map(|r| r.oif)
                .ok_or_else(|| AgentError::InvalidArg {
                    arg: "--uplink",
                    reason: "not given and there is no IPv4 default route".into(),
                })?;
            nl.link_by_index(oif)
                .await?
                .ok_or_else(|| AgentError::InvalidArg {
                    arg: "--uplink",
                    reason: format!("default route device #{oif} vanished"),
                })?
        }
    };
    let addresses: Vec<IpAddr> = nl
        .list_addresses(link.index)
        .await?
        .iter()
        .map(|p| p.addr())
        .collect();
    let node_ip = addresses
        .iter()
        .find_map(|a| match a {
            IpAddr::V4(v4) if !v4.is_link_local() => Some(*v4),
            _ => None,
        })
        .ok_or_else(|| AgentError::InvalidArg {
            arg: "--uplink",
            reason: format!("{} has no IPv4 address", link.name),
        })?;
    Ok((link, node_ip, addresses))
}

/// The overlay device, its rp_filter, the route of every pod CIDR into it
/// and the permanent neighbour of the on-link gateway there.
pub async fn ensure_overlay(
    nl: &NlHandle,
    args: &AgentArgs,
    uplink: &LinkInfo,
    pools: &Pools,
) -> Result<(LinkInfo, u32), AgentError> {
    let encap = Encapsulation::VXLAN_DEFAULT;
    let pod_mtu = match args.mtu {
        Some(m) => m,
        None => uplink
            .mtu
            .checked_sub(encap.overhead())
            .ok_or_else(|| AgentError::InvalidArg {
                arg: "--mtu",
                reason: format!("uplink MTU {} is below the overhead", uplink.mtu),
            })?,
    };
    if !(1280..=65535).contains(&pod_mtu) && pools.iter().any(|p| !p.is_ipv4()) {
        return Err(AgentError::InvalidArg {
            arg: "--mtu",
            reason: format!("{pod_mtu} is below IPv6's minimum of 1280"),
        });
    }
    let overlay = nl
        .ensure_overlay(&OverlaySpec {
            name: args.overlay_device.clone(),
            encap,
            mtu: pod_mtu,
            mac: MacAddr(OVERLAY_MAC),
        })
        .await?;
    sysctl::set_rp_filter(sysctl::ConfTarget::Dev(&overlay.name), 0)?;
    nl.add_permanent_neighbour(
        overlay.index,
        IpAddr::V4(POD_GATEWAY_V4),
        MacAddr(OVERLAY_MAC),
    )
    .await?;
    for pool in pools.iter().filter(|p| p.is_ipv4()) {
        let cidr = pool.cidr();
        let mut route = Route::via(
            IpPrefix::new(cidr.addr(), cidr.len())?,
            IpAddr::V4(POD_GATEWAY_V4),
            overlay.index,
        );
        route.onlink = true;
        nl.replace_route(&route).await?;
    }
    Ok((overlay, pod_mtu))
}

/// `cp_params`, `cp_vnis`, `cp_masq_srcs`, `cp_internal`, and a seed of
/// `cp_vteps` (see [`seed_vteps`]).
pub fn program_node_maps(
    dp: &mut Datapath,
    net: &NodeNet,
    pools: &Pools,
    masquerade: Masquerade,
) -> Result<(), AgentError> {
    let (masq_ip, port_min, port_max) = match masquerade {
        Masquerade::Bpf => (net.node_ip.octets(), MASQ_PORT_MIN, MASQ_PORT_MAX),
        Masquerade::Off => ([0; 4], 0, 0),
    };
    dp.set_params(&Params {
        vxlan_ifindex: net.overlay.index,
        uplink_ifindex: net.uplink.index,
        node_ip: net.node_ip.octets(),
        masq_ip,
        masq_port_min: port_min,
        masq_port_max: port_max,
        ..Params::default()
    })?;
    // Other VNIs will belong to VPC writers: only ours is written.
    dp.vnis.insert(&VNI_DEFAULT, &NET_DEFAULT)?;
    let seeded = seed_vteps(dp, net.node_ip)?;
    if seeded > 0 {
        tracing::info!(seeded, "cp_vteps seeded from cp_node_remotes");
    }
    let mut want = Vec::new();
    for pool in pools.iter() {
        let c = pool.cidr();
        let key =
            lpm_key(NET_DEFAULT, c.addr(), c.len()).ok_or_else(|| AgentError::InvalidArg {
                arg: "--cluster-cidr",
                reason: format!("{}/{} has a bad prefix length", c.addr(), c.len()),
            })?;
        want.push(key);
    }
    // Diff-sync: a CIDR dropped from the flags must not linger (lessons 8.2 #14).
    for table in [&mut dp.masq_srcs, &mut dp.internal] {
        for key in &want {
            table.insert(key, &1)?;
        }
        for (key, _) in table.entries()? {
            if key.data().net == NET_DEFAULT
                && !want
                    .iter()
                    .any(|w| w.prefix_len() == key.prefix_len() && w.data() == key.data())
            {
                table.remove(&key)?;
            }
        }
    }
    Ok(())
}

/// Fills an empty `cp_vteps` with the tunnel endpoints `cp_node_remotes`
/// already names (other than `own`); returns how many were written.
///
/// Why: `from_overlay` drops packets from senders not in `cp_vteps`, and the
/// topology sync that fills it runs only after the programs are attached.
/// A restarted agent finds the map pinned and full, but one upgraded from a
/// release without `cp_vteps` (or whose pin was replaced) would drop all
/// cross-node traffic to its pods until that first sync. The endpoints the
/// previous agent synced into `cp_node_remotes` are the same nodes; the
/// first sync then prunes whatever is stale (the entries carry the
/// topology's flag, so the sync owns them).
pub fn seed_vteps(dp: &mut Datapath, own: Ipv4Addr) -> Result<usize, AgentError> {
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

/// Attaches the overlay programs and (with masquerade) the uplink hooks;
/// without masquerade, removes uplink hooks a previous run attached.
pub fn attach_node_programs(
    shared: &SharedDatapath,
    net: &NodeNet,
    masquerade: Masquerade,
) -> Result<(), AgentError> {
    let links = shared.links_dir().to_path_buf();
    let mut dp = shared.lock();
    dp.attach_tcx(
        Iface::Index(net.overlay.index),
        Program::FromOverlay,
        Direction::Ingress,
        &links.join("overlay-in"),
    )?;
    dp.attach_tcx(
        Iface::Index(net.overlay.index),
        Program::ToOverlay,
        Direction::Egress,
        &links.join("overlay-out"),
    )?;
    let (up_in, up_out) = (links.join("uplink-in"), links.join("uplink-out"));
    match masquerade {
        Masquerade::Bpf => {
            dp.attach_tcx(
                Iface::Index(net.uplink.index),
                Program::ToUplink,
                Direction::Egress,
                &up_out,
            )?;
            dp.attach_tcx(
                Iface::Index(net.uplink.index),
                Program::FromUplink,
                Direction::Ingress,
                &up_in,
            )?;
        }
        Masquerade::Off => {
            detach_tcx(&up_out)?;
            detach_tcx(&up_in)?;
        }
    }
    Ok(())
}

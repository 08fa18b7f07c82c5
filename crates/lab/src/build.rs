//! The construction steps of a [`crate::Topology`], one function per piece.
//!
//! Each step leaves what it made reachable through a recorded namespace name, so the
//! caller's single rollback (teardown by prefix) removes a half-made piece as well.
//! Veths are created from the fabric side in one request with their peer already in
//! the target namespace under its final name, so no half-made pair sits anywhere.

use std::net::IpAddr;

use cozyplane_datapath::netlink::{
    create_named_netns, sysctl, IpPrefix, Netns, NetnsHandle, NlHandle, Route, VethSpec,
};

use crate::error::{LabError, Result};
use crate::spec::{ExternalPlan, NodePlan, Plan, TopologySpec, UNDERLAY_IFNAME};
use crate::state::LabState;
use crate::teardown::list_netns;
use crate::topology::{External, Fabric, Node};

/// The fabric namespace: bridge with the router address, forwarding on.
pub(crate) async fn fabric(spec: &TopologySpec, plan: &Plan) -> Result<Fabric> {
    let netns = create_named_netns(&plan.fabric_netns)?;
    let nl = NlHandle::connect(&netns).await?;
    set_lo_up(&nl).await?;
    let bridge = nl.create_bridge(&plan.bridge, Some(spec.mtu)).await?;
    nl.add_address(bridge.index, spec.underlay.with_len(plan.router))
        .await?;
    nl.set_up(bridge.index).await?;
    netns.run(|| -> cozyplane_datapath::netlink::Result<()> {
        use sysctl::ConfTarget::{All, Default};
        sysctl::set_ipv4_forwarding(true)?;
        for t in [All, Default] {
            sysctl::set_rp_filter(t, 0)?;
        }
        Ok(())
    })??;
    Ok(Fabric {
        name: plan.fabric_netns.clone(),
        netns: NetnsHandle { netns, nl },
        bridge: plan.bridge.clone(),
        bridge_index: bridge.index,
        router_ip: plan.router,
    })
}

/// One node: namespace, veth on the bridge, address, default route via the router,
/// `ip_forward=1` and `rp_filter=0` (the datapath forwards and decapsulates).
pub(crate) async fn node(
    spec: &TopologySpec,
    plan: &Plan,
    fabric: &Fabric,
    node: &NodePlan,
) -> Result<Node> {
    let netns = create_named_netns(&node.name)?;
    attach(fabric, &netns, &node.fabric_port, Port::Bridged, spec.mtu).await?;
    let nl = NlHandle::connect(&netns).await?;
    let eth0 = nl.require_link(UNDERLAY_IFNAME).await?.index;
    let prefix = spec.underlay.with_len(node.ip);
    let gateway = IpAddr::V4(plan.router);
    let default = Route::via(IpPrefix::default_for(gateway), gateway, eth0);
    configure_end(&nl, eth0, prefix, &default).await?;
    netns.run(|| -> cozyplane_datapath::netlink::Result<()> {
        use sysctl::ConfTarget::{All, Default, Dev};
        sysctl::set_ipv4_forwarding(true)?;
        // The kernel uses max(all, dev): "off" needs every level.
        for t in [All, Default, Dev(UNDERLAY_IFNAME)] {
            sysctl::set_rp_filter(t, 0)?;
        }
        Ok(())
    })??;
    Ok(Node {
        name: node.name.clone(),
        index: node.index,
        netns: NetnsHandle { netns, nl },
        underlay_ifname: UNDERLAY_IFNAME.to_string(),
        underlay_ip: node.ip,
        underlay_prefix: prefix,
        gateway: plan.router,
        fabric_port: node.fabric_port.clone(),
        mtu: spec.mtu,
    })
}

/// The external host, on its own segment behind the fabric router, with a route to
/// the underlay only.
pub(crate) async fn external(
    spec: &TopologySpec,
    fabric: &Fabric,
    ext: &ExternalPlan,
) -> Result<External> {
    let netns = create_named_netns(&ext.name)?;
    let net = spec.external_net;
    let port = Port::Routed(net.with_len(ext.gateway));
    attach(fabric, &netns, &ext.fabric_port, port, spec.mtu).await?;
    let nl = NlHandle::connect(&netns).await?;
    let eth0 = nl.require_link(UNDERLAY_IFNAME).await?.index;
    let prefix = net.with_len(ext.ip);
    // Only the underlay, never a default route: replies to pod addresses that were not
    // masqueraded must have nowhere to go.
    let route = Route::via(spec.underlay.as_prefix(), IpAddr::V4(ext.gateway), eth0);
    configure_end(&nl, eth0, prefix, &route).await?;
    Ok(External {
        name: ext.name.clone(),
        netns: NetnsHandle { netns, nl },
        ifname: UNDERLAY_IFNAME.to_string(),
        ip: ext.ip,
        prefix,
        gateway: ext.gateway,
    })
}

/// What the fabric end of a veth is.
enum Port {
    /// A port of the underlay bridge.
    Bridged,
    /// A routed interface of the fabric router with this address.
    Routed(IpPrefix),
}

/// Claims the name: the run directory is created exclusively (two builds of one name
/// cannot both pass), and leftovers of a crashed topology of the same name are refused
/// rather than adopted.
pub(crate) fn claim(spec: &TopologySpec, plan: &Plan) -> Result<()> {
    let exists = |what: String| LabError::AlreadyExists {
        name: plan.name.clone(),
        what,
    };
    std::fs::create_dir_all(&spec.run_root)
        .map_err(|e| LabError::io("create", &spec.run_root, e))?;
    match std::fs::create_dir(&plan.run_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(exists(format!("{} exists", plan.run_dir.display())))
        }
        Err(e) => return Err(LabError::io("create", &plan.run_dir, e)),
    }
    let leftovers = list_netns(&plan.name);
    let leftovers = match leftovers {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir(&plan.run_dir);
            return Err(e);
        }
    };
    if !leftovers.is_empty() {
        let _ = std::fs::remove_dir(&plan.run_dir);
        return Err(exists(format!("namespaces {}", leftovers.join(", "))));
    }
    LabState::new(&plan.name)
        .save(&plan.run_dir)
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&plan.run_dir);
        })
}

async fn set_lo_up(nl: &NlHandle) -> Result<()> {
    let lo = nl.require_link("lo").await?;
    nl.set_up(lo.index).await?;
    Ok(())
}

/// Creates the veth `port` (in the fabric) ↔ `eth0` (in `netns`) and brings the
/// fabric end up as a bridge port or a routed interface.
async fn attach(fabric: &Fabric, netns: &Netns, port: &str, kind: Port, mtu: u32) -> Result<()> {
    let nl = &fabric.netns.nl;
    let local = nl
        .create_veth(&VethSpec {
            name: port,
            peer_name: UNDERLAY_IFNAME,
            peer_netns: Some(netns),
            mtu: Some(mtu),
            peer_mac: None,
            up: false,
        })
        .await?;
    match kind {
        Port::Bridged => nl.set_master(local.index, fabric.bridge_index).await?,
        Port::Routed(addr) => nl.add_address(local.index, addr).await?,
    }
    nl.set_up(local.index).await?;
    Ok(())
}

/// Configures the namespace end of a veth: `lo` and the link up, its address, one route.
async fn configure_end(nl: &NlHandle, index: u32, addr: IpPrefix, route: &Route) -> Result<()> {
    set_lo_up(nl).await?;
    nl.add_address(index, addr).await?;
    nl.set_up(index).await?;
    nl.add_route(route).await?;
    Ok(())
}

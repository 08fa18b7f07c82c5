//! (c) cozyplane: the real eBPF datapath on a lab topology, set up the way the node
//! agent sets up a node (`docs/datapath.md`, "What the agent sets up around it"), so
//! the bench measures the production object and nothing else.
//!
//! Per node:
//! * a private bpffs per topology (mounted under the topology's run directory, so the
//!   lab's teardown unmounts it), one pin directory per node: several "agents" share
//!   the one kernel and must not see each other's maps;
//! * the VXLAN device `cozyplane0` in external (collect_md) mode on port 4789, MAC
//!   `02:cf:cf:cf:cf:cf`, MTU = underlay − 50, `rp_filter` 0; node → pod traffic routed
//!   `10.244.0.0/16 via 169.254.1.1 dev cozyplane0 onlink` with a permanent neighbour;
//! * the pod plumbed with [`plumb`] (veth `cph…`, `/32`, on-link gateway, proxy ARP);
//! * the production object loaded with its maps pinned, the map entries the agent
//!   writes (params, VNI 1 → net 0, every node's tunnel endpoint, masquerade sources and
//!   internal CIDRs, the local pod's port and endpoint *before* `from_pod` is attached,
//!   and a `/32` per remote pod), then every program attached with tcx and pinned
//!   links: `from_pod`/`to_pod` on the pod veth, `from_overlay`/`to_overlay` on the
//!   VXLAN device, `to_uplink`/`from_uplink` on `eth0` (masquerade; cross-node pod
//!   traffic passes them already encapsulated, as in production).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Params, Port, Remote, NET_DEFAULT,
    VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::netlink::{
    host_veth_name, plumb, sysctl, Encapsulation, IpPrefix, MacAddr, OverlaySpec, PlumbRequest,
    Route, POD_GATEWAY_V4,
};
use cozyplane_datapath::{Datapath, Direction, Iface, MapStats, Program};
use cozyplane_lab::{Node, Topology};

use crate::error::{BenchError, Result};
use crate::pods::{create_pod, pod_sysctls, Pod, CLUSTER_CIDR};

/// Name of the overlay device (the agent's default).
pub const OVERLAY_IFNAME: &str = "cozyplane0";
/// Masquerade source ports (the masquerade path is not exercised by pod → pod traffic,
/// but the uplink programs are attached and configured as in production).
const MASQ_PORTS: (u16, u16) = (20000, 29999);

/// One node's datapath as set up.
pub struct CozyNode {
    /// The loaded object; its maps and links are pinned under the topology's bpffs.
    pub datapath: Datapath,
    /// Host-side ifindex of the node's pod veth.
    pub pod_host_ifindex: u32,
}

/// The cozyplane variant: pods in node order and each node's datapath.
pub struct Overlay {
    /// Pods, in node order.
    pub pods: Vec<Pod>,
    /// Datapaths, in node order.
    pub nodes: Vec<CozyNode>,
    /// Time spent loading the object (verifier included), summed over nodes.
    pub load_time: Duration,
}

impl Overlay {
    /// Memory charged per map on the first node (every node has the same maps).
    pub fn map_stats(&self) -> Result<Vec<MapStats>> {
        match self.nodes.first() {
            Some(n) => Ok(n.datapath.map_stats()?),
            None => Ok(Vec::new()),
        }
    }

    /// Drops by reason (label, count), summed over the nodes; only non-zero ones.
    pub fn drops(&self) -> Result<Vec<(&'static str, u64)>> {
        let mut total: Vec<(DropReason, u64)> = Vec::new();
        for n in &self.nodes {
            for (reason, count) in n.datapath.drops()? {
                match total.iter_mut().find(|(r, _)| *r == reason) {
                    Some(slot) => slot.1 += count,
                    None => total.push((reason, count)),
                }
            }
        }
        Ok(total
            .into_iter()
            .filter(|(_, c)| *c > 0)
            .map(|(r, c)| (r.label(), c))
            .collect())
    }
}

/// Mounts a private bpffs at `<run dir>/bpffs` (removed by the lab's teardown, which
/// unmounts everything under the run directory).
fn mount_bpffs(topo: &Topology) -> Result<PathBuf> {
    let dir = topo.run_dir().join("bpffs");
    cozyplane_datapath::ensure_bpffs(&dir)?;
    Ok(dir)
}

/// Network-side setup of one node (device, route, neighbour, pod).
struct Plumbed {
    pod: Pod,
    vxlan_ifindex: u32,
    uplink_ifindex: u32,
    host_ifname: String,
    host_ifindex: u32,
    pod_mac: [u8; 6],
}

async fn plumb_node(topo: &Topology, node: &Node) -> Result<Plumbed> {
    let nl = &node.netns.nl;
    let encap = Encapsulation::VXLAN_DEFAULT;
    let mtu = node.mtu.checked_sub(encap.overhead()).ok_or_else(|| {
        BenchError::Invalid(format!("underlay MTU {} too small for VXLAN", node.mtu))
    })?;
    let vxlan = nl
        .ensure_overlay(&OverlaySpec {
            name: OVERLAY_IFNAME.to_string(),
            encap,
            mtu,
            mac: MacAddr::OVERLAY,
        })
        .await?;
    node.netns
        .netns
        .run(|| sysctl::set_rp_filter(sysctl::ConfTarget::Dev(OVERLAY_IFNAME), 0))??;
    let gw = IpAddr::V4(POD_GATEWAY_V4);
    nl.add_permanent_neighbour(vxlan.index, gw, MacAddr::OVERLAY)
        .await?;
    let cluster = IpPrefix::new(IpAddr::V4(CLUSTER_CIDR.0), CLUSTER_CIDR.1)?;
    let mut to_pods = Route::via(cluster, gw, vxlan.index);
    to_pods.onlink = true;
    nl.add_route(&to_pods).await?;
    let uplink = nl.require_link(&node.underlay_ifname).await?;

    let pod = create_pod(topo, node)?;
    let container_id = format!("{}-bench", pod.name);
    let host_ifname = host_veth_name(&container_id, "eth0");
    let plumbed = plumb(
        &node.netns,
        &PlumbRequest {
            pod_netns: pod.netns.path(),
            ifname: "eth0",
            host_ifname: &host_ifname,
            mtu,
            ipv4: Some(pod.ip),
            ipv6: None,
            pod_mac: None,
            alias: &container_id,
        },
    )
    .await?;
    pod_sysctls(&pod)?;
    Ok(Plumbed {
        pod,
        vxlan_ifindex: vxlan.index,
        uplink_ifindex: uplink.index,
        host_ifname,
        host_ifindex: plumbed.host_ifindex,
        pod_mac: plumbed.pod_mac.0,
    })
}

/// Writes the node-wide map entries the agent writes at start-up.
fn write_node_maps(
    dp: &mut Datapath,
    node: &Node,
    p: &Plumbed,
    all_nodes: &[Ipv4Addr],
) -> Result<()> {
    dp.set_params(&Params {
        vxlan_ifindex: p.vxlan_ifindex,
        uplink_ifindex: p.uplink_ifindex,
        node_ip: node.ip().octets(),
        masq_ip: node.ip().octets(),
        masq_port_min: MASQ_PORTS.0,
        masq_port_max: MASQ_PORTS.1,
        ..Params::default()
    })?;
    dp.vnis.insert(&VNI_DEFAULT, &NET_DEFAULT)?;
    for ip in all_nodes {
        dp.node_remotes
            .insert(&Addr128::from_v4(*ip), &Remote::new(*ip))?;
        // The other nodes are the senders from_overlay accepts (bpf/learn.h).
        if *ip != node.ip() {
            dp.vteps.insert(&vtep_key(*ip), &VTEP_F_NODE)?;
        }
    }
    let cluster = lpm_key(NET_DEFAULT, IpAddr::V4(CLUSTER_CIDR.0), CLUSTER_CIDR.1)
        .ok_or_else(|| BenchError::Invalid("cluster CIDR".into()))?;
    dp.masq_srcs.insert(&cluster, &1)?;
    dp.internal.insert(&cluster, &1)?;
    // Fail closed: the pod's port and endpoint exist before from_pod sees a packet.
    dp.ports.insert(
        &p.host_ifindex,
        &Port {
            net: NET_DEFAULT,
            flags: 0,
        },
    )?;
    dp.locals.insert(
        &EpKey::new(NET_DEFAULT, p.pod.ip),
        &Endpoint {
            ifindex: p.host_ifindex,
            mac: p.pod_mac,
            flags: 0,
        },
    )?;
    Ok(())
}

/// Attaches every program on the node, from inside its namespace (tcx resolves
/// interface names there), with links pinned under `links`.
fn attach_all(
    dp: &mut Datapath,
    node: &Node,
    host_ifname: &str,
    uplink: &str,
    links: &Path,
) -> Result<()> {
    let plan = [
        (host_ifname, Program::FromPod, Direction::Ingress, "pod-in"),
        (host_ifname, Program::ToPod, Direction::Egress, "pod-out"),
        (
            OVERLAY_IFNAME,
            Program::FromOverlay,
            Direction::Ingress,
            "ovl-in",
        ),
        (
            OVERLAY_IFNAME,
            Program::ToOverlay,
            Direction::Egress,
            "ovl-out",
        ),
        (uplink, Program::ToUplink, Direction::Egress, "up-out"),
        (uplink, Program::FromUplink, Direction::Ingress, "up-in"),
    ];
    node.netns.netns.run(|| -> Result<()> {
        for (ifname, prog, dir, tag) in plan {
            dp.attach_tcx(Iface::Name(ifname), prog, dir, &links.join(tag))?;
        }
        Ok(())
    })?
}

/// Builds (c) on a lab topology; see the module docs for what it sets up.
pub async fn setup(topo: &Topology) -> Result<Overlay> {
    let bpffs = mount_bpffs(topo)?;
    let nodes = topo.nodes();
    let node_ips: Vec<Ipv4Addr> = nodes.iter().map(Node::ip).collect();
    let mut plumbed = Vec::with_capacity(nodes.len());
    for node in nodes {
        plumbed.push(plumb_node(topo, node).await?);
    }
    let mut out = Overlay {
        pods: Vec::with_capacity(nodes.len()),
        nodes: Vec::with_capacity(nodes.len()),
        load_time: Duration::ZERO,
    };
    let mut datapaths = Vec::with_capacity(nodes.len());
    for (node, p) in nodes.iter().zip(&plumbed) {
        let dir = bpffs.join(&node.name);
        let links = dir.join("links");
        std::fs::create_dir_all(&links)
            .map_err(|e| BenchError::io(format!("create {}", links.display()), e))?;
        let started = Instant::now();
        let mut dp = Datapath::load(dir.join("maps"))?;
        out.load_time += started.elapsed();
        write_node_maps(&mut dp, node, p, &node_ips)?;
        datapaths.push((dp, links));
    }
    // Remote pods: a /32 per pod to the node that holds it (what FabricIPs become).
    for (i, (dp, _)) in datapaths.iter_mut().enumerate() {
        for (j, (other, p)) in nodes.iter().zip(&plumbed).enumerate() {
            if i == j {
                continue;
            }
            let key = lpm_key(NET_DEFAULT, IpAddr::V4(p.pod.ip), 32)
                .ok_or_else(|| BenchError::Invalid(format!("pod address {}", p.pod.ip)))?;
            dp.remotes.insert(&key, &Remote::new(other.ip()))?;
        }
    }
    for ((node, p), (mut dp, links)) in nodes.iter().zip(plumbed).zip(datapaths) {
        attach_all(&mut dp, node, &p.host_ifname, &node.underlay_ifname, &links)?;
        out.nodes.push(CozyNode {
            datapath: dp,
            pod_host_ifindex: p.host_ifindex,
        });
        out.pods.push(p.pod);
    }
    Ok(out)
}

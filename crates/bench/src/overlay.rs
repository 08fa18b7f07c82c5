//! (c) cozyplane: the real eBPF datapath on a lab topology, each node brought up by
//! the function the node agent calls at start-up, [`cozyplane_datapath::node::bring_up`]
//! (`docs/datapath.md`, "What the agent sets up around it"), so the bench measures the
//! production object and node set-up and nothing else.
//!
//! Per node:
//! * a private bpffs per topology (mounted under the topology's run directory, so the
//!   lab's teardown unmounts it), one pin directory per node: several "agents" share
//!   the one kernel and must not see each other's maps;
//! * the production object loaded with its maps pinned, then [`bring_up`] with the
//!   agent's defaults: node sysctls, the VXLAN device `cozyplane0` (MTU = underlay − 50)
//!   with its gateway neighbour and the route of `10.244.0.0/16` into it, the node maps,
//!   `from_overlay`/`to_overlay` on it and the masquerade hooks `to_uplink`/`from_uplink`
//!   on `eth0` (cross-node pod traffic passes them already encapsulated, as in
//!   production). One difference from the lab's agents: the uplink is named (the lab
//!   node's underlay `eth0`) rather than found through the default route, which here
//!   is the same device;
//! * what the agent's topology sync would then write from the Node objects:
//!   `cp_node_remotes` for every node (its own included) and `cp_vteps` for the others;
//! * the pod plumbed with [`plumb`] (veth `cph…`, `/32`, on-link gateway, proxy ARP),
//!   its port and endpoint written *before* `from_pod` is attached (fail closed), and
//!   `from_pod`/`to_pod` attached as the agent's CNI path attaches them (tc filters,
//!   [`attach_pod_programs`]), as a CNI ADD does;
//! * a `/32` per remote pod to the node that holds it (what FabricIPs become).
//!
//! With [`PodNetwork::Vpc`] (variant (d)) the pods join one VPC instead, attached as the
//! agent's CNI ADD attaches a VPC pod (docs/agent.md, "VPC attachments"):
//! * `cp_vnis` maps the VPC's VNI to its network (what the agent's VPC sync writes);
//! * the pod holds only its VPC address ([`vpc_pod_ip`], from
//!   [`VPC_CIDR`](crate::pods::VPC_CIDR)) and the node gets no host route to it;
//! * the host veth's port is on the VPC's network; `cp_locals` gets
//!   `{vni, VPC address}` and the guard entry `{0, fabric address}`;
//! * the fabric address ([`crate::pods::pod_ip`], the pod's FabricIP) is bridged
//!   (`plumb_bridge`'s neighbour and host route, then `put_bridge`), then the programs
//!   are attached;
//! * remote pods get a `/32` at the VPC's network (what the other node's Port becomes)
//!   besides the one of their fabric address at net 0.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Port, Remote, NET_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::meter::NetCounters;
use cozyplane_datapath::netlink::{host_veth_name, plumb, plumb_bridge, IpPrefix, PlumbRequest};
use cozyplane_datapath::node::{bring_up, NodeSpec, Tunnel, Uplink};
use cozyplane_datapath::{attach_pod_programs, Datapath, MapStats};
use cozyplane_lab::{Node, Topology};

use crate::error::{BenchError, Result};
use crate::pods::{create_pod_at, pod_ip, pod_sysctls, vpc_pod_ip, Pod, CLUSTER_CIDR};

/// The network the pods join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodNetwork {
    /// Net 0, the default network: the pod holds its fabric address.
    Default,
    /// A VPC with this VNI (= its network id, ≥ 100): the pod holds its VPC address
    /// and its fabric address is bridged.
    Vpc {
        /// The VPC's VNI.
        vni: u32,
    },
}

impl PodNetwork {
    /// The network id of the pods' ports and endpoints.
    pub fn net(self) -> u32 {
        match self {
            PodNetwork::Default => NET_DEFAULT,
            PodNetwork::Vpc { vni } => vni,
        }
    }

    /// The address node `node`'s pod holds (and is measured at).
    fn pod_ip(self, node: usize) -> Result<Ipv4Addr> {
        match self {
            PodNetwork::Default => pod_ip(node),
            PodNetwork::Vpc { .. } => vpc_pod_ip(node),
        }
    }
}

/// One node's datapath as set up.
pub struct CozyNode {
    /// The loaded object; its maps and links are pinned under the topology's bpffs.
    pub datapath: Datapath,
    /// Host-side ifindex of the node's pod veth.
    pub pod_host_ifindex: u32,
}

/// The cozyplane variant: pods in node order and each node's datapath.
pub struct Overlay {
    /// The network the pods joined.
    pub network: PodNetwork,
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

    /// The pods' network's meter (`cp_meters`), summed over the nodes; `None` on net 0,
    /// which is not metered.
    pub fn metered(&self) -> Result<Option<NetCounters>> {
        let PodNetwork::Vpc { vni } = self.network else {
            return Ok(None);
        };
        let mut total = NetCounters::default();
        for n in &self.nodes {
            if let Some(c) = n.datapath.net_counters()?.get(&vni) {
                total.ingress.packets += c.ingress.packets;
                total.ingress.bytes += c.ingress.bytes;
                total.egress.packets += c.egress.packets;
                total.egress.bytes += c.egress.bytes;
            }
        }
        Ok(Some(total))
    }
}

/// Mounts a private bpffs at `<run dir>/bpffs` (removed by the lab's teardown, which
/// unmounts everything under the run directory).
fn mount_bpffs(topo: &Topology) -> Result<PathBuf> {
    let dir = topo.run_dir().join("bpffs");
    cozyplane_datapath::ensure_bpffs(&dir)?;
    Ok(dir)
}

/// The node-wide entries the agent's topology sync writes from the Node objects:
/// every node's address to its tunnel endpoint (its own included), and the other
/// nodes as the senders `from_overlay` accepts (`bpf/learn.h`).
fn write_topology(dp: &mut Datapath, own: Ipv4Addr, all_nodes: &[Ipv4Addr]) -> Result<()> {
    for ip in all_nodes {
        dp.node_remotes
            .insert(&Addr128::from_v4(*ip), &Remote::new(*ip))?;
        if *ip != own {
            dp.vteps.insert(&vtep_key(*ip), &VTEP_F_NODE)?;
        }
    }
    Ok(())
}

/// A pod as a CNI ADD through the agent leaves it: plumbed, its port and endpoint
/// written before `from_pod` is attached (fail closed), then `from_pod`/`to_pod`
/// attached in the node's namespace as the agent attaches them. A VPC
/// pod's port and endpoint are on the VPC's network and its fabric address is bridged
/// (the agent's order: port, locals, bridge, attach).
async fn add_pod(
    topo: &Topology,
    node: &Node,
    dp: &mut Datapath,
    network: PodNetwork,
    pod_mtu: u32,
) -> Result<(Pod, u32)> {
    let pod = create_pod_at(topo, node, network.pod_ip(node.index)?)?;
    let fabric = pod_ip(node.index)?;
    let net = network.net();
    let container_id = format!("{}-bench", pod.name);
    let host_ifname = host_veth_name(&container_id, "eth0");
    let plumbed = plumb(
        &node.netns,
        &PlumbRequest {
            pod_netns: pod.netns.path(),
            ifname: "eth0",
            host_ifname: &host_ifname,
            mtu: pod_mtu,
            ipv4: Some(pod.ip),
            ipv6: None,
            pod_mac: None,
            alias: &container_id,
            // A VPC address is never a host route (twin VPCs share addresses); the
            // fabric address gets its route with the bridge below.
            host_routes: (net != NET_DEFAULT).then_some(&[][..]),
        },
    )
    .await?;
    pod_sysctls(&pod)?;
    let ifindex = plumbed.host_ifindex;
    dp.ports.insert(&ifindex, &Port { net, flags: 0 })?;
    let endpoint = Endpoint {
        ifindex,
        mac: plumbed.pod_mac.0,
        flags: 0,
    };
    dp.locals
        .insert(&EpKey::new(net, IpAddr::V4(pod.ip)), &endpoint)?;
    if net != NET_DEFAULT {
        // The guard entry of the fabric address, then the dual-address bridge.
        dp.locals
            .insert(&EpKey::new(NET_DEFAULT, IpAddr::V4(fabric)), &endpoint)?;
        plumb_bridge(&node.netns.nl, ifindex, IpAddr::V4(fabric), plumbed.pod_mac).await?;
        dp.put_bridge(IpAddr::V4(fabric), net, IpAddr::V4(pod.ip), ifindex)?;
    }
    let programs = dp.pod_programs()?;
    attach_pod_programs(&node.netns.nl, ifindex, &programs).await?;
    Ok((pod, ifindex))
}

/// Builds (c) (or (d), with [`PodNetwork::Vpc`]; (f) with [`Tunnel::Device`]) on a lab
/// topology; see the module docs for what it sets up.
pub async fn setup(topo: &Topology, network: PodNetwork, tunnel: Tunnel) -> Result<Overlay> {
    let bpffs = mount_bpffs(topo)?;
    let nodes = topo.nodes();
    let node_ips: Vec<Ipv4Addr> = nodes.iter().map(Node::ip).collect();
    let cluster = IpPrefix::new(IpAddr::V4(CLUSTER_CIDR.0), CLUSTER_CIDR.1)?;
    let mut out = Overlay {
        network,
        pods: Vec::with_capacity(nodes.len()),
        nodes: Vec::with_capacity(nodes.len()),
        load_time: Duration::ZERO,
    };
    for node in nodes {
        let dir = bpffs.join(&node.name);
        let links = dir.join("links");
        std::fs::create_dir_all(&links)
            .map_err(|e| BenchError::io(format!("create {}", links.display()), e))?;
        let started = Instant::now();
        let mut dp = Datapath::load(dir.join("maps"))?;
        out.load_time += started.elapsed();
        let spec = NodeSpec {
            uplink: Uplink::Named(node.underlay_ifname.clone()),
            tunnel,
            ..NodeSpec::new(vec![cluster], &links)
        };
        let net = bring_up(&node.netns, &spec, || &mut dp).await?;
        if net.node_ip != node.ip() {
            return Err(BenchError::Invalid(format!(
                "{}: bring-up found node address {}, the lab assigned {}",
                node.name,
                net.node_ip,
                node.ip()
            )));
        }
        write_topology(&mut dp, node.ip(), &node_ips)?;
        if let PodNetwork::Vpc { vni } = network {
            // The agent's VPC sync: the VNIs `from_overlay` accepts, and their networks.
            dp.vnis.insert(&vni, &vni)?;
        }
        let (pod, pod_host_ifindex) = add_pod(topo, node, &mut dp, network, net.pod_mtu).await?;
        out.nodes.push(CozyNode {
            datapath: dp,
            pod_host_ifindex,
        });
        out.pods.push(pod);
    }
    // Remote pods: a /32 per pod to the node that holds it, at net 0 for its fabric
    // address (what FabricIPs become) and, for a VPC pod, at the VPC's network for its
    // VPC address (what its Port becomes).
    for (i, n) in out.nodes.iter_mut().enumerate() {
        for (j, (other, pod)) in nodes.iter().zip(&out.pods).enumerate() {
            if i == j {
                continue;
            }
            let mut addresses = vec![(NET_DEFAULT, pod_ip(other.index)?)];
            if network.net() != NET_DEFAULT {
                addresses.push((network.net(), pod.ip));
            }
            for (net, ip) in addresses {
                let key = lpm_key(net, IpAddr::V4(ip), 32)
                    .ok_or_else(|| BenchError::Invalid(format!("pod address {ip}")))?;
                n.datapath.remotes.insert(&key, &Remote::new(other.ip()))?;
            }
        }
    }
    Ok(out)
}

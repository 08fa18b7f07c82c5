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
//!   `from_pod`/`to_pod` attached with the link pins the agent's CNI path uses, as a
//!   CNI ADD does;
//! * a `/32` per remote pod to the node that holds it (what FabricIPs become).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Port, Remote, NET_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::netlink::{host_veth_name, plumb, IpPrefix, PlumbRequest};
use cozyplane_datapath::node::{bring_up, NodeSpec, Uplink};
use cozyplane_datapath::{Datapath, Direction, Iface, MapStats, Program};
use cozyplane_lab::{Node, Topology};

use crate::error::{BenchError, Result};
use crate::pods::{create_pod, pod_sysctls, Pod, CLUSTER_CIDR};

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
/// attached from inside the node's namespace with the agent's link pin names.
async fn add_pod(
    topo: &Topology,
    node: &Node,
    dp: &mut Datapath,
    pod_mtu: u32,
    links: &Path,
) -> Result<(Pod, u32)> {
    let pod = create_pod(topo, node)?;
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
            host_routes: None,
        },
    )
    .await?;
    pod_sysctls(&pod)?;
    let ifindex = plumbed.host_ifindex;
    dp.ports.insert(
        &ifindex,
        &Port {
            net: NET_DEFAULT,
            flags: 0,
        },
    )?;
    dp.locals.insert(
        &EpKey::new(NET_DEFAULT, IpAddr::V4(pod.ip)),
        &Endpoint {
            ifindex,
            mac: plumbed.pod_mac.0,
            flags: 0,
        },
    )?;
    let (pin_in, pin_out) = (
        links.join(format!("{host_ifname}-in")),
        links.join(format!("{host_ifname}-out")),
    );
    node.netns.netns.run(|| -> Result<()> {
        dp.attach_tcx(
            Iface::Index(ifindex),
            Program::FromPod,
            Direction::Ingress,
            &pin_in,
        )?;
        dp.attach_tcx(
            Iface::Index(ifindex),
            Program::ToPod,
            Direction::Egress,
            &pin_out,
        )?;
        Ok(())
    })??;
    Ok((pod, ifindex))
}

/// Builds (c) on a lab topology; see the module docs for what it sets up.
pub async fn setup(topo: &Topology) -> Result<Overlay> {
    let bpffs = mount_bpffs(topo)?;
    let nodes = topo.nodes();
    let node_ips: Vec<Ipv4Addr> = nodes.iter().map(Node::ip).collect();
    let cluster = IpPrefix::new(IpAddr::V4(CLUSTER_CIDR.0), CLUSTER_CIDR.1)?;
    let mut out = Overlay {
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
        let (pod, pod_host_ifindex) = add_pod(topo, node, &mut dp, net.pod_mtu, &links).await?;
        out.nodes.push(CozyNode {
            datapath: dp,
            pod_host_ifindex,
        });
        out.pods.push(pod);
    }
    // Remote pods: a /32 per pod to the node that holds it (what FabricIPs become).
    for (i, n) in out.nodes.iter_mut().enumerate() {
        for (j, (other, pod)) in nodes.iter().zip(&out.pods).enumerate() {
            if i == j {
                continue;
            }
            let key = lpm_key(NET_DEFAULT, IpAddr::V4(pod.ip), 32)
                .ok_or_else(|| BenchError::Invalid(format!("pod address {}", pod.ip)))?;
            n.datapath.remotes.insert(&key, &Remote::new(other.ip()))?;
        }
    }
    Ok(out)
}

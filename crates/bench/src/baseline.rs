//! The two reference topologies, (a) the limit and (b) the peer, on a lab topology.
//!
//! They reproduce `topo.sh` of the peer baselines (`peer-baselines.md`, Appendix B)
//! command for command with iproute2, on purpose: they are somebody else's datapath,
//! and spelling them in the same commands makes the equivalence easy to audit. Only
//! the underlay differs: the lab joins the nodes through its fabric bridge rather than
//! one veth, which every variant of a run shares, so the ratios stay comparable.
//!
//! * **(a) direct**: the node-side veth holds `10.244.<i>.1/24`, the pod routes by
//!   default via it, and each node routes the other pod subnet via the other node's
//!   underlay address. No bridge, no encapsulation; pod MTU = underlay MTU.
//! * **(b) flannel-style**: bridge `cni0` with the gateway address and the pod veth
//!   as a port, `flannel.1` (VXLAN id 1, dstport 8472, `nolearning`) with
//!   `10.244.<i>.0/32`, and per remote node an `onlink` route via `10.244.<r>.0`, a
//!   permanent neighbour for that address at the remote `flannel.1` MAC and a static
//!   fdb entry sending that MAC to the remote underlay address. Pod MTU = 1450.

use cozyplane_lab::{Node, Topology};

use crate::error::{BenchError, Result};
use crate::pods::{create_pod, pod_subnet, pod_sysctls, run_ok, Pod};

/// MTU of (b)'s pods, bridge and VXLAN device, as flannel configures it.
pub const FLANNEL_MTU: u32 = 1450;

/// Host-side name of node `i`'s pod veth.
fn host_veth(node: &Node) -> String {
    format!("vethp{}", node.index)
}

/// The veth pair and the pod side: address `/24`, default route via `gw`, `lo` up.
async fn pod_with_veth(topo: &Topology, node: &Node, mtu: u32, gw: &str) -> Result<Pod> {
    let pod = create_pod(topo, node)?;
    let mtu = mtu.to_string();
    let veth = host_veth(node);
    run_ok(
        node,
        &[
            "ip", "link", "add", &veth, "mtu", &mtu, "type", "veth", "peer", "name", "eth0",
            "netns", &pod.name, "mtu", &mtu,
        ],
    )
    .await?;
    let addr = format!("{}/24", pod.ip);
    for argv in [
        &["ip", "link", "set", "lo", "up"][..],
        &["ip", "addr", "add", &addr, "dev", "eth0"],
        &["ip", "link", "set", "eth0", "up"],
        &["ip", "route", "add", "default", "via", gw],
    ] {
        run_ok(&pod, argv).await?;
    }
    pod_sysctls(&pod)?;
    run_ok(node, &["ip", "link", "set", &veth, "up"]).await?;
    Ok(pod)
}

fn gateway(node: &Node) -> Result<String> {
    let net = pod_subnet(node.index)?.octets();
    Ok(format!("{}.{}.{}.1", net[0], net[1], net[2]))
}

/// (a): builds pods and routes on a 2-node lab topology; returns the pods in node
/// order.
pub async fn direct(topo: &Topology) -> Result<Vec<Pod>> {
    let nodes = topo.nodes();
    let mut pods = Vec::with_capacity(nodes.len());
    for node in nodes {
        let gw = gateway(node)?;
        let pod = pod_with_veth(topo, node, node.mtu, &gw).await?;
        run_ok(
            node,
            &[
                "ip",
                "addr",
                "add",
                &format!("{gw}/24"),
                "dev",
                &host_veth(node),
            ],
        )
        .await?;
        pods.push(pod);
    }
    for node in nodes {
        for other in nodes.iter().filter(|o| o.index != node.index) {
            let subnet = format!("{}/24", pod_subnet(other.index)?);
            let via = other.ip().to_string();
            run_ok(node, &["ip", "route", "add", &subnet, "via", &via]).await?;
        }
    }
    Ok(pods)
}

/// (b): builds the flannel VXLAN backend's topology; returns the pods in node order.
pub async fn flannel(topo: &Topology) -> Result<Vec<Pod>> {
    let nodes = topo.nodes();
    let mtu = FLANNEL_MTU.to_string();
    let mut pods = Vec::with_capacity(nodes.len());
    for node in nodes {
        let gw = gateway(node)?;
        let gw_cidr = format!("{gw}/24");
        for argv in [
            &["ip", "link", "add", "cni0", "mtu", &mtu, "type", "bridge"][..],
            &["ip", "addr", "add", &gw_cidr, "dev", "cni0"],
            &["ip", "link", "set", "cni0", "up"],
        ] {
            run_ok(node, argv).await?;
        }
        let pod = pod_with_veth(topo, node, FLANNEL_MTU, &gw).await?;
        let local = node.ip().to_string();
        let vtep = format!("{}/32", pod_subnet(node.index)?);
        for argv in [
            &["ip", "link", "set", &host_veth(node), "master", "cni0"][..],
            &[
                "ip",
                "link",
                "add",
                "flannel.1",
                "type",
                "vxlan",
                "id",
                "1",
                "local",
                &local,
                "dev",
                &node.underlay_ifname,
                "dstport",
                "8472",
                "nolearning",
            ],
            &["ip", "link", "set", "flannel.1", "mtu", &mtu],
            &["ip", "addr", "add", &vtep, "dev", "flannel.1"],
            &["ip", "link", "set", "flannel.1", "up"],
        ] {
            run_ok(node, argv).await?;
        }
        pods.push(pod);
    }
    let mut macs = Vec::with_capacity(nodes.len());
    for node in nodes {
        let link = node.netns.nl.require_link("flannel.1").await?;
        let mac = link.mac.ok_or_else(|| BenchError::Output {
            what: format!("flannel.1 in {}", node.name),
            reason: "no MAC address".into(),
        })?;
        macs.push(mac.to_string());
    }
    for node in nodes {
        for (other, mac) in nodes.iter().zip(&macs) {
            if other.index == node.index {
                continue;
            }
            let vtep = pod_subnet(other.index)?.to_string();
            let subnet = format!("{vtep}/24");
            let underlay = other.ip().to_string();
            for argv in [
                &[
                    "ip",
                    "route",
                    "add",
                    &subnet,
                    "via",
                    &vtep,
                    "dev",
                    "flannel.1",
                    "onlink",
                ][..],
                &[
                    "ip",
                    "neigh",
                    "add",
                    &vtep,
                    "lladdr",
                    mac,
                    "dev",
                    "flannel.1",
                    "nud",
                    "permanent",
                ],
                &[
                    "bridge",
                    "fdb",
                    "append",
                    mac,
                    "dev",
                    "flannel.1",
                    "dst",
                    &underlay,
                ],
            ] {
                run_ok(node, argv).await?;
            }
        }
    }
    Ok(pods)
}

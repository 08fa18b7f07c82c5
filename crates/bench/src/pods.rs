//! Pod namespaces and the small helpers every topology variant shares.
//!
//! The lab builds nodes, not pods. A pod here is a named namespace
//! `<topology>-pod<i>`: carrying the topology's prefix means the lab's teardown
//! (which discovers every `/run/netns/<prefix>-*` and every process inside one) removes
//! it with the rest, also after a crash of the bench.

use std::net::Ipv4Addr;

use cozyplane_datapath::netlink::{create_named_netns, sysctl, Netns};
use cozyplane_lab::{exec_in_async, LabHost, Node, Topology};

use crate::error::{BenchError, Result};

/// A pod: a namespace with one interface (`eth0`) and an address.
#[derive(Debug)]
pub struct Pod {
    /// Namespace name (`<topology>-pod<i>`).
    pub name: String,
    /// The namespace.
    pub netns: Netns,
    /// Its address.
    pub ip: Ipv4Addr,
}

impl LabHost for Pod {
    fn name(&self) -> &str {
        &self.name
    }
    fn netns(&self) -> &Netns {
        &self.netns
    }
}

/// The pod network plan every variant uses: node *i* owns `10.244.<i>.0/24`, its pod
/// is `.10` (as in the peer baselines).
pub fn pod_ip(node: usize) -> Result<Ipv4Addr> {
    let i = u8::try_from(node)
        .map_err(|_| BenchError::Invalid(format!("node index {node} above 255")))?;
    Ok(Ipv4Addr::new(10, 244, i, 10))
}

/// The pod CIDR of node `node`'s network address (`10.244.<i>.0`).
pub fn pod_subnet(node: usize) -> Result<Ipv4Addr> {
    let ip = pod_ip(node)?.octets();
    Ok(Ipv4Addr::new(ip[0], ip[1], ip[2], 0))
}

/// The cluster pod CIDR all pod subnets come from (`10.244.0.0/16`).
pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);

/// The VPC the bench's VPC pods (variant (d)) join: its VNI, which is also its network
/// id (docs/datapath.md, "Addressing").
pub const VPC_VNI: u32 = 100;

/// The VPC's CIDR: any tenant may use it (VPC CIDRs overlap each other), and it is
/// neither the cluster pod CIDR nor the lab's underlay.
pub const VPC_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 250, 0, 0), 24);

/// The VPC address of node `node`'s pod in the bench's VPC: `10.250.0.<10 + i>`. Its
/// fabric (net 0) address is still [`pod_ip`], bridged as the agent does.
pub fn vpc_pod_ip(node: usize) -> Result<Ipv4Addr> {
    let i = u8::try_from(node)
        .ok()
        .and_then(|i| i.checked_add(10))
        .filter(|host| *host < 255)
        .ok_or_else(|| BenchError::Invalid(format!("node index {node} above 244")))?;
    let net = VPC_CIDR.0.octets();
    Ok(Ipv4Addr::new(net[0], net[1], net[2], i))
}

/// Creates the (empty) namespace of node `node`'s pod, with `lo` down; the variant
/// plumbs it with its default-network address [`pod_ip`]. Part of the topology's
/// prefix, so its teardown removes it.
pub fn create_pod(topo: &Topology, node: &Node) -> Result<Pod> {
    create_pod_at(topo, node, pod_ip(node.index)?)
}

/// [`create_pod`] for a pod that will hold `ip` (a VPC pod's VPC address).
pub fn create_pod_at(topo: &Topology, node: &Node, ip: Ipv4Addr) -> Result<Pod> {
    let name = format!("{}-pod{}", topo.name(), node.index);
    let netns = create_named_netns(&name)?;
    Ok(Pod { name, netns, ip })
}

/// Sets `tcp_tw_reuse=1` in the pod, as the peer baselines' pods do (not needed by
/// the CRR test, whose server closes first, but kept for identical conditions).
pub fn pod_sysctls(pod: &Pod) -> Result<()> {
    pod.netns
        .run(|| sysctl::write_net(&["ipv4", "tcp_tw_reuse"], "1"))??;
    Ok(())
}

/// Runs `argv` in `host` and fails unless it exits 0; returns its stdout.
pub async fn run_ok(host: &impl LabHost, argv: &[&str]) -> Result<String> {
    let out = exec_in_async(host, argv).await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(BenchError::Command {
            what: format!("{} in {}", argv.join(" "), host.name()),
            status: out.status.to_string(),
            stderr: tail(&stderr, 400),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `max` bytes of `s` (on a char boundary), trimmed.
pub fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_follow_the_baseline_plan() {
        assert_eq!(pod_ip(1).unwrap(), Ipv4Addr::new(10, 244, 1, 10));
        assert_eq!(pod_subnet(2).unwrap(), Ipv4Addr::new(10, 244, 2, 0));
        assert!(pod_ip(256).is_err());
    }

    #[test]
    fn vpc_addresses_stay_in_the_vpc_cidr() {
        assert_eq!(vpc_pod_ip(1).unwrap(), Ipv4Addr::new(10, 250, 0, 11));
        assert_eq!(vpc_pod_ip(244).unwrap(), Ipv4Addr::new(10, 250, 0, 254));
        assert!(vpc_pod_ip(245).is_err());
        assert!(vpc_pod_ip(300).is_err());
    }

    #[test]
    fn tails_cut_on_char_boundaries() {
        assert_eq!(tail("  hello  ", 3), "llo");
        assert_eq!(tail("héllo", 4), "llo");
        assert_eq!(tail("ab", 10), "ab");
    }
}

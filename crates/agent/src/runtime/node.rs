//! Node setup: everything the datapath needs around it before the first pod
//! (docs/datapath.md, "What the agent sets up around it").
//!
//! The bring-up itself is [`cozyplane_datapath::node::bring_up`], shared with the
//! datapath benchmark and the overlay tests so they build exactly what the agent
//! builds; this module turns the agent's arguments into its [`NodeSpec`]. Every
//! step is idempotent, so a restarted agent runs the same sequence over what the
//! previous one left, without tearing anything down first.

use std::path::Path;

use cozyplane_datapath::netlink::IpPrefix;
use cozyplane_datapath::node::{NodeSpec, Uplink};

use super::args::AgentArgs;
use super::error::AgentError;
use crate::ipam::Pools;

/// Mounts a bpffs at `dir` unless it already is on one (the datapath crate
/// owns every kernel call).
pub fn ensure_bpffs(dir: &Path) -> Result<(), AgentError> {
    Ok(cozyplane_datapath::ensure_bpffs(dir)?)
}

/// What to bring up: the agent's arguments and pools, with the overlay and
/// uplink links pinned under `links_dir`.
pub fn node_spec(
    args: &AgentArgs,
    pools: &Pools,
    links_dir: &Path,
) -> Result<NodeSpec, AgentError> {
    let pod_cidrs = pools
        .iter()
        .map(|p| {
            let c = p.cidr();
            IpPrefix::new(c.addr(), c.len()).map_err(|e| AgentError::InvalidArg {
                arg: "--cluster-cidr",
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeSpec {
        uplink: match &args.uplink {
            Some(name) => Uplink::Named(name.clone()),
            None => Uplink::DefaultRoute,
        },
        overlay_device: args.overlay_device.clone(),
        mtu: args.mtu,
        masquerade: args.masquerade.into(),
        kernel_local: !args.kube_proxy_replacement,
        tunnel: args.tunnel_mode.into(),
        ..NodeSpec::new(pod_cidrs, links_dir)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use cozyplane_datapath::node::{Masquerade, Tunnel, MASQ_PORTS};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn spec(argv: &[&str]) -> NodeSpec {
        let mut full = vec!["agent", "--node-name", "n1"];
        full.extend_from_slice(argv);
        let args = Cli::parse_from(full).args;
        let pools = Pools::parse(&args.cluster_cidr, &[]).unwrap();
        node_spec(&args, &pools, Path::new("/pins/links")).unwrap()
    }

    #[test]
    fn defaults_are_the_production_node() {
        let s = spec(&[]);
        assert_eq!(s.uplink, Uplink::DefaultRoute);
        assert_eq!(s.overlay_device, "cozyplane0");
        assert_eq!(s.mtu, None);
        assert_eq!(s.pod_cidrs, vec!["10.244.0.0/16".parse().unwrap()]);
        assert_eq!(s.masquerade, Masquerade::Bpf);
        assert_eq!(s.masq_ports, MASQ_PORTS);
        assert_eq!(s.links_dir, Path::new("/pins/links"));
        assert!(!s.kernel_local, "kube-proxy replacement is on by default");
        assert_eq!(s.tunnel, Tunnel::Tc);
    }

    #[test]
    fn without_kube_proxy_replacement_local_delivery_goes_through_the_kernel() {
        assert!(spec(&["--kube-proxy-replacement=false"]).kernel_local);
        assert!(!spec(&["--kube-proxy-replacement", "true"]).kernel_local);
    }

    #[test]
    fn the_tunnel_mode_reaches_the_spec() {
        assert_eq!(spec(&["--tunnel-mode=device"]).tunnel, Tunnel::Device);
        assert_eq!(spec(&["--tunnel-mode", "tc"]).tunnel, Tunnel::Tc);
    }

    #[test]
    fn flags_reach_the_spec() {
        let s = spec(&[
            "--uplink",
            "eth1",
            "--overlay-device",
            "ovl0",
            "--mtu",
            "1400",
            "--masquerade",
            "off",
            "--cluster-cidr",
            "10.42.0.0/16,fd00:42::/56",
        ]);
        assert_eq!(s.uplink, Uplink::Named("eth1".into()));
        assert_eq!(s.overlay_device, "ovl0");
        assert_eq!(s.mtu, Some(1400));
        assert_eq!(s.masquerade, Masquerade::Off);
        assert_eq!(
            s.pod_cidrs,
            vec![
                "10.42.0.0/16".parse().unwrap(),
                "fd00:42::/56".parse().unwrap()
            ]
        );
    }
}

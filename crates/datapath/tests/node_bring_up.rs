//! `cozyplane_datapath::node::bring_up` on the real kernel, in a network
//! namespace: what it builds, that running it again (a restarted agent) keeps
//! the devices and links and diff-syncs the node maps, that turning
//! masquerade off detaches the uplink hooks (`from_uplink` only without the
//! per-packet Service LB), that an empty `cp_vteps` is seeded from
//! `cp_node_remotes`, and its refusals. Traffic through the
//! result is `bpf_overlay_netns.rs`'s. Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, EpKey, LpmKey, Remote, NET_DEFAULT, PARAM_F_TC_TUNNEL,
};
use cozyplane_datapath::netlink::{
    create_named_netns, delete_named_netns, named_netns_path, sysctl, IpPrefix, NetnsHandle, Route,
    VethSpec,
};
use cozyplane_datapath::node::{
    bring_up, Masquerade, NodeError, NodeSpec, Tunnel, Uplink, MASQ_PORTS,
};
use cozyplane_datapath::tables::LpmTable;
use cozyplane_datapath::Datapath;

/// A named namespace, deleted on drop (also on panic).
struct NsGuard(String);

impl NsGuard {
    fn new(tag: &str) -> NsGuard {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "cpn-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        create_named_netns(&name).unwrap_or_else(|e| panic!("create netns {name}: {e}"));
        NsGuard(name)
    }
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = delete_named_netns(&self.0);
    }
}

fn prefix(s: &str) -> IpPrefix {
    s.parse().unwrap()
}

fn key(s: &str) -> LpmKey {
    let p = prefix(s);
    lpm_key(NET_DEFAULT, p.addr(), p.len()).unwrap()
}

/// Every entry's (prefix length, data), sorted, for comparisons.
fn lpm_entries(table: &LpmTable<u32>) -> Vec<(u32, EpKey)> {
    let keys: Vec<LpmKey> = table
        .entries()
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    expect(&keys)
}

fn expect(keys: &[LpmKey]) -> Vec<(u32, EpKey)> {
    let mut v: Vec<(u32, EpKey)> = keys.iter().map(|k| (k.prefix_len(), k.data())).collect();
    v.sort();
    v
}

/// A node namespace whose uplink `u0` (the other end in `peer`) holds
/// `10.250.0.1/24`, with a default route through it when `default_route`.
async fn node(default_route: bool) -> (NsGuard, NsGuard, NetnsHandle) {
    let node = NsGuard::new("n");
    let peer = NsGuard::new("p");
    let host = NetnsHandle::open(named_netns_path(&node.0)).await.unwrap();
    let peer_ns = cozyplane_datapath::netlink::Netns::open(named_netns_path(&peer.0)).unwrap();
    let u0 = host
        .nl
        .create_veth(&VethSpec {
            name: "u0",
            peer_name: "u0",
            peer_netns: Some(&peer_ns),
            mtu: Some(1500),
            peer_mac: None,
            up: true,
        })
        .await
        .unwrap();
    host.nl
        .add_address(u0.index, prefix("10.250.0.1/24"))
        .await
        .unwrap();
    if default_route {
        let gw = IpAddr::V4(Ipv4Addr::new(10, 250, 0, 254));
        host.nl
            .add_route(&Route::via(prefix("0.0.0.0/0"), gw, u0.index))
            .await
            .unwrap();
    }
    (node, peer, host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bring_up_builds_the_node_and_a_rerun_converges_without_tearing_down() {
    if !needs!().root().ready() {
        return;
    }
    let (_node, _peer, host) = node(true).await;
    let pins = PinDir::new("node-bring-up");
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).unwrap();
    let own = Ipv4Addr::new(10, 250, 0, 1);
    let other = Ipv4Addr::new(10, 250, 0, 2);
    let spec = NodeSpec::new(
        vec![prefix("10.244.0.0/16"), prefix("10.99.0.0/16")],
        &links,
    );

    // What a previous agent synced into cp_node_remotes; cp_vteps is empty, as
    // after an upgrade from a release without it.
    let mut dp = Datapath::load(pins.path()).unwrap();
    for ip in [own, other] {
        dp.node_remotes
            .insert(&Addr128::from_v4(ip), &Remote::new(ip))
            .unwrap();
    }
    // another writer's entry (a VPC's network) must survive the diff-sync
    let vpc = lpm_key(5, "10.99.0.0".parse().unwrap(), 16).unwrap();
    dp.masq_srcs.insert(&vpc, &1).unwrap();

    let net = bring_up(&host, &spec, || &mut dp).await.unwrap();
    assert_eq!(net.uplink.name, "u0", "the default route's device");
    assert_eq!(net.node_ip, own);
    assert_eq!(net.addresses, vec![IpAddr::V4(own)]);
    assert_eq!(net.overlay.name, "cozyplane0");
    assert_eq!(net.overlay.mtu, 1450);
    assert_eq!(net.pod_mtu, 1450);

    // sysctls in the node's namespace
    let read = |k: &'static [&'static str]| {
        host.netns
            .run(move || sysctl::read_net(k))
            .unwrap()
            .unwrap()
    };
    assert_eq!(read(&["ipv4", "ip_forward"]), "1");
    assert_eq!(read(&["ipv4", "conf", "all", "rp_filter"]), "0");
    assert_eq!(read(&["ipv4", "conf", "default", "rp_filter"]), "0");
    assert_eq!(read(&["ipv4", "conf", "cozyplane0", "rp_filter"]), "0");
    // the IPv4 pod CIDRs are routed into the overlay via the on-link gateway
    let routes = host.nl.list_routes(false).await.unwrap();
    for cidr in ["10.244.0.0/16", "10.99.0.0/16"] {
        let r = routes
            .iter()
            .find(|r| r.dst == prefix(cidr))
            .unwrap_or_else(|| panic!("no route to {cidr}: {routes:?}"));
        assert_eq!(r.oif, Some(net.overlay.index));
        assert_eq!(r.gateway, Some("169.254.1.1".parse().unwrap()));
    }

    // maps
    let params = dp.params().unwrap();
    assert_eq!(params.vxlan_ifindex, net.overlay.index);
    assert_eq!(params.uplink_ifindex, net.uplink.index);
    assert_eq!(params.node_ip, own.octets());
    assert_eq!(params.masq_ip, own.octets());
    assert_eq!(
        (params.masq_port_min, params.masq_port_max),
        (*MASQ_PORTS.start(), *MASQ_PORTS.end())
    );
    assert_eq!(dp.vnis.get(&1).unwrap(), Some(0));
    let vteps: Vec<Ipv4Addr> = dp
        .vteps
        .entries()
        .unwrap()
        .iter()
        .map(|(k, _)| (*k).into())
        .collect();
    assert_eq!(
        vteps,
        vec![other],
        "seeded from cp_node_remotes, without itself"
    );
    let pods = [key("10.244.0.0/16"), key("10.99.0.0/16")];
    assert_eq!(lpm_entries(&dp.internal), expect(&pods));
    assert_eq!(lpm_entries(&dp.masq_srcs), expect(&[pods[0], pods[1], vpc]));
    // every program attached, links pinned
    for pin in ["overlay-in", "overlay-out", "uplink-in", "uplink-out"] {
        assert!(links.join(pin).exists(), "{pin} pinned");
    }
    drop(dp);

    // A restart with one CIDR less and masquerade off: same device, links kept
    // (updated in place), the dropped CIDR gone, the uplink hooks detached, and
    // a cp_vteps that is not empty is left to the sync.
    let mut dp = Datapath::load(pins.path()).unwrap();
    dp.vteps.remove(&vtep_key(other)).unwrap();
    let third = Ipv4Addr::new(10, 250, 0, 3);
    dp.vteps.insert(&vtep_key(third), &0x2).unwrap();
    let spec = NodeSpec {
        pod_cidrs: vec![prefix("10.244.0.0/16")],
        masquerade: Masquerade::Off,
        ..spec
    };
    let again = bring_up(&host, &spec, || &mut dp).await.unwrap();
    assert_eq!(again.overlay.index, net.overlay.index, "the device is kept");
    let params = dp.params().unwrap();
    assert_eq!(params.node_ip, own.octets());
    assert_eq!(params.masq_ip, [0; 4], "masquerade off");
    assert_eq!((params.masq_port_min, params.masq_port_max), (0, 0));
    assert_eq!(lpm_entries(&dp.internal), expect(&pods[..1]));
    assert_eq!(lpm_entries(&dp.masq_srcs), expect(&[pods[0], vpc]));
    assert_eq!(dp.vteps.entries().unwrap().len(), 1, "no reseeding");
    assert!(links.join("overlay-in").exists() && links.join("overlay-out").exists());
    assert!(
        !links.join("uplink-out").exists(),
        "masquerade SNAT detached"
    );
    assert!(
        links.join("uplink-in").exists(),
        "from_uplink stays for the per-packet Service LB (bpf/lb.h)"
    );
    let routes = host.nl.list_routes(false).await.unwrap();
    assert!(
        routes.iter().any(|r| r.dst == prefix("10.244.0.0/16")),
        "the route is kept"
    );

    // Without masquerade and with Services left to kube-proxy, from_uplink
    // stays for the tc tunnel's decapsulation (the default) ...
    let spec = NodeSpec {
        kernel_local: true,
        ..spec
    };
    bring_up(&host, &spec, || &mut dp).await.unwrap();
    assert!(!links.join("uplink-out").exists(), "uplink-out detached");
    assert!(links.join("uplink-in").exists(), "from_uplink decapsulates");
    assert_ne!(dp.params().unwrap().flags & PARAM_F_TC_TUNNEL, 0);
    // ... and with the VXLAN device tunnel there is no uplink hook at all.
    let spec = NodeSpec {
        tunnel: Tunnel::Device,
        ..spec
    };
    bring_up(&host, &spec, || &mut dp).await.unwrap();
    for pin in ["uplink-in", "uplink-out"] {
        assert!(!links.join(pin).exists(), "{pin} detached");
    }
    assert_eq!(dp.params().unwrap().flags & PARAM_F_TC_TUNNEL, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bring_up_refuses_a_node_it_cannot_serve() {
    if !needs!().root().ready() {
        return;
    }
    let (_node, _peer, host) = node(false).await;
    let pins = PinDir::new("node-refusals");
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).unwrap();
    let mut dp = Datapath::load(pins.path()).unwrap();
    let base = NodeSpec::new(vec![prefix("10.244.0.0/16")], &links);

    let err = bring_up(&host, &base, || &mut dp).await.unwrap_err();
    assert!(matches!(err, NodeError::NoDefaultRoute), "{err}");

    let lo = NodeSpec {
        uplink: Uplink::Named("lo".into()),
        ..base.clone()
    };
    let err = bring_up(&host, &lo, || &mut dp).await.unwrap_err();
    assert!(
        matches!(err, NodeError::UplinkWithoutIpv4(ref n) if n == "lo"),
        "{err}"
    );

    let v6_small = NodeSpec {
        uplink: Uplink::Named("u0".into()),
        mtu: Some(1200),
        pod_cidrs: vec![prefix("10.244.0.0/16"), prefix("fd00:10:244::/56")],
        ..base.clone()
    };
    let err = bring_up(&host, &v6_small, || &mut dp).await.unwrap_err();
    assert!(matches!(err, NodeError::MtuOutsideIpv6Range(1200)), "{err}");

    #[allow(clippy::reversed_empty_ranges)] // empty on purpose
    let no_ports = NodeSpec {
        uplink: Uplink::Named("u0".into()),
        masq_ports: 2000..=1000,
        ..base
    };
    let err = bring_up(&host, &no_ports, || &mut dp).await.unwrap_err();
    assert!(matches!(err, NodeError::MasqPorts(_)), "{err}");
    // none of the refusals created the overlay device
    assert!(host.nl.link_by_name("cozyplane0").await.unwrap().is_none());
}

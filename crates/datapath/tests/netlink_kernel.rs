//! Privileged tests of `cozyplane_datapath::netlink` against the real kernel.
//!
//! They need root plus `ip` (iproute2) and `ping` (iputils-ping). Under CI a missing
//! prerequisite fails the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate). Every test
//! works inside its own `cpt-…` namespaces (removed by Drop guards, also on failure),
//! so tests run in parallel and never touch the host's own links; `iproute2` is used as
//! an independent oracle for what the kernel holds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cozyplane_datapath::netlink::{
    configure_pair, create_named_netns, create_pair, delete_named_netns, discard_pair,
    host_veth_name, named_netns_path, plumb, sysctl, unplumb, Encapsulation, Error, IpPrefix,
    MacAddr, Netns, NetnsHandle, NlHandle, OverlaySpec, PlumbRequest, Route, VethSpec,
};
use cozyplane_testkit::{eventually_async, needs, tools};

// ---------------------------------------------------------------------------------------
// Harness

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A named namespace that is deleted when the guard drops (also on panic).
struct NsGuard {
    name: String,
}

impl NsGuard {
    fn new(tag: &str) -> NsGuard {
        let name = format!(
            "cpt-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        create_named_netns(&name).unwrap_or_else(|e| panic!("create netns {name}: {e}"));
        NsGuard { name }
    }

    fn path(&self) -> PathBuf {
        named_netns_path(&self.name)
    }

    fn open(&self) -> Netns {
        Netns::open(self.path()).unwrap()
    }

    async fn nl(&self) -> NlHandle {
        NlHandle::connect(&self.open()).await.unwrap()
    }

    async fn handle(&self) -> NetnsHandle {
        NetnsHandle::open(self.path()).await.unwrap()
    }

    /// `ip -n <ns> <args>`; panics with stderr on failure.
    fn ip(&self, args: &str) -> String {
        let full = format!("-n {} {args}", self.name);
        run("ip", &full)
    }

    /// `ip -n <ns> <args>` succeeded?
    fn ip_ok(&self, args: &str) -> bool {
        let full = format!("-n {} {args}", self.name);
        Command::new("ip")
            .args(full.split_whitespace())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// `ip netns exec <ns> <cmd>`; true on exit 0.
    fn exec_ok(&self, cmd: &str) -> bool {
        let full = format!("netns exec {} {cmd}", self.name);
        Command::new("ip")
            .args(full.split_whitespace())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn ping(&self, dst: &str) -> bool {
        (0..3).any(|_| self.exec_ok(&format!("ping -c 1 -W 2 {dst}")))
    }
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        if let Err(e) = delete_named_netns(&self.name) {
            eprintln!("cleanup: deleting netns {}: {e}", self.name);
        }
    }
}

fn run(bin: &str, args: &str) -> String {
    let out = Command::new(bin)
        .args(args.split_whitespace())
        .output()
        .unwrap_or_else(|e| panic!("{bin} {args}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Some line of `out` contains every one of `parts`.
fn line_with(out: &str, parts: &[&str]) -> bool {
    out.lines().any(|l| parts.iter().all(|p| l.contains(p)))
}

fn prefix(s: &str) -> IpPrefix {
    s.parse().unwrap()
}

/// A "node" namespace with an uplink to an "external" namespace and a default route
/// through it, as a real node has (proxy ARP for 169.254.1.1 needs a route to it).
struct Node {
    node: NsGuard,
    ext: NsGuard,
    node_ip: Ipv4Addr,
    node_ip6: Ipv6Addr,
}

async fn node(tag: &str, octet: u8) -> Node {
    let node = NsGuard::new(&format!("{tag}-n"));
    let ext = NsGuard::new(&format!("{tag}-x"));
    let nl = node.nl().await;
    let ext_ns = ext.open();
    let ul = nl
        .create_veth(&VethSpec {
            name: "ul0",
            peer_name: "ul0",
            peer_netns: Some(&ext_ns),
            mtu: Some(1500),
            peer_mac: None,
            up: false,
        })
        .await
        .unwrap();
    let node_ip = Ipv4Addr::new(192, 168, octet, 1);
    let node_ip6: Ipv6Addr = format!("fd00:{octet}::1").parse().unwrap();
    nl.add_address(ul.index, prefix(&format!("{node_ip}/24")))
        .await
        .unwrap();
    nl.add_address(ul.index, prefix(&format!("{node_ip6}/64")))
        .await
        .unwrap();
    nl.set_up(ul.index).await.unwrap();
    let gw = IpAddr::V4(Ipv4Addr::new(192, 168, octet, 2));
    nl.add_route(&Route::via(prefix("0.0.0.0/0"), gw, ul.index))
        .await
        .unwrap();
    let ext_nl = ext.nl().await;
    let ext_ul = ext_nl.require_link("ul0").await.unwrap();
    ext_nl
        .add_address(ext_ul.index, prefix(&format!("192.168.{octet}.2/24")))
        .await
        .unwrap();
    ext_nl.set_up(ext_ul.index).await.unwrap();
    node.open()
        .run(|| sysctl::set_ipv4_forwarding(true))
        .unwrap()
        .unwrap();
    Node {
        node,
        ext,
        node_ip,
        node_ip6,
    }
}

fn request<'a>(
    pod_netns: &'a std::path::Path,
    host_ifname: &'a str,
    v4: &str,
    v6: Option<&str>,
) -> PlumbRequest<'a> {
    PlumbRequest {
        pod_netns,
        ifname: "eth0",
        host_ifname,
        mtu: 1450,
        ipv4: Some(v4.parse().unwrap()),
        ipv6: v6.map(|s| s.parse().unwrap()),
        pod_mac: None,
        alias: "cozyplane:test-record",
        host_routes: None,
    }
}

// ---------------------------------------------------------------------------------------
// Namespaces

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_netns_is_usable_by_ip_netns_and_deletes_idempotently() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let ns = NsGuard::new("ns");
    // iproute2 sees it and can run inside it.
    assert!(run("ip", "netns list").contains(&ns.name));
    assert!(ns.exec_ok("ip link show lo"));
    // A second create with the same name is refused and leaves the first alone.
    let again = create_named_netns(&ns.name).unwrap_err();
    assert!(matches!(again, Error::NetnsExists(_)), "{again}");
    assert!(ns.exec_ok("true"));
    // A fresh namespace holds only lo, and a handle opened in it sees exactly that.
    let links = ns.nl().await.list_links().await.unwrap();
    let names: Vec<&str> = links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["lo"]);
    // Delete twice: both succeed, and the name is gone.
    delete_named_netns(&ns.name).unwrap();
    delete_named_netns(&ns.name).unwrap();
    assert!(!ns.path().exists());
    assert!(!run("ip", "netns list").contains(&ns.name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_enters_the_namespace_on_its_own_thread_only() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let ns = NsGuard::new("run");
    let target = ns.open();
    let want = target.inode().unwrap();
    let here = Netns::current().unwrap().inode().unwrap();
    assert_ne!(want, here);
    let inside = target
        .run(|| Netns::current().and_then(|n| n.inode()))
        .unwrap()
        .unwrap();
    assert_eq!(inside, want);
    let inside_async = target
        .run_async(|| Netns::current().and_then(|n| n.inode()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inside_async, want);
    // The caller (and the tokio worker) never moved.
    assert_eq!(Netns::current().unwrap().inode().unwrap(), here);
    // A panic inside is an error, not a crash of the caller.
    let err = target.run(|| -> () { panic!("boom") }).unwrap_err();
    assert!(matches!(err, Error::NetnsThreadPanicked(_)), "{err}");
    let err = target
        .run_async(|| -> () { panic!("boom") })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NetnsThreadPanicked(_)), "{err}");
    // Sysctls written inside land in that namespace only.
    target
        .run(|| sysctl::set_ipv4_forwarding(true))
        .unwrap()
        .unwrap();
    let v = run(
        "ip",
        &format!("netns exec {} cat /proc/sys/net/ipv4/ip_forward", ns.name),
    );
    assert_eq!(v.trim(), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_helpers_write_the_namespace_they_run_in() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    use cozyplane_datapath::netlink::sysctl::ConfTarget::{All, Default, Dev};
    let ns = NsGuard::new("sc");
    let target = ns.open();
    let own_before = sysctl::read_net(&["ipv4", "conf", "lo", "proxy_arp"]).unwrap();
    target
        .run(|| -> cozyplane_datapath::netlink::Result<()> {
            sysctl::set_ipv4_forwarding(true)?;
            sysctl::set_ipv6_forwarding(All, true)?;
            sysctl::set_rp_filter(All, 2)?;
            sysctl::set_rp_filter(Default, 0)?;
            sysctl::set_rp_filter(Dev("lo"), 1)?;
            sysctl::set_proxy_arp(Dev("lo"), true)?;
            sysctl::set_accept_ra(Default, 0)?;
            sysctl::set_disable_ipv6(Dev("lo"), true)?;
            // A device that does not exist is a clear error naming the key.
            let err = sysctl::set_proxy_arp(Dev("cpt-none"), true).unwrap_err();
            assert!(
                err.to_string().contains("net/ipv4/conf/cpt-none/proxy_arp"),
                "{err}"
            );
            Ok(())
        })
        .unwrap()
        .unwrap();
    let read = |key: &str| run("ip", &format!("netns exec {} sysctl -n {key}", ns.name));
    assert_eq!(read("net.ipv4.ip_forward").trim(), "1");
    assert_eq!(read("net.ipv6.conf.all.forwarding").trim(), "1");
    assert_eq!(read("net.ipv4.conf.all.rp_filter").trim(), "2");
    assert_eq!(read("net.ipv4.conf.default.rp_filter").trim(), "0");
    assert_eq!(read("net.ipv4.conf.lo.rp_filter").trim(), "1");
    assert_eq!(read("net.ipv4.conf.lo.proxy_arp").trim(), "1");
    assert_eq!(read("net.ipv6.conf.default.accept_ra").trim(), "0");
    assert_eq!(read("net.ipv6.conf.lo.disable_ipv6").trim(), "1");
    // The test process's own namespace was not touched.
    let own_after = sysctl::read_net(&["ipv4", "conf", "lo", "proxy_arp"]).unwrap();
    assert_eq!(own_after, own_before);
}

// ---------------------------------------------------------------------------------------
// Links, addresses, routes, neighbours

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn veth_into_another_namespace_carries_traffic_and_reports_fresh_attributes() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let a = NsGuard::new("va");
    let b = NsGuard::new("vb");
    let (nla, nlb) = (a.nl().await, b.nl().await);
    let bns = b.open();
    let va = nla
        .create_veth(&VethSpec {
            name: "va",
            peer_name: "vb",
            peer_netns: Some(&bns),
            mtu: Some(1400),
            peer_mac: Some("02:00:00:00:0b:01".parse().unwrap()),
            up: true,
        })
        .await
        .unwrap();
    assert_eq!(va.kind.as_deref(), Some("veth"));
    assert!(va.up, "created up as asked");
    assert_eq!(va.mtu, 1400);
    let vb = nlb.require_link("vb").await.unwrap();
    assert_eq!(vb.mtu, 1400);
    assert_eq!(vb.mac, Some("02:00:00:00:0b:01".parse().unwrap()));
    assert_eq!(va.link, Some(vb.index), "IFLA_LINK names the peer");
    assert!(b.ip("link show vb").contains("mtu 1400"));
    // The peer is not in a's namespace.
    assert!(nla.link_by_name("vb").await.unwrap().is_none());

    // set_mac returns what the kernel now holds.
    let mac: MacAddr = "02:00:00:00:0a:01".parse().unwrap();
    let after = nla.set_mac(va.index, mac).await.unwrap();
    assert_eq!(after.mac, Some(mac));
    assert!(a.ip("link show va").contains("02:00:00:00:0a:01"));

    // Alias is listed with the link.
    nla.set_alias(va.index, "cozyplane:rec").await.unwrap();
    let listed = nla.list_links().await.unwrap();
    let rec = listed.iter().find(|l| l.name == "va").unwrap();
    assert_eq!(rec.alias.as_deref(), Some("cozyplane:rec"));
    assert!(a.ip("link show va").contains("alias cozyplane:rec"));
    let too_long = "x".repeat(256);
    assert!(matches!(
        nla.set_alias(va.index, &too_long).await,
        Err(Error::InvalidInput { .. })
    ));

    // Addresses keep their exact prefix length (lesson 16).
    nla.add_address(va.index, prefix("10.77.0.1/24"))
        .await
        .unwrap();
    nla.add_address(va.index, prefix("fd77::1/64"))
        .await
        .unwrap();
    nlb.add_address(vb.index, prefix("10.77.0.2/24"))
        .await
        .unwrap();
    nlb.add_address(vb.index, prefix("fd77::2/64"))
        .await
        .unwrap();
    let mut addrs = nla.list_addresses(va.index).await.unwrap();
    addrs.retain(|p| !matches!(p.addr(), IpAddr::V6(v6) if v6.segments()[0] == 0xfe80));
    addrs.sort_by_key(|p| p.to_string());
    assert_eq!(addrs, [prefix("10.77.0.1/24"), prefix("fd77::1/64")]);
    assert!(a.ip("-6 addr show dev va").contains("fd77::1/64"));
    let dup = nla
        .add_address(va.index, prefix("10.77.0.1/24"))
        .await
        .unwrap_err();
    assert!(dup.is_exists(), "{dup}");

    nla.set_up(va.index).await.unwrap();
    nlb.set_up(vb.index).await.unwrap();
    assert!(a.ping("10.77.0.2"));
    assert!(a.ping("fd77::2"));

    // Down stops traffic; lookups by index agree with lookups by name.
    nlb.set_down(vb.index).await.unwrap();
    assert!(!nlb.link_by_index(vb.index).await.unwrap().unwrap().up);
    assert!(!a.exec_ok("ping -c 1 -W 1 10.77.0.2"));

    // Address delete is idempotent.
    assert!(nla
        .del_address(va.index, prefix("10.77.0.1/24"))
        .await
        .unwrap());
    assert!(!nla
        .del_address(va.index, prefix("10.77.0.1/24"))
        .await
        .unwrap());

    // Deleting one end removes both; deleting again is fine.
    assert!(nla.delete_link(va.index).await.unwrap());
    assert!(!nla.delete_link(va.index).await.unwrap());
    assert!(!nla.delete_link_by_name("va").await.unwrap());
    assert!(nlb.link_by_name("vb").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_permanent_neighbours_round_trip() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let a = NsGuard::new("rt");
    let nl = a.nl().await;
    let v = nl
        .create_veth(&VethSpec {
            name: "r0",
            peer_name: "r1",
            peer_netns: None,
            mtu: None,
            peer_mac: None,
            up: false,
        })
        .await
        .unwrap();
    let peer = nl.require_link("r1").await.unwrap();
    nl.set_up(v.index).await.unwrap();
    nl.set_up(peer.index).await.unwrap();
    nl.add_address(v.index, prefix("10.88.0.1/24"))
        .await
        .unwrap();

    let r = Route::via(
        prefix("10.99.0.0/16"),
        "10.88.0.254".parse().unwrap(),
        v.index,
    );
    nl.add_route(&r).await.unwrap();
    let listed = nl.list_routes(false).await.unwrap();
    assert!(listed.contains(&r), "{listed:?}");
    assert!(a
        .ip("route show 10.99.0.0/16")
        .contains("via 10.88.0.254 dev r0"));
    let again = nl.add_route(&r).await.unwrap_err();
    assert!(again.is_exists(), "{again}");
    assert!(nl.del_route(&r).await.unwrap());
    assert!(!nl.del_route(&r).await.unwrap());
    assert!(a.ip("route show 10.99.0.0/16").trim().is_empty());

    // On-link gateway outside any subnet: /32 scope link first, then via it.
    let gw = IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1));
    nl.add_route(&Route::on_link(IpPrefix::host(gw), peer.index))
        .await
        .unwrap();
    nl.add_route(&Route::via(prefix("10.100.0.0/16"), gw, peer.index))
        .await
        .unwrap();
    let shown = a.ip("route show");
    assert!(
        line_with(&shown, &["169.254.1.1 dev r1", "scope link"]),
        "{shown}"
    );
    assert!(
        shown.contains("10.100.0.0/16 via 169.254.1.1 dev r1"),
        "{shown}"
    );
    // RTNH_F_ONLINK works without the /32.
    let mut onlink = Route::via(
        prefix("10.101.0.0/16"),
        "169.254.9.9".parse().unwrap(),
        peer.index,
    );
    onlink.onlink = true;
    nl.add_route(&onlink).await.unwrap();
    assert!(a.ip("route show 10.101.0.0/16").contains("onlink"));
    // A host-bits destination is refused before reaching the kernel.
    let bad = nl
        .add_route(&Route::on_link(prefix("10.102.0.9/16"), peer.index))
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::InvalidInput { .. }), "{bad}");
    // IPv6 route listing keeps /128.
    nl.add_route(&Route::on_link(prefix("fd99::5/128"), v.index))
        .await
        .unwrap();
    let v6 = nl.list_routes(true).await.unwrap();
    assert!(v6
        .iter()
        .any(|r| r.dst == prefix("fd99::5/128") && r.oif == Some(v.index)));

    // Permanent neighbours: added (replace keeps it idempotent), shown, deleted twice.
    let mac: MacAddr = "02:11:22:33:44:55".parse().unwrap();
    let ip: IpAddr = "10.88.0.9".parse().unwrap();
    nl.add_permanent_neighbour(v.index, ip, mac).await.unwrap();
    nl.add_permanent_neighbour(v.index, ip, mac).await.unwrap();
    let neigh = a.ip("neigh show dev r0");
    assert!(
        neigh.contains("10.88.0.9 lladdr 02:11:22:33:44:55 PERMANENT"),
        "{neigh}"
    );
    assert!(nl.del_neighbour(v.index, ip).await.unwrap());
    assert!(!nl.del_neighbour(v.index, ip).await.unwrap());
    assert!(!a.ip("neigh show dev r0").contains("10.88.0.9"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vxlan_overlay_is_external_with_the_shared_mac_and_is_kept_on_reensure() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let ns = NsGuard::new("vx");
    let nl = ns.nl().await;
    let spec = OverlaySpec {
        name: "cozyplane0".into(),
        encap: Encapsulation::VXLAN_DEFAULT,
        mtu: 1450,
        mac: MacAddr::OVERLAY,
    };
    let dev = nl.ensure_overlay(&spec).await.unwrap();
    assert_eq!(dev.mac, Some(MacAddr::OVERLAY));
    assert_eq!(dev.mtu, 1450);
    assert!(dev.up);
    assert_eq!(dev.kind.as_deref(), Some("vxlan"));
    let shown = ns.ip("-d link show cozyplane0");
    for want in [
        "vxlan external",
        "dstport 4789",
        "nolearning",
        "02:cf:cf:cf:cf:cf",
        "mtu 1450",
    ] {
        assert!(shown.contains(want), "{want:?} not in {shown}");
    }
    // Re-ensuring keeps the same device and reconciles drifted MAC / MTU / state.
    nl.set_down(dev.index).await.unwrap();
    nl.set_mtu(dev.index, 1400).await.unwrap();
    nl.set_mac(dev.index, "02:00:00:00:00:01".parse().unwrap())
        .await
        .unwrap();
    let again = nl.ensure_overlay(&spec).await.unwrap();
    assert_eq!(again.index, dev.index);
    assert_eq!(again.mac, Some(MacAddr::OVERLAY));
    assert_eq!(again.mtu, 1450);
    assert!(again.up);
    // A different port is a mismatch, and the device is left untouched.
    let other_port = OverlaySpec {
        encap: Encapsulation::Vxlan { port: 8472 },
        ..spec.clone()
    };
    let err = nl.ensure_overlay(&other_port).await.unwrap_err();
    assert!(matches!(err, Error::LinkMismatch { .. }), "{err}");
    assert!(ns.ip("-d link show cozyplane0").contains("dstport 4789"));
    // So is a device of another kind with the name.
    nl.create_bridge("cpbr0", None).await.unwrap();
    let as_bridge = OverlaySpec {
        name: "cpbr0".into(),
        ..spec.clone()
    };
    let err = nl.ensure_overlay(&as_bridge).await.unwrap_err();
    assert!(matches!(err, Error::LinkMismatch { .. }), "{err}");
    assert!(ns.ip("-d link show cpbr0").contains("bridge"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_underlay_joins_lab_nodes() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let ul = NsGuard::new("br");
    let ul_nl = ul.nl().await;
    let ul_ns = ul.open();
    let br = ul_nl.create_bridge("br0", Some(1500)).await.unwrap();
    assert_eq!(br.kind.as_deref(), Some("bridge"));
    let mut nodes = Vec::new();
    for i in 1..=2u8 {
        let n = NsGuard::new(&format!("brn{i}"));
        let nl = n.nl().await;
        let port = format!("n{i}");
        let eth = nl
            .create_veth(&VethSpec {
                name: "eth0",
                peer_name: &port,
                peer_netns: Some(&ul_ns),
                mtu: Some(1500),
                peer_mac: None,
                up: true,
            })
            .await
            .unwrap();
        nl.add_address(eth.index, prefix(&format!("172.31.0.{i}/24")))
            .await
            .unwrap();
        let p = ul_nl.require_link(&port).await.unwrap();
        ul_nl.set_master(p.index, br.index).await.unwrap();
        ul_nl.set_up(p.index).await.unwrap();
        assert_eq!(
            ul_nl.require_link(&port).await.unwrap().master,
            Some(br.index)
        );
        nodes.push(n);
    }
    assert!(nodes[0].ping("172.31.0.2"));
    assert!(nodes[1].ping("172.31.0.1"));
}

// ---------------------------------------------------------------------------------------
// Plumbing a pod

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumbed_pod_reaches_its_node_and_back_then_unplumbs_twice() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("pl", 61).await;
    let pod = NsGuard::new("pl-pod");
    let host = n.node.handle().await;
    let pod_path = pod.path();
    let name = host_veth_name("container-pl-1", "eth0");
    let req = request(&pod_path, &name, "10.244.61.5", Some("fd00:244::5"));
    let got = plumb(&host, &req).await.unwrap();

    // What plumb reports is what the kernel holds.
    let host_link = host.nl.require_link(&name).await.unwrap();
    assert_eq!(host_link.index, got.host_ifindex);
    assert_eq!(host_link.mac, Some(got.host_mac));
    assert_eq!(host_link.alias.as_deref(), Some("cozyplane:test-record"));
    assert!(host_link.up);
    let eth0 = pod.ip("link show eth0");
    assert!(eth0.contains(&got.pod_mac.to_string()), "{eth0}");
    assert!(
        eth0.contains(&format!("{}: eth0@", got.pod_ifindex)),
        "{eth0}"
    );
    assert!(eth0.contains("mtu 1450"), "{eth0}");

    // Pod side: exact prefixes, lo up, on-link gateway routes.
    let addrs = pod.ip("addr show dev eth0");
    assert!(addrs.contains("inet 10.244.61.5/32"), "{addrs}");
    assert!(addrs.contains("inet6 fd00:244::5/128"), "{addrs}");
    assert!(pod.ip("link show lo").contains("UP"));
    let routes = pod.ip("route show");
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0"),
        "{routes}"
    );
    assert!(
        line_with(&routes, &["169.254.1.1 dev eth0", "scope link"]),
        "{routes}"
    );
    assert!(pod
        .ip("-6 route show")
        .contains("default via fe80::1 dev eth0"));

    // Host side: sysctls, gateway address, host routes.
    let dev = name.clone();
    let conf = n
        .node
        .open()
        .run(move || {
            let r = |k: &str| sysctl::read_net(&["ipv4", "conf", &dev, k]).unwrap();
            let n6 = |k: &str| sysctl::read_net(&["ipv6", "conf", &dev, k]).unwrap();
            let delay = sysctl::read_net(&["ipv4", "neigh", &dev, "proxy_delay"]).unwrap();
            (
                r("proxy_arp"),
                r("rp_filter"),
                r("forwarding"),
                n6("forwarding"),
                delay,
            )
        })
        .unwrap();
    assert_eq!(
        conf,
        ("1".into(), "0".into(), "1".into(), "1".into(), "0".into())
    );
    assert!(n
        .node
        .ip(&format!("-6 addr show dev {name}"))
        .contains("fe80::1/64"));
    let host_routes = n.node.ip("route show");
    assert!(
        line_with(
            &host_routes,
            &[&format!("10.244.61.5 dev {name}"), "scope link"]
        ),
        "{host_routes}"
    );
    assert!(n
        .node
        .ip("-6 route show")
        .contains(&format!("fd00:244::5 dev {name}")));

    // Real traffic, both ways, both families.
    assert!(pod.ping(&n.node_ip.to_string()), "pod -> node v4");
    assert!(n.node.ping("10.244.61.5"), "node -> pod v4");
    assert!(pod.ping(&n.node_ip6.to_string()), "pod -> node v6");
    assert!(n.node.ping("fd00:244::5"), "node -> pod v6");
    // Beyond the node: the external host answers the pod once it knows the way back.
    n.ext.ip("route add 10.244.61.0/24 via 192.168.61.1");
    assert!(
        pod.ping("192.168.61.2"),
        "pod -> external via node forwarding"
    );

    // TCP from inside the pod to a listener in the node, through the run-in-netns helper.
    let listener = n
        .node
        .open()
        .run(|| TcpListener::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong").unwrap();
        (buf, peer.ip())
    });
    let target = SocketAddr::new(IpAddr::V4(n.node_ip), port);
    let reply = pod
        .open()
        .run(move || -> std::io::Result<[u8; 4]> {
            let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
            s.write_all(b"ping")?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf)?;
            Ok(buf)
        })
        .unwrap()
        .unwrap();
    let (got_req, peer) = server.join().unwrap();
    assert_eq!(&reply, b"pong");
    assert_eq!(&got_req, b"ping");
    assert_eq!(
        peer,
        IpAddr::V4("10.244.61.5".parse().unwrap()),
        "no NAT on the way"
    );

    // Unplumb twice: the pair, the host routes and the pod side are gone.
    assert!(unplumb(&host.nl, &name).await.unwrap());
    assert!(!unplumb(&host.nl, &name).await.unwrap());
    assert!(!n.node.ip_ok(&format!("link show {name}")));
    assert!(!pod.ip_ok("link show eth0"));
    assert!(!n.node.ip("route show").contains("10.244.61.5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumb_sets_a_requested_pod_mac_and_supports_single_stack() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("mac", 62).await;
    let pod = NsGuard::new("mac-pod");
    let host = n.node.handle().await;
    let pod_path = pod.path();
    let name = host_veth_name("container-mac", "eth0");
    let mac: MacAddr = "02:cf:00:00:00:07".parse().unwrap();
    let req = PlumbRequest {
        pod_mac: Some(mac),
        ..request(&pod_path, &name, "10.244.62.7", None)
    };
    let got = plumb(&host, &req).await.unwrap();
    assert_eq!(got.pod_mac, mac);
    assert!(pod.ip("link show eth0").contains("02:cf:00:00:00:07"));
    assert!(
        !pod.ip("-6 route show").contains("default"),
        "no v6 default without v6"
    );
    assert!(pod.ping(&n.node_ip.to_string()));
    assert!(unplumb(&host.nl, &name).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_made_before_its_addresses_carries_nothing_until_configured() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("pr", 68).await;
    let pod = NsGuard::new("pr-pod");
    let host = n.node.handle().await;
    let pod_path = pod.path();
    let name = host_veth_name("container-pr", "eth0");
    let mac: MacAddr = "0a:58:0a:f4:44:07".parse().unwrap();
    let req = PlumbRequest {
        pod_mac: Some(mac),
        ..request(&pod_path, &name, "10.244.68.7", Some("fd00:68::7"))
    };

    // The first half: both ends, no record, no address, no route, the peer down.
    let pair = create_pair(&host, &req.pair()).await.unwrap();
    let host_link = host.nl.require_link(&name).await.unwrap();
    assert_eq!(host_link.index, pair.host_ifindex());
    assert_eq!(host_link.alias, None, "no record before the addresses");
    let eth0 = pod.ip("link show eth0");
    assert!(eth0.contains("state DOWN"), "{eth0}");
    assert!(!pod.ip("addr show dev eth0").contains("inet"));
    assert!(pod.ip("link show lo").contains("UP"));
    assert!(!n.node.ip("route show").contains("10.244.68.7"));

    // The second half finishes it as `plumb` would.
    let got = configure_pair(pair, &req).await.unwrap();
    assert_eq!(got.host_ifindex, host_link.index);
    assert_eq!(got.pod_mac, mac);
    assert!(pod.ip("link show eth0").contains("0a:58:0a:f4:44:07"));
    let host_link = host.nl.require_link(&name).await.unwrap();
    assert_eq!(host_link.alias.as_deref(), Some("cozyplane:test-record"));
    assert!(n.node.ping("10.244.68.7"));
    assert!(n.node.ping("fd00:68::7"));
    assert!(pod.ping(&n.node_ip.to_string()));
    assert!(unplumb(&host.nl, &name).await.unwrap());

    // A pair that will not be configured is discarded whole.
    let pair = create_pair(&host, &req.pair()).await.unwrap();
    assert!(discard_pair(pair).await.unwrap());
    assert_nothing_left(&n, &pod, &name);

    // A second half that does not describe the pair deletes it and says why.
    let pair = create_pair(&host, &req.pair()).await.unwrap();
    let other = PlumbRequest {
        mtu: 1400,
        ..req.clone()
    };
    let err = configure_pair(pair, &other).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert_nothing_left(&n, &pod, &name);

    // A second half that fails in the kernel rolls the pair back too.
    n.node.ip("route add blackhole 10.244.68.7/32");
    let pair = create_pair(&host, &req.pair()).await.unwrap();
    let err = configure_pair(pair, &req).await.unwrap_err();
    assert!(err.is_exists(), "{err}");
    assert_nothing_left(&n, &pod, &name);
    assert!(n.node.ip("route show").contains("blackhole 10.244.68.7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumb_finishes_even_if_the_caller_stops_waiting() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("cx", 67).await;
    let pod = NsGuard::new("cx-pod");
    let host = n.node.handle().await;
    let pod_path = pod.path();
    let name = host_veth_name("container-cx", "eth0");
    // The caller gives up immediately (a cancelled request): its future is dropped.
    let req = request(&pod_path, &name, "10.244.67.7", Some("fd00:67::7"));
    let gave_up = tokio::time::timeout(Duration::from_nanos(1), plumb(&host, &req)).await;
    assert!(gave_up.is_err(), "plumb cannot have finished in 1ns");
    // The work still completes: the last step of each half (the host's v6 route to the
    // pod, the pod's v6 default route) appears, and the pod works.
    eventually_async(
        "the abandoned plumb to finish (v6 routes on both sides)",
        Duration::from_secs(10),
        || {
            let done = n.node.ip("-6 route show").contains("fd00:67::7")
                && pod.ip_ok("-6 route show default")
                && pod.ip("-6 route show default").contains("fe80::1");
            async move { done }
        },
    )
    .await;
    assert!(n.node.ip("route show").contains("10.244.67.7"));
    assert!(pod.ip("addr show dev eth0").contains("10.244.67.7/32"));
    assert!(n.node.ping("10.244.67.7"));
    assert!(unplumb(&host.nl, &name).await.unwrap());
}

/// No link of the plumb may remain: neither the host end nor `eth0` in the pod.
fn assert_nothing_left(n: &Node, pod: &NsGuard, name: &str) {
    assert!(
        !n.node.ip_ok(&format!("link show {name}")),
        "host end {name} leaked"
    );
    let pod_links = pod.ip("-o link show");
    assert_eq!(
        pod_links.lines().count(),
        1,
        "pod has more than lo: {pod_links}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumb_rolls_back_when_the_host_route_conflicts() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("rbh", 63).await;
    let pod = NsGuard::new("rbh-pod");
    let host = n.node.handle().await;
    // A stale route for the address (e.g. a leaked pod) makes the last step fail.
    n.node.ip("route add blackhole 10.244.63.7/32");
    let pod_path = pod.path();
    let name = host_veth_name("container-rbh", "eth0");
    let err = plumb(&host, &request(&pod_path, &name, "10.244.63.7", None))
        .await
        .unwrap_err();
    assert!(err.is_exists(), "{err}");
    assert_nothing_left(&n, &pod, &name);
    // The conflicting route was not touched.
    assert!(n.node.ip("route show").contains("blackhole 10.244.63.7"));
    // With the conflict gone the same request succeeds.
    n.node.ip("route del blackhole 10.244.63.7/32");
    plumb(&host, &request(&pod_path, &name, "10.244.63.7", None))
        .await
        .unwrap();
    assert!(n.node.ping("10.244.63.7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumb_rolls_back_when_the_pod_side_fails() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("rbp", 64).await;
    let pod = NsGuard::new("rbp-pod");
    let host = n.node.handle().await;
    // Something already owns the pod's default route: the pod-side step fails mid-way,
    // after the pair, alias, sysctls and addresses were made.
    pod.ip("route add blackhole default");
    let pod_path = pod.path();
    let name = host_veth_name("container-rbp", "eth0");
    let err = plumb(&host, &request(&pod_path, &name, "10.244.64.7", None))
        .await
        .unwrap_err();
    assert!(err.is_exists(), "{err}");
    assert_nothing_left(&n, &pod, &name);
    assert!(!n.node.ip("route show").contains("10.244.64.7"));
    assert!(pod.ip("route show").contains("blackhole default"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plumb_refuses_taken_names_and_leaves_their_owners_alone() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("nm", 65).await;
    let pod = NsGuard::new("nm-pod");
    let host = n.node.handle().await;
    let pod_path = pod.path();
    let name = host_veth_name("container-nm", "eth0");

    // Host-side name taken.
    n.node
        .ip(&format!("link add {name} type veth peer name other0"));
    let err = plumb(&host, &request(&pod_path, &name, "10.244.65.7", None))
        .await
        .unwrap_err();
    assert!(err.is_exists(), "{err}");
    assert!(
        n.node.ip_ok(&format!("link show {name}")),
        "owner of the name was deleted"
    );
    assert!(n.node.ip_ok("link show other0"));
    assert_eq!(pod.ip("-o link show").lines().count(), 1);
    n.node.ip(&format!("link del {name}"));

    // Pod-side name taken.
    pod.ip("link add eth0 type veth peer name eth9");
    let err = plumb(&host, &request(&pod_path, &name, "10.244.65.7", None))
        .await
        .unwrap_err();
    assert!(err.is_exists(), "{err}");
    assert!(!n.node.ip_ok(&format!("link show {name}")));
    assert!(pod.ip_ok("link show eth0") && pod.ip_ok("link show eth9"));

    // Bad input is refused before anything is made.
    let bad = PlumbRequest {
        mtu: 40,
        ..request(&pod_path, &name, "10.244.65.7", None)
    };
    let err = plumb(&host, &bad).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let missing = PathBuf::from("/run/netns/cpt-missing-pod-netns");
    let err = plumb(&host, &request(&missing, &name, "10.244.65.7", None))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Netns { .. }), "{err}");
    assert!(!n.node.ip_ok(&format!("link show {name}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplumb_succeeds_after_the_pod_netns_is_gone_and_spares_non_veths() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let n = node("gone", 66).await;
    let host = n.node.handle().await;
    let name = host_veth_name("container-gone", "eth0");
    {
        let pod = NsGuard::new("gone-pod");
        let pod_path = pod.path();
        plumb(&host, &request(&pod_path, &name, "10.244.66.7", None))
            .await
            .unwrap();
        // The guard drops here: the runtime deletes the netns before DEL.
    }
    // The kernel destroys a namespace (and with it the veth pair) asynchronously: DEL
    // may find the host end still there or already gone; both are success.
    unplumb(&host.nl, &name).await.unwrap();
    eventually_async(
        "the host end to go with its pod",
        Duration::from_secs(10),
        || {
            let gone = !n.node.ip_ok(&format!("link show {name}"));
            async move { gone }
        },
    )
    .await;
    assert!(!unplumb(&host.nl, &name).await.unwrap());
    assert!(!n.node.ip("route show").contains("10.244.66.7"));

    // A non-veth that happens to carry the name is refused, not deleted.
    let imposter = host_veth_name("container-imposter", "eth0");
    host.nl.create_bridge(&imposter, None).await.unwrap();
    let err = unplumb(&host.nl, &imposter).await.unwrap_err();
    assert!(matches!(err, Error::LinkMismatch { .. }), "{err}");
    assert!(n.node.ip_ok(&format!("link show {imposter}")));
}

/// A link group deletes as one request exactly the links marked into it
/// (with their alias set in the same request), and an empty group is no
/// error; group 0, every link's own, is refused before the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_group_deletes_exactly_its_members() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    const GROUP: u32 = 0x6370_0042;
    let a = NsGuard::new("grp");
    let nl = a.nl().await;
    let mut index = Vec::new();
    for i in 0..3 {
        let v = nl
            .create_veth(&VethSpec {
                name: &format!("g{i}"),
                peer_name: &format!("g{i}p"),
                peer_netns: None,
                mtu: None,
                peer_mac: None,
                up: false,
            })
            .await
            .unwrap();
        index.push(v.index);
    }
    for i in &index[..2] {
        nl.set_alias_and_group(*i, "doomed", GROUP).await.unwrap();
    }
    assert!(a.ip("-d link show g0").contains("group 1668284482"));
    assert_eq!(
        nl.link_by_index(index[0])
            .await
            .unwrap()
            .unwrap()
            .alias
            .as_deref(),
        Some("doomed")
    );
    assert!(nl.delete_group(GROUP).await.unwrap());
    for (i, gone) in [(0, true), (1, true), (2, false)] {
        assert_eq!(
            nl.link_by_index(index[i]).await.unwrap().is_none(),
            gone,
            "g{i}"
        );
        assert_eq!(a.ip_ok(&format!("link show g{i}p")), !gone, "g{i}'s peer");
    }
    assert!(!nl.delete_group(GROUP).await.unwrap(), "an empty group");
    let err = nl.delete_group(0).await.unwrap_err();
    assert!(err.to_string().contains("every link"), "{err}");
    assert!(a.ip_ok("link show g2"), "group 0 deleted nothing");
}

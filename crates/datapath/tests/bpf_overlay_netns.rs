//! The datapath on the real kernel, end to end: two "nodes" (network
//! namespaces on an underlay veth) each with a VXLAN external device, three
//! pods, and the production object attached with tcx. Proves what
//! BPF_PROG_TEST_RUN cannot: the tunnel key really encapsulates, the
//! receiver decapsulates and delivers, to_overlay carries node-originated
//! traffic, the same-node redirect reaches the pod, and local deliveries go
//! bpf_redirect_peer into the pod, past the host veth. Also on the real
//! kernel: a pod's UDP to an outside host's overlay port is dropped before
//! the masquerade, and an IPv6 pod's neighbour discovery passes the
//! link-scope filter while other link-scope traffic to its host does not.
//! An IPv6 NodePort answers an external host from a local pod that sees the
//! host's own address (the per-packet load balancer, bpf/lb.h).
//! And VPC tenancy: twin VPCs (the same addresses) across the two nodes
//! reach their own pods only, never a node or the twin, and a quarantined
//! pod is cut off.
//!
//! Each node is brought up by the function the agent calls,
//! [`cozyplane_datapath::node::bring_up`] (sysctls, overlay device, gateway
//! neighbour, pod-CIDR route, node maps, overlay and uplink programs). The
//! underlay and the pods are plumbed with `ip` (iproute2) here on purpose, and
//! the per-pod and topology map entries the agent's CNI path and sync would
//! write are written by hand. Needs root and iproute2.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Port, Remote, VTEP_F_NODE, VXLAN_PORT,
};
use cozyplane_datapath::netlink::{named_netns_path, NetnsHandle};
use cozyplane_datapath::node::{bring_up, Masquerade, NodeNet, NodeSpec, Tunnel, Uplink};
use cozyplane_datapath::{Datapath, Direction, Iface, Program};
use cozyplane_testkit::eventually;

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (is iproute2 installed?)"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn in_ns(ns: &str, args: &[&str]) -> String {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v)
}

/// Move the calling thread into network namespace `ns`.
fn enter(ns: &str) {
    let f = File::open(format!("/var/run/netns/{ns}")).expect("netns handle");
    // SAFETY: `f` is an open netns file; setns only changes this thread's namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// Run `f` on a fresh thread inside `ns`.
fn on<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        f()
    })
    .join()
    .expect("thread")
}

/// Deletes the namespaces on drop.
struct Topology {
    names: Vec<String>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

struct Pod {
    ns: String,
    ip: Ipv4Addr,
    host_if: String,
    mac: [u8; 6],
    host_ifindex: u32,
}

fn mac_of(ns: &str, dev: &str) -> [u8; 6] {
    let out = in_ns(ns, &["cat", &format!("/sys/class/net/{dev}/address")]);
    let mut mac = [0u8; 6];
    for (i, part) in out.trim().split(':').enumerate() {
        mac[i] = u8::from_str_radix(part, 16).expect("hex");
    }
    mac
}

fn ifindex_of(ns: &str, dev: &str) -> u32 {
    in_ns(ns, &["cat", &format!("/sys/class/net/{dev}/ifindex")])
        .trim()
        .parse()
        .expect("ifindex")
}

fn add_pod(node: &str, pod_ns: &str, host_if: &str, ip: Ipv4Addr) -> Pod {
    sh(&["ip", "netns", "add", pod_ns]);
    in_ns(
        node,
        &[
            "ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", pod_ns,
        ],
    );
    in_ns(node, &["ip", "link", "set", host_if, "up"]);
    in_ns(
        node,
        &["ip", "route", "add", &format!("{ip}/32"), "dev", host_if],
    );
    let gw_mac = mac_of(node, host_if);
    let gw_mac = gw_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    in_ns(pod_ns, &["ip", "link", "set", "lo", "up"]);
    in_ns(pod_ns, &["ip", "link", "set", "eth0", "mtu", "1450", "up"]);
    in_ns(
        pod_ns,
        &["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"],
    );
    in_ns(
        pod_ns,
        &[
            "ip",
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ],
    );
    in_ns(
        pod_ns,
        &[
            "ip",
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ],
    );
    // stands in for proxy_arp on the host veth (the netlink half's job)
    in_ns(
        pod_ns,
        &[
            "ip",
            "neigh",
            "add",
            "169.254.1.1",
            "lladdr",
            &gw_mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    );
    Pod {
        ns: pod_ns.to_string(),
        ip,
        host_if: host_if.to_string(),
        mac: mac_of(pod_ns, "eth0"),
        host_ifindex: ifindex_of(node, host_if),
    }
}

/// The node's underlay: `lo` and `u0` up, its address on `u0`. The rest of
/// the node is [`bring_up_node`]'s.
/// Two lab nodes `n("n1")` and `n("n2")` joined by a veth underlay
/// (10.250.0.1/24, 10.250.0.2/24), each set up by `add_node`; the returned
/// guard removes them and the namespaces named `n(pod)` for `pods`.
fn two_nodes(n: &dyn Fn(&str) -> String, pods: &[&str]) -> Topology {
    let (n1, n2) = (n("n1"), n("n2"));
    let topo = Topology {
        names: ["n1", "n2"].iter().chain(pods).map(|s| n(s)).collect(),
    };
    sh(&["ip", "netns", "add", &n1]);
    sh(&["ip", "netns", "add", &n2]);
    in_ns(
        &n1,
        &[
            "ip", "link", "add", "u0", "type", "veth", "peer", "name", "u0", "netns", &n2,
        ],
    );
    add_node(&n1, "10.250.0.1/24");
    add_node(&n2, "10.250.0.2/24");
    topo
}

fn add_node(ns: &str, underlay_ip: &str) {
    in_ns(ns, &["ip", "link", "set", "lo", "up"]);
    in_ns(ns, &["ip", "addr", "add", underlay_ip, "dev", "u0"]);
    in_ns(ns, &["ip", "link", "set", "u0", "up"]);
}

/// The overlay device of the test nodes.
const OVERLAY: &str = "cpvx";

/// Loads the datapath for node `ns` and brings the node up with the agent's
/// function: the overlay device `cpvx` (MTU 1450 on the 1500 underlay), its
/// gateway neighbour and the route of `10.244.0.0/16` into it, the node maps
/// and the overlay (and with masquerade the uplink) programs.
fn bring_up_node(
    ns: &str,
    pins: &PinDir,
    uplink: Uplink,
    masquerade: Masquerade,
    masq_ports: std::ops::RangeInclusive<u16>,
    tunnel: Tunnel,
) -> (Datapath, NodeNet) {
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).expect("links dir");
    let mut dp = Datapath::load(pins.path()).expect("load");
    let spec = NodeSpec {
        uplink,
        overlay_device: OVERLAY.into(),
        masquerade,
        masq_ports,
        tunnel,
        ..NodeSpec::new(vec!["10.244.0.0/16".parse().unwrap()], links)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let net = rt.block_on(async {
        let host = NetnsHandle::open(named_netns_path(ns))
            .await
            .expect("open the node's namespace");
        bring_up(&host, &spec, || &mut dp)
            .await
            .expect("bring the node up")
    });
    assert_eq!(net.overlay.name, OVERLAY);
    assert_eq!(net.pod_mtu, 1450, "underlay MTU minus the VXLAN overhead");
    (dp, net)
}

/// The entries the agent's CNI path and topology sync write: every node's
/// address to its tunnel endpoint and the other nodes as known VTEPs, a /32
/// per remote pod, and per local pod its port, endpoint and programs
/// (attached from inside the node).
fn program_pods(
    ns: &str,
    dp: Datapath,
    links: &std::path::Path,
    node_ip: Ipv4Addr,
    local: &[&Pod],
    remote: &[(&Pod, Ipv4Addr)],
    nodes: &[Ipv4Addr],
) -> Datapath {
    let links = links.to_path_buf();
    let local: Vec<(String, u32, Ipv4Addr, [u8; 6])> = local
        .iter()
        .map(|p| (p.host_if.clone(), p.host_ifindex, p.ip, p.mac))
        .collect();
    let remote: Vec<(Ipv4Addr, Ipv4Addr)> = remote.iter().map(|(p, n)| (p.ip, *n)).collect();
    let nodes = nodes.to_vec();
    let mut dp = dp;
    on(ns, move || {
        for n in &nodes {
            dp.node_remotes
                .insert(&Addr128::from_v4(*n), &Remote::new(*n))
                .unwrap();
            if *n != node_ip {
                dp.vteps.insert(&vtep_key(*n), &VTEP_F_NODE).unwrap();
            }
        }
        for (ip, node) in &remote {
            let k = lpm_key(0, (*ip).into(), 32).unwrap();
            dp.remotes.insert(&k, &Remote::new(*node)).unwrap();
        }
        for (name, ifindex, ip, mac) in &local {
            dp.ports
                .insert(ifindex, &Port { net: 0, flags: 0 })
                .unwrap();
            dp.locals
                .insert(
                    &EpKey::new(0, *ip),
                    &Endpoint {
                        ifindex: *ifindex,
                        mac: *mac,
                        flags: 0,
                    },
                )
                .unwrap();
            for (prog, dir, tag) in [
                (Program::FromPod, Direction::Ingress, "in"),
                (Program::ToPod, Direction::Egress, "out"),
            ] {
                dp.attach_tcx(
                    Iface::Name(name),
                    prog,
                    dir,
                    &links.join(format!("{name}-{tag}")),
                )
                .expect("attach pod veth");
            }
        }
        dp
    })
}

/// Bytes the device `dev` in `ns` has transmitted.
fn tx_bytes(ns: &str, dev: &str) -> u64 {
    dev_stat(ns, dev, "tx_bytes")
}

/// The device statistic `stat` of `dev` in `ns`.
fn dev_stat(ns: &str, dev: &str, stat: &str) -> u64 {
    in_ns(
        ns,
        &["cat", &format!("/sys/class/net/{dev}/statistics/{stat}")],
    )
    .trim()
    .parse()
    .unwrap_or_else(|e| panic!("{dev} {stat}: {e}"))
}

/// TCP echo: a server in `server_ns`, a client in `client_ns`; returns
/// the address the server saw the client come from.
fn tcp_echo(server_ns: &str, server_ip: Ipv4Addr, client_ns: &str, port: u16) -> Ipv4Addr {
    let addr = SocketAddr::from((server_ip, port));
    let listener = on(server_ns, move || TcpListener::bind(addr).expect("bind"));
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        s.read_exact(&mut buf).expect("read");
        s.write_all(&buf).expect("echo");
        peer
    });
    let payload: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let echoed = on(client_ns, move || {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&payload).expect("send");
        let mut back = vec![0u8; payload.len()];
        c.read_exact(&mut back).expect("receive echo");
        assert!(back == payload, "echoed bytes differ");
        back.len()
    });
    assert_eq!(echoed, 256 * 1024);
    match server.join().expect("server").ip() {
        std::net::IpAddr::V4(v4) => v4,
        other => panic!("unexpected peer {other}"),
    }
}

/// One UDP datagram from `client_ns` to a server at `server_ip` that echoes
/// it; true if the echo of that single datagram (no resend) came back
/// within a second.
fn udp_first_datagram(server_ns: &str, server_ip: Ipv4Addr, client_ns: &str, port: u16) -> bool {
    let addr = SocketAddr::from((server_ip, port));
    let server = on(server_ns, move || UdpSocket::bind(addr).expect("bind udp"));
    server
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        if let Ok((n, peer)) = server.recv_from(&mut buf) {
            let _ = server.send_to(&buf[..n], peer);
        }
    });
    let got = on(client_ns, move || {
        let c = UdpSocket::bind("0.0.0.0:0").expect("bind client");
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        c.send_to(b"first", addr).expect("send");
        let mut buf = [0u8; 64];
        matches!(c.recv_from(&mut buf), Ok((5, _)))
    });
    echo.join().expect("echo thread");
    got
}

#[test]
fn pods_and_nodes_talk_across_the_overlay_encapsulated_in_tc() {
    if !needs!().root().tool(&cozyplane_testkit::tools::IP).ready() {
        return;
    }
    overlay_end_to_end(Tunnel::Tc, "t");
}

#[test]
fn pods_and_nodes_talk_across_the_overlay_through_the_vxlan_device() {
    if !needs!().root().tool(&cozyplane_testkit::tools::IP).ready() {
        return;
    }
    overlay_end_to_end(Tunnel::Device, "d");
}

/// Every path across and within two nodes, the sender check, learning and a
/// multi-homed sender, with the tunnel headers built and removed by `tunnel`.
fn overlay_end_to_end(tunnel: Tunnel, mode: &str) {
    let tag = std::process::id() % 100_000;
    let n = |s: &str| format!("cpe{tag}{mode}-{s}");
    let (n1, n2) = (n("n1"), n("n2"));
    let _topo = two_nodes(&n, &["p1", "p2", "p3", "p4"]);
    let (node1, node2) = (Ipv4Addr::new(10, 250, 0, 1), Ipv4Addr::new(10, 250, 0, 2));
    let p1 = add_pod(&n1, &n("p1"), "cph1", Ipv4Addr::new(10, 244, 1, 2));
    let p3 = add_pod(&n1, &n("p3"), "cph3", Ipv4Addr::new(10, 244, 1, 3));
    let p2 = add_pod(&n2, &n("p2"), "cph2", Ipv4Addr::new(10, 244, 2, 2));
    // a brand-new pod node 2 has not heard of (no remotes entry there)
    let p4 = add_pod(&n1, &n("p4"), "cph4", Ipv4Addr::new(10, 244, 1, 4));

    let pins1 = PinDir::new(&format!("e2e{mode}-n1"));
    let pins2 = PinDir::new(&format!("e2e{mode}-n2"));
    let nodes = [node1, node2];
    // no masquerade here: the uplink hooks are the next test's
    let up = |ns: &str, pins: &PinDir| {
        bring_up_node(
            ns,
            pins,
            Uplink::Named("u0".into()),
            Masquerade::Off,
            0..=0,
            tunnel,
        )
    };
    let (dp1, net1) = up(&n1, &pins1);
    let (dp2, net2) = up(&n2, &pins2);
    assert_eq!((net1.node_ip, net2.node_ip), (node1, node2));
    let dp1 = program_pods(
        &n1,
        dp1,
        &pins1.mount().join("links"),
        node1,
        &[&p1, &p3, &p4],
        &[(&p2, node2)],
        &nodes,
    );
    let dp2 = program_pods(
        &n2,
        dp2,
        &pins2.mount().join("links"),
        node2,
        &[&p2],
        &[(&p1, node1), (&p3, node1)],
        &nodes,
    );

    let cases: [(&str, &str, Ipv4Addr, &str, Ipv4Addr); 5] = [
        // cross-node pod -> pod: the server sees the pod's own address
        ("pod -> remote pod", &p2.ns, p2.ip, &p1.ns, p1.ip),
        // same node pod -> pod (redirect into the destination veth)
        ("pod -> local pod", &p3.ns, p3.ip, &p1.ns, p1.ip),
        // node -> remote pod (to_overlay), reply pod -> node (node_remotes)
        ("node -> remote pod", &p2.ns, p2.ip, &n1, node1),
        ("remote pod -> node", &n1, node1, &p2.ns, p2.ip),
        // node -> local pod (kernel route, to_pod admits)
        ("node -> local pod", &p1.ns, p1.ip, &n1, node1),
    ];
    for (i, (what, server_ns, server_ip, client_ns, client_ip)) in cases.iter().enumerate() {
        let port = 8080 + i as u16;
        let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tcp_echo(server_ns, *server_ip, client_ns, port)
        }));
        match seen {
            Ok(seen) => assert_eq!(seen, *client_ip, "{what}: source address preserved"),
            Err(_) => {
                for (name, dp) in [("node1", &dp1), ("node2", &dp2)] {
                    let drops: Vec<_> = dp
                        .drops()
                        .unwrap()
                        .into_iter()
                        .filter(|d| d.1 > 0)
                        .collect();
                    eprintln!("{name} drops: {drops:?}");
                }
                if std::env::var("CP_E2E_HOLD").is_ok() {
                    eprintln!("holding the topology for 600 s");
                    std::thread::sleep(Duration::from_secs(600));
                }
                panic!("{what}: TCP echo failed");
            }
        }
    }

    // Which path carried pod -> remote pod: in tc mode the VXLAN devices
    // neither send (from_pod redirects to the uplink) nor receive it
    // (from_uplink decapsulates and delivers); in device mode both do.
    let (tx1, rx2, up1) = (
        dev_stat(&n1, OVERLAY, "tx_bytes"),
        dev_stat(&n2, OVERLAY, "rx_bytes"),
        dev_stat(&n1, "u0", "tx_packets"),
    );
    assert_eq!(tcp_echo(&p2.ns, p2.ip, &p1.ns, 8090), p1.ip);
    let (tx1, rx2, up1) = (
        dev_stat(&n1, OVERLAY, "tx_bytes") - tx1,
        dev_stat(&n2, OVERLAY, "rx_bytes") - rx2,
        dev_stat(&n1, "u0", "tx_packets") - up1,
    );
    // GSO kept: node 1's uplink sent fewer packets (the echo's data one way,
    // ACKs the other; ~21 here) than the 256 KiB alone take at the pod's MSS
    // (1398 bytes: 188), so super-packets crossed it whole, tunnel headers
    // and all, in both modes
    let mss_segments = (256 * 1024u64).div_ceil(1450 - 20 - 20 - 12);
    assert!(
        up1 < mss_segments,
        "{up1} packets on the uplink for {mss_segments} MSS-sized segments of data: \
         GSO packets were segmented before the uplink"
    );
    let echo = 256 * 1024;
    match tunnel {
        Tunnel::Tc => assert!(
            tx1 < 16 * 1024 && rx2 < 16 * 1024,
            "tc mode bypasses the VXLAN devices: {tx1} bytes sent, {rx2} received"
        ),
        Tunnel::Device => assert!(
            tx1 >= echo && rx2 >= echo,
            "device mode goes through them: {tx1} bytes sent, {rx2} received"
        ),
    }

    // the new pod's very first datagram is answered: node 2 learned where
    // it lives from the packet itself (real tunnel metadata, bpf/learn.h)
    let answered = udp_first_datagram(&p2.ns, p2.ip, &p4.ns, 9100);
    assert!(answered, "the first datagram of a new pod gets its answer");
    let l = dp2
        .learned
        .get(&EpKey::new(0, p4.ip))
        .unwrap()
        .expect("node 2 learned the new pod");
    assert_eq!(l.tunnel_ip(), node1, "behind node 1's tunnel endpoint");
    assert!(
        dp2.learned
            .entries()
            .unwrap()
            .iter()
            .all(|(k, _)| k.addr != Addr128::from_v4(p1.ip) && k.addr != Addr128::from_v4(p3.ip)),
        "pods with a remotes entry are never learned"
    );

    for dp in [&dp1, &dp2] {
        for (reason, count) in dp.drops().unwrap() {
            assert_eq!(count, 0, "no {} drops on the happy paths", reason.label());
        }
    }

    // only known tunnel endpoints may send: without node 1 in node 2's
    // cp_vteps its packets are dropped and counted
    let mut dp2 = dp2;
    assert!(dp2.vteps.remove(&vtep_key(node1)).unwrap());
    let answered = udp_first_datagram(&p2.ns, p2.ip, &p1.ns, 9101);
    assert!(!answered, "a sender that is no known VTEP is refused");
    assert!(dp2.drop_count(DropReason::UnknownVtep).unwrap() > 0);
    dp2.vteps.insert(&vtep_key(node1), &VTEP_F_NODE).unwrap();

    // A multi-homed node: node 1 gets a second address and a route that
    // makes the kernel prefer it as the source towards node 2. Node 2 only
    // knows node 1's tunnel endpoint, so this works only because the
    // encapsulation pins the outer source to it (local_ipv4 in the key).
    let refused = dp2.drop_count(DropReason::UnknownVtep).unwrap();
    in_ns(&n1, &["ip", "addr", "add", "10.250.0.101/24", "dev", "u0"]);
    in_ns(
        &n1,
        &[
            "ip",
            "route",
            "replace",
            "10.250.0.2/32",
            "dev",
            "u0",
            "src",
            "10.250.0.101",
        ],
    );
    let answered = udp_first_datagram(&p2.ns, p2.ip, &p1.ns, 9102);
    in_ns(&n1, &["ip", "route", "del", "10.250.0.2/32"]);
    in_ns(&n1, &["ip", "addr", "del", "10.250.0.101/24", "dev", "u0"]);
    assert!(answered, "a multi-homed node's pods are still answered");
    assert_eq!(
        dp2.drop_count(DropReason::UnknownVtep).unwrap(),
        refused,
        "the outer source stayed node 1's tunnel endpoint"
    );

    // How packets entered the pods: what from_pod/from_overlay delivered
    // went bpf_redirect_peer straight into the pod, past the host veth's
    // transmit (which then only carries link-local chatter); what the kernel
    // routed (node -> local pod, into p1) went through the host veth and
    // its to_pod. 256 KiB entered each server.
    let p2_tx = tx_bytes(&n2, &p2.host_if);
    let p3_tx = tx_bytes(&n1, &p3.host_if);
    let p1_tx = tx_bytes(&n1, &p1.host_if);
    assert!(
        p2_tx < 16 * 1024,
        "cross-node delivery bypasses the host veth: {p2_tx} bytes sent on it"
    );
    assert!(
        p3_tx < 16 * 1024,
        "same-node delivery bypasses the host veth: {p3_tx} bytes sent on it"
    );
    assert!(
        p1_tx >= echo,
        "kernel-routed delivery crosses the host veth (and to_pod): {p1_tx} bytes"
    );

    // the datapath, not some kernel fallback, carried it: with the remote
    // entry gone, node 1 cannot reach pod 2 any more
    let mut dp1 = dp1;
    dp1.remotes
        .remove(&lpm_key(0, p2.ip.into(), 32).unwrap())
        .unwrap();
    let addr = SocketAddr::from((p2.ip, 8085));
    let refused = on(&p1.ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
    });
    assert!(refused, "no path without the remotes entry");
    assert!(
        dp1.drop_count(DropReason::NoRemote).unwrap() > 0,
        "to_overlay dropped what no remote owns"
    );
}

#[test]
fn pod_reaches_an_external_host_through_masquerade() {
    if !needs!().root().tool(&cozyplane_testkit::tools::IP).ready() {
        return;
    }
    let tag = std::process::id() % 100_000;
    let n = |s: &str| format!("cpm{tag}-{s}");
    let (node, ext) = (n("n1"), n("ext"));
    let _topo = Topology {
        names: ["n1", "ext", "p1"].iter().map(|s| n(s)).collect(),
    };
    sh(&["ip", "netns", "add", &node]);
    sh(&["ip", "netns", "add", &ext]);
    // the uplink: the external host knows nothing about pod addresses
    in_ns(
        &node,
        &[
            "ip", "link", "add", "u0", "type", "veth", "peer", "name", "eth0", "netns", &ext,
        ],
    );
    add_node(&node, "192.168.100.10/24");
    in_ns(
        &node,
        &["ip", "route", "add", "default", "via", "192.168.100.1"],
    );
    in_ns(&ext, &["ip", "link", "set", "lo", "up"]);
    in_ns(
        &ext,
        &["ip", "addr", "add", "192.168.100.1/24", "dev", "eth0"],
    );
    in_ns(&ext, &["ip", "link", "set", "eth0", "up"]);
    let pod = add_pod(&node, &n("p1"), "cph1", Ipv4Addr::new(10, 244, 1, 2));

    let pins = PinDir::new("masq-e2e");
    let masq_ip = Ipv4Addr::new(192, 168, 100, 10);
    // the uplink as the agent finds it by default: the default route's device
    let (dp, net) = bring_up_node(
        &node,
        &pins,
        Uplink::DefaultRoute,
        Masquerade::Bpf,
        20000..=20999,
        Tunnel::default(),
    );
    assert_eq!(net.uplink.name, "u0", "the default route's device");
    assert_eq!(net.node_ip, masq_ip, "the uplink's address");
    let params = dp.params().unwrap();
    assert_eq!(params.masq_ip, masq_ip.octets());
    assert_eq!((params.masq_port_min, params.masq_port_max), (20000, 20999));
    let dp = program_pods(
        &node,
        dp,
        &pins.mount().join("links"),
        masq_ip,
        &[&pod],
        &[],
        &[masq_ip],
    );

    // TCP: the external server sees the node's address, the echo (checksums
    // and all) comes back to the pod
    let seen = tcp_echo(&ext, Ipv4Addr::new(192, 168, 100, 1), &pod.ns, 9000);
    assert_eq!(seen, masq_ip, "masqueraded to the node's address");
    let flows = dp.masq_fwd.entries().unwrap();
    assert!(!flows.is_empty());
    for (k, v) in &flows {
        assert_eq!(k.src, Addr128::from_v4(pod.ip));
        let port = u16::from_be_bytes(v.port);
        assert!((20000..=20999).contains(&port), "port {port} in range");
    }
    // ICMP echo by identifier
    in_ns(&pod.ns, &["ping", "-c", "2", "-W", "2", "192.168.100.1"]);
    for (reason, count) in dp.drops().unwrap() {
        assert_eq!(count, 0, "no {} drops", reason.label());
    }

    // UDP to the overlay port of a host outside: masqueraded, it would be
    // VXLAN from this node (bpf_attack.rs); from_pod drops it first
    on(&pod.ns, || {
        let c = UdpSocket::bind("0.0.0.0:0").expect("bind");
        c.send_to(b"forged vxlan", ("192.168.100.1", VXLAN_PORT))
            .expect("send");
    });
    eventually(
        "the pod's datagram to UDP 4789 to be dropped as overlay_port",
        Duration::from_secs(5),
        || dp.drop_count(DropReason::OverlayPort).unwrap() == 1,
    );
    assert!(
        dp.masq_fwd
            .entries()
            .unwrap()
            .iter()
            .all(|(k, _)| k.dport != VXLAN_PORT.to_be_bytes()),
        "never translated"
    );
}

/// An IPv6 pod on the real kernel with from_pod/to_pod attached: neighbour
/// discovery with its gateway fe80::1 works through the link-scope filter
/// (the pod reaches a node address), and other link-scope traffic to the
/// host (an echo request to fe80::1) is dropped as link_scope.
#[test]
fn ipv6_pod_does_neighbour_discovery_and_nothing_else_with_link_scope() {
    if !needs!()
        .root()
        .tools(cozyplane_testkit::tools::NETNS)
        .ready()
    {
        return;
    }
    let tag = std::process::id() % 100_000;
    let (node, pod_ns) = (format!("cp6{tag}-n1"), format!("cp6{tag}-p1"));
    let _topo = Topology {
        names: vec![node.clone(), pod_ns.clone()],
    };
    let (pod_ip, node_ip) = ("fd00:10:244:1::2", "fd00:99::1");
    sh(&["ip", "netns", "add", &node]);
    sh(&["ip", "netns", "add", &pod_ns]);
    in_ns(&node, &["ip", "link", "set", "lo", "up"]);
    in_ns(
        &node,
        &["ip", "addr", "add", &format!("{node_ip}/128"), "dev", "lo"],
    );
    plumb_pod6(&node, &pod_ns, "cph6", pod_ip);

    let pins = PinDir::new("v6-nd");
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).expect("links dir");
    let mut dp = Datapath::load(pins.path()).expect("load");
    let (ifindex, mac) = (ifindex_of(&node, "cph6"), mac_of(&pod_ns, "eth0"));
    let ns = node.clone();
    let dp_ref = on(&ns, move || {
        dp.ports
            .insert(&ifindex, &Port { net: 0, flags: 0 })
            .unwrap();
        dp.locals
            .insert(
                &EpKey::new(0, pod_ip.parse::<std::net::IpAddr>().unwrap()),
                &Endpoint {
                    ifindex,
                    mac,
                    flags: 0,
                },
            )
            .unwrap();
        for (prog, dir, tag) in [
            (Program::FromPod, Direction::Ingress, "in"),
            (Program::ToPod, Direction::Egress, "out"),
        ] {
            dp.attach_tcx(
                Iface::Name("cph6"),
                prog,
                dir,
                &links.join(format!("cph6-{tag}")),
            )
            .expect("attach pod veth");
        }
        dp
    });
    let dp = dp_ref;

    // ND for fe80::1 (and the host's for the pod) passes: the echo comes back
    in_ns(&pod_ns, &["ping", "-6", "-c", "2", "-W", "2", node_ip]);
    assert_eq!(dp.drop_count(DropReason::LinkScope).unwrap(), 0);
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 0);
    // the host's link-local address for anything but ND: dropped
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pod_ns,
            "ping",
            "-6",
            "-c",
            "1",
            "-W",
            "1",
            "fe80::1%eth0",
        ])
        .output()
        .expect("ping");
    assert!(
        !out.status.success(),
        "echo to fe80::1 must not be answered"
    );
    eventually(
        "the echo request to fe80::1 to be counted as link_scope",
        Duration::from_secs(5),
        || dp.drop_count(DropReason::LinkScope).unwrap() >= 1,
    );
}

/// A per-packet IPv6 NodePort on the real kernel, end to end: an external
/// host on the node's uplink connects over TCP and UDP to `[node v6]:30080`;
/// `from_uplink` (attached by bring-up) translates it to a local IPv6 pod,
/// which sees the client's own address (etp Local's promise), and the
/// pod's replies leave from the NodePort through `from_pod` and
/// `bpf_redirect_neigh` out of the uplink. Bring-up takes the uplink's
/// global IPv6 address as the IPv6 SNAT source. The node's own IPv6
/// sockets on other ports stay its own.
#[test]
fn an_ipv6_nodeport_answers_an_external_client_from_a_local_pod_that_sees_the_client() {
    use cozyplane_datapath::abi::{Backend, SvcKey, BACKEND_F_LOCAL, SVC_SCOPE_EXTERNAL};
    use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
    use std::net::{IpAddr, Ipv6Addr};

    if !needs!()
        .root()
        .tools(cozyplane_testkit::tools::NETNS)
        .ready()
    {
        return;
    }
    let tag = std::process::id() % 100_000;
    let n = |s: &str| format!("cpl6{tag}-{s}");
    let (node, ext, pod_ns) = (n("n1"), n("ext"), n("p1"));
    let _topo = Topology {
        names: vec![node.clone(), ext.clone(), pod_ns.clone()],
    };
    let node6: Ipv6Addr = "fd00:100::10".parse().unwrap();
    let ext6: Ipv6Addr = "fd00:100::1".parse().unwrap();
    let pod6: Ipv6Addr = "fd00:10:244:1::2".parse().unwrap();
    sh(&["ip", "netns", "add", &node]);
    sh(&["ip", "netns", "add", &ext]);
    sh(&["ip", "netns", "add", &pod_ns]);
    in_ns(
        &node,
        &[
            "ip", "link", "add", "u0", "type", "veth", "peer", "name", "eth0", "netns", &ext,
        ],
    );
    add_node(&node, "192.168.100.10/24");
    in_ns(
        &node,
        &["ip", "addr", "add", "fd00:100::10/64", "dev", "u0", "nodad"],
    );
    in_ns(
        &node,
        &["ip", "route", "add", "default", "via", "192.168.100.1"],
    );
    in_ns(&ext, &["ip", "link", "set", "lo", "up"]);
    in_ns(
        &ext,
        &["ip", "addr", "add", "192.168.100.1/24", "dev", "eth0"],
    );
    in_ns(
        &ext,
        &[
            "ip",
            "addr",
            "add",
            "fd00:100::1/64",
            "dev",
            "eth0",
            "nodad",
        ],
    );
    in_ns(&ext, &["ip", "link", "set", "eth0", "up"]);
    // the pod: IPv6 only, fe80::1 as its gateway, a /128 to it on the host
    plumb_pod6(&node, &pod_ns, "cph6", &pod6.to_string());

    let pins = PinDir::new("lb6-e2e");
    let (dp, net) = bring_up_node(
        &node,
        &pins,
        Uplink::DefaultRoute,
        Masquerade::Bpf,
        20000..=20999,
        Tunnel::default(),
    );
    assert_eq!(net.uplink.name, "u0");
    assert_eq!(
        dp.params().unwrap().node_ip6,
        Addr128::from_v6(node6),
        "the uplink's global IPv6 address is the IPv6 SNAT source"
    );
    let links = pins.mount().join("links");
    let (ifindex, mac) = (ifindex_of(&node, "cph6"), mac_of(&pod_ns, "eth0"));
    let mut dp = dp;
    let mut d = SvcDesired::new();
    for proto in [PROTO_TCP, PROTO_UDP] {
        d.insert(
            SvcKey::new(0, IpAddr::V6(node6), 30080, proto, SVC_SCOPE_EXTERNAL),
            DesiredFrontend {
                addr: Backend::new(0, IpAddr::V6(node6), 30080, proto, 0),
                backends: vec![Backend::new(
                    0,
                    IpAddr::V6(pod6),
                    9000,
                    proto,
                    BACKEND_F_LOCAL,
                )],
                local_count: 1,
                maglev: vec![0; 251],
                ..DesiredFrontend::default()
            },
        );
    }
    let dp = on(&node, move || {
        dp.ports
            .insert(&ifindex, &Port { net: 0, flags: 0 })
            .unwrap();
        dp.locals
            .insert(
                &EpKey::new(0, pod6),
                &Endpoint {
                    ifindex,
                    mac,
                    flags: 0,
                },
            )
            .unwrap();
        for (prog, dir, tag) in [
            (Program::FromPod, Direction::Ingress, "in"),
            (Program::ToPod, Direction::Egress, "out"),
        ] {
            dp.attach_tcx(
                Iface::Name("cph6"),
                prog,
                dir,
                &links.join(format!("cph6-{tag}")),
            )
            .expect("attach pod veth");
        }
        let r = dp.svc.sync(&d).expect("service sync");
        assert!(r.converged(), "{r:?}");
        dp
    });

    // TCP: 256 KiB echoed through the NodePort; the pod saw the client.
    let backend = SocketAddr::from((pod6, 9000));
    let node_port = SocketAddr::from((node6, 30080));
    let listener = on(&pod_ns, move || TcpListener::bind(backend).expect("bind"));
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        s.read_exact(&mut buf).expect("read");
        s.write_all(&buf).expect("echo");
        peer
    });
    let (local, echoed) = on(&ext, move || {
        let mut c = TcpStream::connect_timeout(&node_port, Duration::from_secs(5))
            .expect("connect to the IPv6 NodePort");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let payload: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
        c.write_all(&payload).expect("send");
        let mut back = vec![0u8; payload.len()];
        c.read_exact(&mut back).expect("receive the echo");
        (c.local_addr().unwrap(), back == payload)
    });
    assert!(echoed, "echoed bytes differ");
    let peer = server.join().expect("server");
    assert_eq!(
        peer, local,
        "the pod sees the client's own address and port"
    );
    assert_eq!(peer.ip(), IpAddr::V6(ext6));

    // UDP: the reply comes from the NodePort, so the client's connected
    // socket takes it.
    let server = on(&pod_ns, move || UdpSocket::bind(backend).expect("bind udp"));
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (n, peer) = server.recv_from(&mut buf).expect("a datagram");
        server.send_to(&buf[..n], peer).expect("answer");
        peer
    });
    let (local, got) = on(&ext, move || {
        let c = UdpSocket::bind("[::]:0").expect("bind client");
        c.connect(node_port).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.send(b"dns-shaped").expect("send");
        let mut buf = [0u8; 64];
        (c.local_addr().unwrap(), c.recv(&mut buf).ok() == Some(10))
    });
    assert!(got, "the answer came from the NodePort");
    assert_eq!(echo.join().expect("echo"), local);

    // The node's own IPv6 socket on another port is not a Service's.
    let own = SocketAddr::from((node6, 9999));
    assert_eq!(
        tcp_echo_v6(&node, own, &ext),
        IpAddr::V6(ext6),
        "the node's own port"
    );
    for (reason, count) in dp.drops().unwrap() {
        assert_eq!(count, 0, "no {} drops", reason.label());
    }
    assert!(
        !dp.svc.lb_fwd.entries().unwrap().is_empty(),
        "flows tracked"
    );
}

/// An IPv6-only pod in namespace `pod_ns` (which exists) behind host veth
/// `host_if` of `node`, plumbed as the agent does: the host half holds
/// fe80::1 and a /128 route to the pod, the pod its address and a default
/// route via fe80::1.
fn plumb_pod6(node: &str, pod_ns: &str, host_if: &str, pod_ip: &str) {
    in_ns(
        node,
        &[
            "ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", pod_ns,
        ],
    );
    in_ns(
        node,
        &["ip", "addr", "add", "fe80::1/64", "dev", host_if, "nodad"],
    );
    in_ns(node, &["ip", "link", "set", host_if, "up"]);
    let host_route = format!("{pod_ip}/128");
    in_ns(
        node,
        &["ip", "-6", "route", "add", &host_route, "dev", host_if],
    );
    in_ns(pod_ns, &["ip", "link", "set", "lo", "up"]);
    in_ns(pod_ns, &["ip", "link", "set", "eth0", "up"]);
    in_ns(
        pod_ns,
        &["ip", "addr", "add", &host_route, "dev", "eth0", "nodad"],
    );
    in_ns(
        pod_ns,
        &[
            "ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ],
    );
}

/// A one-shot TCP echo at `addr` in `server_ns`, from `client_ns`; the
/// address the server saw.
fn tcp_echo_v6(server_ns: &str, addr: SocketAddr, client_ns: &str) -> std::net::IpAddr {
    let listener = on(server_ns, move || TcpListener::bind(addr).expect("bind"));
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).expect("read");
        s.write_all(&buf).expect("echo");
        peer.ip()
    });
    on(client_ns, move || {
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"hello").expect("send");
        let mut back = [0u8; 5];
        c.read_exact(&mut back).expect("echo");
    });
    server.join().expect("server")
}

/// Plumbs a pod with the agent's own netlink code (veth, proxy ARP, the
/// on-link gateway and default route in the pod) and returns its host veth
/// ifindex.
#[allow(clippy::too_many_arguments)] // a test helper: every argument is one fact of the pod
fn plumb_pod(
    rt: &tokio::runtime::Runtime,
    node: &str,
    pod_ns: &str,
    host_if: &str,
    ip: Ipv4Addr,
    ipv6: Option<std::net::Ipv6Addr>,
    mac: [u8; 6],
    vpc: bool,
) -> u32 {
    use cozyplane_datapath::netlink::{plumb, MacAddr, PlumbRequest};
    sh(&["ip", "netns", "add", pod_ns]);
    rt.block_on(async {
        let host = NetnsHandle::open(named_netns_path(node))
            .await
            .expect("open the node's namespace");
        let pod_netns = named_netns_path(pod_ns);
        let req = PlumbRequest {
            pod_netns: &pod_netns,
            ifname: "eth0",
            host_ifname: host_if,
            mtu: 1500,
            ipv4: Some(ip),
            ipv6,
            pod_mac: Some(MacAddr(mac)),
            alias: "bridge-test",
            // as the agent plumbs a VPC pod: the host routes its fabric
            // addresses (plumb_bridge), never its VPC ones (twin VPCs share
            // addresses)
            host_routes: if vpc { Some(&[]) } else { None },
        };
        plumb(&host, &req).await.expect("plumb").host_ifindex
    })
}

/// The dual-address bridge on the real kernel: a dual-stack VPC pod holding
/// only its VPC addresses is reached by the node at its fabric addresses,
/// with TCP (connect + echo) and ping over IPv4 and IPv6, and sees the node
/// as 169.254.1.1 / fe80::1; a net-0 pod's packets for the fabric address
/// never get in.
#[test]
fn the_node_reaches_a_vpc_pod_by_its_fabric_address() {
    if !needs!()
        .root()
        .tools(cozyplane_testkit::tools::NETNS)
        .ready()
    {
        return;
    }
    use cozyplane_datapath::netlink::{plumb_bridge, MacAddr};
    let tag = std::process::id() % 100_000;
    let n = |s: &str| format!("cpb{tag}-{s}");
    let (node, vpc_ns, pod0_ns) = (n("n1"), n("vpc"), n("p0"));
    let _topo = Topology {
        names: vec![node.clone(), vpc_ns.clone(), pod0_ns.clone()],
    };
    const NET: u32 = 100;
    let node_ip = Ipv4Addr::new(10, 250, 0, 1);
    let vpc_ip = Ipv4Addr::new(10, 0, 0, 5);
    let fabric = Ipv4Addr::new(10, 244, 1, 9);
    let pod0_ip = Ipv4Addr::new(10, 244, 1, 2);
    let vpc_mac = [0x0a, 0x58, 10, 0, 0, 5];
    let node_ip6: std::net::Ipv6Addr = "fd00:99::1".parse().unwrap();
    let vpc_ip6: std::net::Ipv6Addr = "fd10::5".parse().unwrap();
    let fabric6: std::net::Ipv6Addr = "fd00:10:244:1::9".parse().unwrap();
    let pod0_mac = [0x0a, 0x58, 10, 244, 1, 2];

    // the node: an uplink with its address and the default route (what
    // proxy ARP needs to answer for 169.254.1.1), forwarding on
    sh(&["ip", "netns", "add", &node]);
    in_ns(&node, &["ip", "link", "set", "lo", "up"]);
    in_ns(
        &node,
        &[
            "ip", "link", "add", "u0", "type", "veth", "peer", "name", "u1",
        ],
    );
    in_ns(&node, &["ip", "addr", "add", "10.250.0.1/24", "dev", "u0"]);
    in_ns(&node, &["ip", "link", "set", "u0", "up"]);
    in_ns(&node, &["ip", "link", "set", "u1", "up"]);
    in_ns(&node, &["ip", "route", "add", "default", "dev", "u0"]);
    in_ns(
        &node,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            "fd00:99::1/64",
            "dev",
            "u0",
            "nodad",
        ],
    );
    in_ns(&node, &["ip", "-6", "route", "add", "default", "dev", "u0"]);
    in_ns(&node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let vpc_if = plumb_pod(
        &rt,
        &node,
        &vpc_ns,
        "cphvpc",
        vpc_ip,
        Some(vpc_ip6),
        vpc_mac,
        true,
    );
    let pod0_if = plumb_pod(
        &rt, &node, &pod0_ns, "cphp0", pod0_ip, None, pod0_mac, false,
    );
    // A VPC address is no node route: only the fabric address is routed
    // into the VPC pod.
    assert!(
        !in_ns(&node, &["ip", "route", "show"]).contains(&format!("{vpc_ip} ")),
        "no host route to the VPC address"
    );
    assert!(
        !in_ns(&vpc_ns, &["ip", "-4", "addr", "show", "dev", "eth0"]).contains(&fabric.to_string()),
        "the pod never holds its fabric address"
    );
    rt.block_on(async {
        let host = NetnsHandle::open(named_netns_path(&node))
            .await
            .expect("open the node's namespace");
        for _ in 0..2 {
            // twice: idempotent
            for f in [std::net::IpAddr::V4(fabric), std::net::IpAddr::V6(fabric6)] {
                plumb_bridge(&host.nl, vpc_if, f, MacAddr(vpc_mac))
                    .await
                    .expect("route the fabric address into the VPC pod");
            }
        }
    });
    let neigh = in_ns(&node, &["ip", "neigh", "show", "dev", "cphvpc"]);
    assert!(
        neigh.contains(&fabric.to_string()) && neigh.contains("PERMANENT"),
        "permanent neighbour for the fabric address: {neigh}"
    );

    let pins = PinDir::new("bridge-netns");
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).expect("links dir");
    let mut dp = Datapath::load(pins.path()).expect("load");
    for (ifindex, net, ip, mac) in [
        (vpc_if, NET, vpc_ip, vpc_mac),
        (pod0_if, 0, pod0_ip, pod0_mac),
    ] {
        dp.ports.insert(&ifindex, &Port { net, flags: 0 }).unwrap();
        dp.locals
            .insert(
                &EpKey::new(net, ip),
                &Endpoint {
                    ifindex,
                    mac,
                    flags: 0,
                },
            )
            .unwrap();
    }
    dp.put_bridge(fabric.into(), NET, vpc_ip.into(), vpc_if)
        .unwrap();
    dp.locals
        .insert(
            &EpKey::new(NET, std::net::IpAddr::V6(vpc_ip6)),
            &Endpoint {
                ifindex: vpc_if,
                mac: vpc_mac,
                flags: 0,
            },
        )
        .unwrap();
    dp.put_bridge(fabric6.into(), NET, vpc_ip6.into(), vpc_if)
        .unwrap();
    let dp = on(&node, move || {
        for name in ["cphvpc", "cphp0"] {
            for (prog, dir, tag) in [
                (Program::FromPod, Direction::Ingress, "in"),
                (Program::ToPod, Direction::Egress, "out"),
            ] {
                dp.attach_tcx(
                    Iface::Name(name),
                    prog,
                    dir,
                    &links.join(format!("{name}-{tag}")),
                )
                .expect("attach pod veth");
            }
        }
        dp
    });

    // TCP: the node connects to the fabric address, the pod echoes, and
    // the pod saw the connection come from its gateway
    let tcp = |fabric: std::net::IpAddr, port: u16| {
        let any: std::net::IpAddr = if fabric.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let listener = on(&vpc_ns, move || {
            TcpListener::bind(SocketAddr::from((any, port))).expect("bind")
        });
        let server = std::thread::spawn(move || {
            let (mut s, peer) = listener.accept().expect("accept");
            let local = s.local_addr().expect("local address");
            let mut buf = vec![0u8; 64 * 1024];
            s.read_exact(&mut buf).expect("read");
            s.write_all(&buf).expect("echo");
            (peer, local)
        });
        let target = SocketAddr::from((fabric, port));
        let connected = on(&node, move || {
            let mut c = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let payload: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
            c.write_all(&payload)?;
            let mut back = vec![0u8; payload.len()];
            c.read_exact(&mut back)?;
            assert!(back == payload, "echoed bytes differ");
            c.local_addr()
        });
        let drops: Vec<_> = dp
            .drops()
            .unwrap()
            .into_iter()
            .filter(|d| d.1 > 0)
            .collect();
        let client = connected
            .unwrap_or_else(|e| panic!("node -> fabric address {fabric}: {e}; drops {drops:?}"));
        let (peer, local) = server.join().expect("server");
        (peer, local, client)
    };
    let (peer, local, client) = tcp(fabric.into(), 8080);
    assert_eq!(
        peer.ip(),
        std::net::IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1)),
        "inside the pod the node is its gateway"
    );
    assert_ne!(peer.port(), 0);
    assert_eq!(
        local.ip(),
        std::net::IpAddr::V4(vpc_ip),
        "reached at the VPC address"
    );
    assert_eq!(
        client.ip(),
        std::net::IpAddr::V4(node_ip),
        "from the node's own address"
    );
    let (peer, local, client) = tcp(fabric6.into(), 8081);
    assert_eq!(
        peer.ip(),
        "fe80::1".parse::<std::net::IpAddr>().unwrap(),
        "over IPv6 the node is fe80::1"
    );
    assert_eq!(local.ip(), std::net::IpAddr::V6(vpc_ip6));
    assert_eq!(client.ip(), std::net::IpAddr::V6(node_ip6));

    // ping: echo by identifier
    let ping = |ns: &str, to: std::net::IpAddr| {
        Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "2",
            ])
            .arg(to.to_string())
            .output()
            .expect("ping")
    };
    for to in [std::net::IpAddr::V4(fabric), std::net::IpAddr::V6(fabric6)] {
        let out = ping(&node, to);
        assert!(
            out.status.success(),
            "node pings the fabric address {to}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    for (reason, count) in dp.drops().unwrap() {
        assert_eq!(count, 0, "no {} drops on the bridge", reason.label());
    }

    // a net-0 pod's packets for the fabric address: forwarded by the
    // kernel into the VPC pod's veth, where to_pod refuses them
    let out = ping(&pod0_ns, fabric.into());
    assert!(
        !out.status.success(),
        "a net-0 pod cannot reach the VPC pod"
    );
    assert!(dp.drop_count(DropReason::Misdelivered).unwrap() >= 2);
    assert!(
        dp.bridge_fwd
            .entries()
            .unwrap()
            .iter()
            .all(|(k, _)| k.t.src == Addr128::from_v4(node_ip)
                || k.t.src == Addr128::from_v6(node_ip6)),
        "only the node's own flows were bridged"
    );

    // revocation takes the kernel half down again, idempotently
    use cozyplane_datapath::netlink::unplumb_bridge;
    let removed = rt.block_on(async {
        let host = NetnsHandle::open(named_netns_path(&node))
            .await
            .expect("open the node's namespace");
        let mut removed = Vec::new();
        for _ in 0..2 {
            removed.push(
                unplumb_bridge(&host.nl, vpc_if, fabric.into())
                    .await
                    .expect("unplumb the bridge"),
            );
        }
        removed
    });
    assert_eq!(removed, [true, false]);
    let routes = in_ns(&node, &["ip", "route", "show", &format!("{fabric}/32")]);
    assert!(routes.trim().is_empty(), "fabric route gone: {routes}");
    let neigh = in_ns(
        &node,
        &["ip", "neigh", "show", &fabric.to_string(), "dev", "cphvpc"],
    );
    assert!(neigh.trim().is_empty(), "fabric neighbour gone: {neigh}");
}

/// Registers VPC pods as the attach path and the compiler do: `cp_vnis` for
/// every VPC, per local pod its port on the VPC's net, its endpoint and
/// programs, and a /32 per remote VPC pod under its VPC's net.
fn program_vpc_pods(
    ns: &str,
    dp: Datapath,
    links: &std::path::Path,
    local: &[(u32, &Pod)],
    remote: &[(u32, &Pod, Ipv4Addr)],
) -> Datapath {
    let links = links.to_path_buf();
    let local: Vec<(u32, String, u32, Ipv4Addr, [u8; 6])> = local
        .iter()
        .map(|(net, p)| (*net, p.host_if.clone(), p.host_ifindex, p.ip, p.mac))
        .collect();
    let remote: Vec<(u32, Ipv4Addr, Ipv4Addr)> =
        remote.iter().map(|(net, p, n)| (*net, p.ip, *n)).collect();
    let mut dp = dp;
    on(ns, move || {
        for (net, ..) in &local {
            dp.vnis.insert(net, net).unwrap();
        }
        for (net, ip, node) in &remote {
            let k = lpm_key(*net, (*ip).into(), 32).unwrap();
            dp.remotes.insert(&k, &Remote::new(*node)).unwrap();
        }
        for (net, name, ifindex, ip, mac) in &local {
            dp.ports
                .insert(
                    ifindex,
                    &Port {
                        net: *net,
                        flags: 0,
                    },
                )
                .unwrap();
            let ep = Endpoint {
                ifindex: *ifindex,
                mac: *mac,
                flags: 0,
            };
            dp.locals.insert(&EpKey::new(*net, *ip), &ep).unwrap();
            for (prog, dir, tag) in [
                (Program::FromPod, Direction::Ingress, "in"),
                (Program::ToPod, Direction::Egress, "out"),
            ] {
                dp.attach_tcx(
                    Iface::Name(name),
                    prog,
                    dir,
                    &links.join(format!("{name}-{tag}")),
                )
                .expect("attach pod veth");
            }
        }
        dp
    })
}

/// Does a TCP connection from `client_ns` to `ip:port` fail within 500 ms?
fn tcp_refused(client_ns: &str, ip: Ipv4Addr, port: u16) -> bool {
    let addr = SocketAddr::from((ip, port));
    on(client_ns, move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
    })
}

/// Twin VPCs on the real kernel: VPC A (net 100) and VPC B (net 101) use the
/// same addresses, crossed over two nodes (A's 10.0.0.5 is on node 1 where
/// B's 10.0.0.6 is, and the other way round). Each pod reaches its own VPC's
/// pod across the overlay with the VPC's VNI, never the twin's pod at the
/// same address on its own node; nothing of a VPC reaches a node or comes
/// from one through the kernel; a quarantined pod is cut off and restored;
/// the meters count the VPC's traffic.
#[test]
fn twin_vpcs_talk_within_themselves_across_the_overlay() {
    if !needs!().root().tool(&cozyplane_testkit::tools::IP).ready() {
        return;
    }
    let tag = std::process::id() % 100_000;
    let n = |s: &str| format!("cpv{tag}-{s}");
    let (n1, n2) = (n("n1"), n("n2"));
    let _topo = two_nodes(&n, &["a1", "a2", "b1", "b2"]);
    let (node1, node2) = (Ipv4Addr::new(10, 250, 0, 1), Ipv4Addr::new(10, 250, 0, 2));
    let (x5, x6) = (Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(10, 0, 0, 6));
    let (vpc_a, vpc_b) = (100u32, 101u32);
    let a1 = add_pod(&n1, &n("a1"), "cpha1", x5);
    let b1 = add_pod(&n1, &n("b1"), "cphb1", x6);
    let a2 = add_pod(&n2, &n("a2"), "cpha2", x6);
    let b2 = add_pod(&n2, &n("b2"), "cphb2", x5);

    let pins1 = PinDir::new("vpc-n1");
    let pins2 = PinDir::new("vpc-n2");
    let nodes = [node1, node2];
    let up = |ns: &str, pins: &PinDir| {
        bring_up_node(
            ns,
            pins,
            Uplink::Named("u0".into()),
            Masquerade::Off,
            0..=0,
            Tunnel::default(),
        )
    };
    let (dp1, _) = up(&n1, &pins1);
    let (dp2, _) = up(&n2, &pins2);
    let links1 = pins1.mount().join("links");
    let links2 = pins2.mount().join("links");
    let dp1 = program_pods(&n1, dp1, &links1, node1, &[], &[], &nodes);
    let dp2 = program_pods(&n2, dp2, &links2, node2, &[], &[], &nodes);
    let mut dp1 = program_vpc_pods(
        &n1,
        dp1,
        &links1,
        &[(vpc_a, &a1), (vpc_b, &b1)],
        &[(vpc_a, &a2, node2), (vpc_b, &b2, node2)],
    );
    let dp2 = program_vpc_pods(
        &n2,
        dp2,
        &links2,
        &[(vpc_a, &a2), (vpc_b, &b2)],
        &[(vpc_a, &a1, node1), (vpc_b, &b1, node1)],
    );

    // each VPC's cross-node pair, both ways: 10.0.0.6 from a1 is a2 on node
    // 2 (only a2 listens), not b1 next door
    let cases = [
        ("a1 -> a2", &a2, &a1, 8200u16),
        ("a2 -> a1", &a1, &a2, 8201),
        ("b1 -> b2", &b2, &b1, 8202),
        ("b2 -> b1", &b1, &b2, 8203),
    ];
    for (what, server, client, port) in cases {
        let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tcp_echo(&server.ns, server.ip, &client.ns, port)
        }));
        match seen {
            Ok(seen) => assert_eq!(seen, client.ip, "{what}: source preserved"),
            Err(_) => {
                for (name, dp) in [("node1", &dp1), ("node2", &dp2)] {
                    let drops: Vec<_> = dp
                        .drops()
                        .unwrap()
                        .into_iter()
                        .filter(|d| d.1 > 0)
                        .collect();
                    eprintln!("{name} drops: {drops:?}");
                }
                panic!("{what}: TCP echo failed");
            }
        }
    }
    for dp in [&dp1, &dp2] {
        for (reason, count) in dp.drops().unwrap() {
            assert_eq!(count, 0, "no {} drops within the VPCs", reason.label());
        }
    }

    // a VPC pod cannot reach its node, nor the other node
    let _node_listener = on(&n1, || TcpListener::bind("0.0.0.0:8210").expect("bind"));
    assert!(tcp_refused(&a1.ns, node1, 8210), "a1 -> its node");
    assert!(tcp_refused(&a1.ns, node2, 8210), "a1 -> node 2");
    assert!(dp1.drop_count(DropReason::VpcIsolated).unwrap() > 0);
    // the node cannot reach a VPC pod through its kernel route (the host
    // route this harness adds for every pod)
    let _a1_listener = on(&a1.ns, move || {
        TcpListener::bind(SocketAddr::from((x5, 8211))).expect("bind")
    });
    assert!(tcp_refused(&n1, x5, 8211), "node 1 -> a1 by the kernel");
    assert!(dp1.drop_count(DropReason::VpcKernelPath).unwrap() > 0);
    // the VPCs' traffic was metered, each on its own net
    let c = dp1.net_counters().unwrap();
    for net in [vpc_a, vpc_b] {
        let m = &c[&net];
        assert!(
            m.egress.bytes >= 2 * 256 * 1024 && m.ingress.bytes >= 2 * 256 * 1024,
            "net {net} metered both ways: {m:?}"
        );
    }
    assert!(!c.contains_key(&0), "net 0 is not metered");

    // revocation: a1 quarantined is cut off both ways and stays up; restored
    // (a new attach), it talks again
    assert!(dp1.set_port_quarantine(a1.host_ifindex, true).unwrap());
    assert!(tcp_refused(&a1.ns, x6, 8212), "a1 -> a2 while severed");
    assert!(tcp_refused(&a2.ns, x5, 8211), "a2 -> a1 while severed");
    assert!(dp1.drop_count(DropReason::Quarantined).unwrap() > 0);
    assert!(dp1.set_port_quarantine(a1.host_ifindex, false).unwrap());
    let seen = tcp_echo(&a2.ns, a2.ip, &a1.ns, 8213);
    assert_eq!(seen, a1.ip, "restored");
}

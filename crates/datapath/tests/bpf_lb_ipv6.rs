//! BPF_PROG_TEST_RUN tests of the per-packet Service load balancer
//! (`bpf/lb.h`) for IPv6: NodePorts on a node's IPv6 address, IPv6
//! LoadBalancer IPs, from the wire (`from_uplink`) and from other nodes
//! (`from_overlay`), the replies in `from_pod` and `from_overlay`, on crafted
//! frames whose L4 checksums are checked in Rust. The frontends are programmed
//! by the real sync (`SvcMaps::sync`); the IPv4 cases are `bpf_lb.rs`'s. Needs
//! root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, Backend, DropReason, Params, Remote, SvcKey, BACKEND_F_LOCAL,
    SVC_SCOPE_EXTERNAL, SVC_SCOPE_INTERNAL, VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const UPLINK_IF: u32 = 2;
const VXLAN_IF: u32 = 5;
/// Tunnel endpoints (the underlay is IPv4).
const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const NODE2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);
const NODE_PORT: u16 = 30080;
const TARGET: u16 = 8080;
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const SNAT_MIN: u16 = 61000;

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// This node's and the other node's IPv6 addresses.
fn node6() -> Ipv6Addr {
    ip6("fd00:18::b")
}
fn node2_6() -> Ipv6Addr {
    ip6("fd00:18::c")
}
/// A pod of this node, and one of the other node's (in its /64).
fn pod6() -> Ipv6Addr {
    ip6("fd00:10:244:1::2")
}
fn remote_pod6() -> Ipv6Addr {
    ip6("fd00:10:244:2::7")
}
fn client6() -> Ipv6Addr {
    ip6("2001:db8:19::2")
}
fn lb6() -> Ipv6Addr {
    ip6("2001:db8:19:10::1")
}

/// A node (NODE) with a local IPv6 pod, a remote IPv6 pod CIDR on NODE2,
/// both nodes' addresses of both families known, the overlay and the uplink
/// configured; `node_ip6` is the SNAT source it is given (None: the node has
/// no IPv6 address).
fn node(test: &str, node_ip6: Option<Ipv6Addr>) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        node_ip6: node_ip6.map(Addr128::from_v6).unwrap_or_default(),
        ..Params::default()
    })
    .unwrap();
    add_local_pod(&mut dp, POD_IF, pod6(), POD_MAC);
    let cidr = lpm_key(0, "fd00:10:244:2::".parse().unwrap(), 64).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
    for (addr, tunnel) in [
        (IpAddr::V4(NODE), NODE),
        (IpAddr::V4(NODE2), NODE2),
        (IpAddr::V6(node6()), NODE),
        (IpAddr::V6(node2_6()), NODE2),
    ] {
        dp.node_remotes
            .insert(&Addr128::from(addr), &Remote::new(tunnel))
            .unwrap();
    }
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    (pins, dp)
}

/// A wire-scope frontend `addr:port` over `backends` (`local` of them this
/// node's, listed first), with a Maglev-shaped table of 251 slots.
fn wire(addr: IpAddr, port: u16, proto: u8, backends: &[(IpAddr, bool)]) -> SvcDesired {
    let mut d = SvcDesired::new();
    d.insert(
        SvcKey::new(0, addr, port, proto, SVC_SCOPE_EXTERNAL),
        frontend(addr, port, proto, backends, true),
    );
    d
}

fn frontend(
    addr: IpAddr,
    port: u16,
    proto: u8,
    backends: &[(IpAddr, bool)],
    maglev: bool,
) -> DesiredFrontend {
    let n = backends.len() as u32;
    DesiredFrontend {
        addr: Backend::new(0, addr, port, proto, 0),
        backends: backends
            .iter()
            .map(|&(ip, local)| {
                let flags = if local { BACKEND_F_LOCAL } else { 0 };
                Backend::new(0, ip, TARGET, proto, flags)
            })
            .collect(),
        local_count: backends.iter().filter(|b| b.1).count() as u32,
        maglev: if n == 0 || !maglev {
            Vec::new()
        } else {
            (0..251).map(|i| (i * 7 + i / 3) % n).collect()
        },
        ..DesiredFrontend::default()
    }
}

fn v6(addrs: &[(Ipv6Addr, bool)]) -> Vec<(IpAddr, bool)> {
    addrs.iter().map(|&(a, l)| (IpAddr::V6(a), l)).collect()
}

fn program(dp: &mut Datapath, d: &SvcDesired) {
    let r = dp.svc.sync(d).unwrap();
    assert!(r.converged(), "{r:?}");
}

fn from_uplink(dp: &mut Datapath, pkt: &Ip6) -> Run {
    run(
        dp,
        Program::FromUplink,
        &pkt.frame(UPLINK_MAC, ROUTER_MAC),
        Ctx {
            ingress_ifindex: UPLINK_IF,
            ..Ctx::default()
        },
    )
}

fn from_pod(dp: &mut Datapath, pkt: &Ip6) -> Run {
    run(
        dp,
        Program::FromPod,
        &pkt.frame(GW_MAC, POD_MAC),
        Ctx {
            ingress_ifindex: POD_IF,
            ..Ctx::default()
        },
    )
}

/// A packet decapsulated from NODE2 on net 0 (the test build reads the VNI
/// from `cb[0]` and the sender from `cb[1]`).
fn from_overlay(dp: &mut Datapath, pkt: &Ip6) -> Run {
    run(
        dp,
        Program::FromOverlay,
        &pkt.frame(
            cozyplane_datapath::abi::OVERLAY_MAC,
            [2, 0xcf, 198, 18, 0, 12],
        ),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

fn no_flow_state(dp: &Datapath) -> bool {
    dp.svc.lb_fwd.entries().unwrap().is_empty() && dp.svc.lb_rev.entries().unwrap().is_empty()
}

#[test]
fn an_ipv6_nodeport_to_a_local_pod_keeps_the_client_and_the_reply_leaves_from_the_nodeport() {
    if !needs!().root().ready() {
        return;
    }
    // SCTP's CRC32c is updated for the ports (bpf/nat.h cp_sctp_crc)
    for proto in [PROTO_TCP, PROTO_UDP, PROTO_SCTP] {
        let (_pins, mut dp) = node(&format!("lb6-local-{proto}"), Some(node6()));
        program(
            &mut dp,
            &wire(node6().into(), NODE_PORT, proto, &v6(&[(pod6(), true)])),
        );
        let req = Ip6::new(client6(), node6(), proto, 40000, NODE_PORT);
        let r = from_uplink(&mut dp, &req);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the pod ({proto})");
        let p = parse6(&r.data);
        assert_eq!(
            (p.src, p.sport),
            (client6(), 40000),
            "the client's source is kept"
        );
        assert_eq!((p.dst, p.dport), (pod6(), TARGET), "DNAT to the backend");
        assert_eq!(p.dst_mac, POD_MAC);
        assert!(p.l4_csum_ok, "request checksum ({proto})");
        assert!(p.payload.starts_with(&req.payload), "(SCTP pads its chunk)");
        let d = dp.test_deliver().unwrap().expect("delivery recorded");
        assert_eq!(
            (d.ifindex, d.peer),
            (POD_IF, 1),
            "redirect_peer into the pod"
        );

        // The pod's reply leaves from the NodePort, out of the uplink.
        let reply = Ip6::new(pod6(), client6(), proto, TARGET, 40000);
        let r = from_pod(&mut dp, &reply);
        assert_eq!(r.verdict, TC_ACT_REDIRECT);
        let q = parse6(&r.data);
        assert_eq!(
            (q.src, q.sport),
            (node6(), NODE_PORT),
            "source back to the frontend"
        );
        assert_eq!((q.dst, q.dport), (client6(), 40000));
        assert!(q.l4_csum_ok, "reply checksum ({proto})");
        let d = dp.test_deliver().unwrap().unwrap();
        assert_eq!(
            (d.ifindex, d.peer),
            (UPLINK_IF, 2),
            "bpf_redirect_neigh out of the uplink the request came in on"
        );
    }
}

#[test]
fn an_ipv6_nodeport_to_a_remote_pod_is_snated_to_the_nodes_ipv6_address_and_reversed_on_return() {
    if !needs!().root().ready() {
        return;
    }
    // SCTP: both ports change, one CRC32c update for them
    for proto in [PROTO_TCP, PROTO_SCTP] {
        let (_pins, mut dp) = node(&format!("lb6-remote-{proto}"), Some(node6()));
        program(
            &mut dp,
            &wire(
                node6().into(),
                NODE_PORT,
                proto,
                &v6(&[(remote_pod6(), false)]),
            ),
        );
        let req = Ip6::new(client6(), node6(), proto, 40001, NODE_PORT);
        let r = from_uplink(&mut dp, &req);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
        let p = parse6(&r.data);
        assert_eq!((p.dst, p.dport), (remote_pod6(), TARGET));
        assert_eq!(
            p.src,
            node6(),
            "SNAT to this node's IPv6 address, so the reply comes back here"
        );
        assert!(p.sport >= SNAT_MIN, "SNAT port {} in range", p.sport);
        assert!(p.l4_csum_ok, "request checksum");
        let enc = dp.test_encap().unwrap().expect("encapsulated");
        assert_eq!(enc.remote, NODE2.octets());
        let snat_port = p.sport;

        // The same flow keeps its backend and port.
        let again = parse6(&from_uplink(&mut dp, &req).data);
        assert_eq!((again.dst, again.sport), (remote_pod6(), snat_port));

        // The backend's reply arrives through the overlay, for the SNAT address.
        let reply = Ip6::new(remote_pod6(), node6(), proto, TARGET, snat_port);
        let r = from_overlay(&mut dp, &reply);
        assert_eq!(r.verdict, TC_ACT_REDIRECT);
        let q = parse6(&r.data);
        assert_eq!((q.src, q.sport), (node6(), NODE_PORT));
        assert_eq!(
            (q.dst, q.dport),
            (client6(), 40001),
            "destination back to the client"
        );
        assert!(q.l4_csum_ok, "reply checksum");
        let d = dp.test_deliver().unwrap().unwrap();
        assert_eq!((d.ifindex, d.peer), (UPLINK_IF, 2));

        // A reply-shaped packet for a SNAT port nobody holds is the node's own.
        let stray = Ip6::new(
            remote_pod6(),
            node6(),
            proto,
            TARGET,
            snat_port.wrapping_add(1).max(SNAT_MIN),
        );
        let frame = stray.frame(
            cozyplane_datapath::abi::OVERLAY_MAC,
            [2, 0xcf, 198, 18, 0, 12],
        );
        let r = from_overlay(&mut dp, &stray);
        assert_eq!(r.verdict, CP_PASS);
        assert_eq!(r.data, frame, "untouched");
    }
}

#[test]
fn an_ipv6_nodeport_request_from_another_node_is_snated_and_answered_through_the_overlay() {
    if !needs!().root().ready() {
        return;
    }
    // A client on NODE2 (no socket hook saw it: a VM guest, say) connects to
    // [NODE6]:30080; the request comes through the overlay, and its reply
    // must come back to this node to be reversed, so the source becomes
    // NODE6 even though the backend is local.
    let (_pins, mut dp) = node("lb6-overlay", Some(node6()));
    program(
        &mut dp,
        &wire(node6().into(), NODE_PORT, PROTO_TCP, &v6(&[(pod6(), true)])),
    );
    let req = Ip6::tcp(remote_pod6(), 45000, node6(), NODE_PORT);
    let r = from_overlay(&mut dp, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let p = parse6(&r.data);
    assert_eq!((p.dst, p.dport), (pod6(), TARGET));
    assert_eq!(p.src, node6());
    assert!(p.l4_csum_ok);

    // The pod answers [NODE6]:<snat>: from_pod sees a packet for this node.
    let reply = Ip6::tcp(pod6(), TARGET, node6(), p.sport);
    let r = from_pod(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "to the client's node");
    let q = parse6(&r.data);
    assert_eq!((q.src, q.sport), (node6(), NODE_PORT));
    assert_eq!((q.dst, q.dport), (remote_pod6(), 45000));
    assert!(q.l4_csum_ok);
    let enc = dp.test_encap().unwrap().unwrap();
    assert_eq!(
        enc.remote,
        NODE2.octets(),
        "encapsulated to the client's node"
    );
}

#[test]
fn without_an_ipv6_node_address_a_flow_that_needs_snat_is_dropped_whole() {
    if !needs!().root().ready() {
        return;
    }
    // The node has no IPv6 address to SNAT to: a flow to a remote backend
    // cannot come back, so it is dropped and counted, and leaves no flow
    // state behind. A local backend reached from the wire needs no SNAT
    // and is served.
    let (_pins, mut dp) = node("lb6-no-addr", None);
    let mut d = wire(lb6().into(), 80, PROTO_TCP, &v6(&[(remote_pod6(), false)]));
    d.extend(wire(lb6().into(), 81, PROTO_TCP, &v6(&[(pod6(), true)])));
    program(&mut dp, &d);
    let before = dp.drop_count(DropReason::LbNat).unwrap();
    let r = from_uplink(&mut dp, &Ip6::tcp(client6(), 41000, lb6(), 80));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LbNat).unwrap(), before + 1);
    assert!(no_flow_state(&dp), "no half-made flow");

    let r = from_uplink(&mut dp, &Ip6::tcp(client6(), 41001, lb6(), 81));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(parse6(&r.data).dst, pod6());
}

#[test]
fn ipv6_load_balancer_ips_keep_their_source_ranges_and_two_nodes_agree_on_backends() {
    if !needs!().root().ready() {
        return;
    }
    let backends = v6(&[(remote_pod6(), false), (ip6("fd00:10:244:2::8"), false)]);
    let (_p1, mut a) = node("lb6-maglev-a", Some(node6()));
    let (_p2, mut b) = node("lb6-maglev-b", Some(node2_6()));
    let mut d = wire(lb6().into(), 80, PROTO_TCP, &backends);
    for f in d.values_mut() {
        f.source_ranges = vec![("2001:db8:19::".parse().unwrap(), 48)];
    }
    program(&mut a, &d);
    program(&mut b, &d);
    let mut seen = BTreeSet::new();
    for sport in 42000..42064u16 {
        let req = Ip6::tcp(client6(), sport, lb6(), 80);
        let pa = parse6(&from_uplink(&mut a, &req).data);
        let pb = parse6(&from_uplink(&mut b, &req).data);
        assert_eq!(
            pa.dst, pb.dst,
            "both nodes pick the same backend for {sport}"
        );
        seen.insert(pa.dst);
    }
    assert_eq!(seen.len(), 2, "both backends get flows: {seen:?}");

    let before = a.drop_count(DropReason::LbSourceRange).unwrap();
    let outsider = Ip6::tcp(ip6("2001:db8:99::5"), 42000, lb6(), 80);
    assert_eq!(from_uplink(&mut a, &outsider).verdict, TC_ACT_SHOT);
    assert_eq!(
        a.drop_count(DropReason::LbSourceRange).unwrap(),
        before + 1,
        "an unlisted IPv6 source is refused"
    );
}

#[test]
fn ipv6_never_reaches_an_ipv4_frontend_or_backend() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb6-alias", Some(node6()));
    // An IPv4 NodePort, and an IPv6 one misprogrammed with an IPv4 backend.
    let mut d = wire(
        IpAddr::V4(NODE),
        NODE_PORT,
        PROTO_TCP,
        &[(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 2)), true)],
    );
    d.extend(wire(
        node6().into(),
        NODE_PORT,
        PROTO_TCP,
        &[(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 2)), true)],
    ));
    program(&mut dp, &d);

    // 64:ff9b::198.18.0.11 has the very map key of NODE: never the frontend.
    let alias: Ipv6Addr = "64:ff9b::c612:b".parse().unwrap();
    assert_eq!(
        Addr128::from_v6(alias),
        Addr128::from_v4(NODE),
        "the alias is real"
    );
    for pkt in [
        Ip6::tcp(client6(), 40000, alias, NODE_PORT),
        // nor is a source there ever a client of a frontend of ours
        Ip6::tcp(alias, 40000, lb6(), NODE_PORT),
    ] {
        let frame = pkt.frame(UPLINK_MAC, ROUTER_MAC);
        let r = from_uplink(&mut dp, &pkt);
        assert_eq!(r.verdict, CP_PASS, "{pkt:?} is not a Service's");
        assert_eq!(r.data, frame, "{pkt:?} untouched");
    }
    assert!(no_flow_state(&dp));

    // An IPv6 frontend never sends to an IPv4 backend.
    let before = dp.drop_count(DropReason::LbNoBackend).unwrap();
    let r = from_uplink(&mut dp, &Ip6::tcp(client6(), 40001, node6(), NODE_PORT));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LbNoBackend).unwrap(), before + 1);
    assert!(no_flow_state(&dp));
}

/// A packet's IPv6 header and L4 without its Ethernet header: what an
/// ICMPv6 error quotes.
fn quote(pkt: &Ip6) -> Vec<u8> {
    pkt.frame([0; 6], [0; 6])[14..].to_vec()
}

const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PKT_TOOBIG: u8 = 2;
const PORT_UNREACH: u8 = 4;
const ROUTER6: &str = "2001:db8:19::fe";

fn uplink_error(dp: &mut Datapath, src: Ipv6Addr, dst: Ipv6Addr, quoted: &Ip6) -> Run {
    let f = icmp6_error(
        src,
        dst,
        ICMPV6_PKT_TOOBIG,
        0,
        1280,
        &quote(quoted),
        UPLINK_MAC,
        ROUTER_MAC,
    );
    run(
        dp,
        Program::FromUplink,
        &f,
        Ctx {
            ingress_ifindex: UPLINK_IF,
            ..Ctx::default()
        },
    )
}

#[test]
fn a_packet_too_big_about_an_ipv6_reply_reaches_the_backend_as_about_its_own() {
    if !needs!().root().ready() {
        return;
    }
    // IPv6 routers never fragment: a client whose path MTU is below the
    // backend's learns it only through this error, sent by a router towards
    // the client to the frontend, about the frontend's reply.
    // SCTP's too: the quote's first 8 bytes are its ports and tag.
    for proto in [PROTO_TCP, PROTO_SCTP] {
        let (_pins, mut dp) = node(&format!("lb6-ptb-{proto}"), Some(node6()));
        let mut d = wire(
            node6().into(),
            NODE_PORT,
            proto,
            &v6(&[(remote_pod6(), false)]),
        );
        d.extend(wire(lb6().into(), 80, proto, &v6(&[(pod6(), true)])));
        program(&mut dp, &d);

        // SNATed to a remote backend.
        let req = Ip6::new(client6(), node6(), proto, 40001, NODE_PORT);
        let snat_port = parse6(&from_uplink(&mut dp, &req).data).sport;
        let reply_sent = Ip6::new(node6(), client6(), proto, NODE_PORT, 40001);
        let r = uplink_error(&mut dp, ip6(ROUTER6), node6(), &reply_sent);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "on to the backend's node");
        let e = parse_icmp6(&r.data);
        assert_eq!(e.dst, remote_pod6(), "addressed to the backend");
        assert_eq!(e.src, ip6(ROUTER6), "still from the router");
        assert_eq!(
            (e.quoted_src, e.quoted_sport),
            (remote_pod6(), TARGET),
            "about the backend's own reply"
        );
        assert_eq!(
            (e.quoted_dst, e.quoted_dport),
            (node6(), snat_port),
            "to the SNAT address it answered"
        );
        assert_eq!((e.type_, e.word), (ICMPV6_PKT_TOOBIG, 1280), "the MTU kept");
        assert!(e.csum_ok, "ICMPv6 checksum");
        let enc = dp.test_encap().unwrap().expect("encapsulated");
        assert_eq!(enc.remote, NODE2.octets());

        // The client's own address kept, to a local backend.
        let req = Ip6::new(client6(), lb6(), proto, 41000, 80);
        assert_eq!(parse6(&from_uplink(&mut dp, &req).data).dst, pod6());
        let reply_sent = Ip6::new(lb6(), client6(), proto, 80, 41000);
        let r = uplink_error(&mut dp, ip6(ROUTER6), lb6(), &reply_sent);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the pod");
        let e = parse_icmp6(&r.data);
        assert_eq!(e.dst, pod6());
        assert_eq!((e.quoted_src, e.quoted_sport), (pod6(), TARGET));
        assert_eq!((e.quoted_dst, e.quoted_dport), (client6(), 41000));
        assert!(e.csum_ok, "ICMPv6 checksum");
        let d = dp.test_deliver().unwrap().unwrap();
        assert_eq!((d.ifindex, d.peer), (POD_IF, 1));
    }
}

#[test]
fn an_ipv6_backends_port_unreachable_reaches_the_client_as_the_frontends() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb6-unreach", Some(node6()));
    let mut d = wire(node6().into(), NODE_PORT, PROTO_UDP, &v6(&[(pod6(), true)]));
    d.extend(wire(
        lb6().into(),
        53,
        PROTO_UDP,
        &v6(&[(remote_pod6(), false)]),
    ));
    program(&mut dp, &d);

    // A local pod that does not listen answers the client directly.
    let req = Ip6::udp(client6(), 40000, node6(), NODE_PORT);
    let sent = parse6(&from_uplink(&mut dp, &req).data);
    assert_eq!(sent.dst, pod6());
    let got = Ip6::udp(client6(), 40000, pod6(), TARGET);
    let f = icmp6_error(
        pod6(),
        client6(),
        ICMPV6_DEST_UNREACH,
        PORT_UNREACH,
        0,
        &quote(&got),
        GW_MAC,
        POD_MAC,
    );
    let r = run(
        &mut dp,
        Program::FromPod,
        &f,
        Ctx {
            ingress_ifindex: POD_IF,
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "out to the client");
    let e = parse_icmp6(&r.data);
    assert_eq!(
        (e.src, e.dst),
        (node6(), client6()),
        "from the frontend, as the client's socket expects"
    );
    assert_eq!(
        (e.quoted_src, e.quoted_sport),
        (client6(), 40000),
        "about its own request"
    );
    assert_eq!((e.quoted_dst, e.quoted_dport), (node6(), NODE_PORT));
    assert!(e.csum_ok, "ICMPv6 checksum");
    let dl = dp.test_deliver().unwrap().unwrap();
    assert_eq!((dl.ifindex, dl.peer), (UPLINK_IF, 2));

    // A remote backend's comes back through the overlay to the SNAT address.
    let req = Ip6::udp(client6(), 40002, lb6(), 53);
    let sent = parse6(&from_uplink(&mut dp, &req).data);
    assert_eq!((sent.dst, sent.src), (remote_pod6(), node6()));
    let got = Ip6::udp(node6(), sent.sport, remote_pod6(), TARGET);
    let f = icmp6_error(
        remote_pod6(),
        node6(),
        ICMPV6_DEST_UNREACH,
        PORT_UNREACH,
        0,
        &quote(&got),
        cozyplane_datapath::abi::OVERLAY_MAC,
        [2, 0xcf, 198, 18, 0, 12],
    );
    let r = run(
        &mut dp,
        Program::FromOverlay,
        &f,
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "out to the client");
    let e = parse_icmp6(&r.data);
    assert_eq!((e.src, e.dst), (lb6(), client6()));
    assert_eq!((e.quoted_src, e.quoted_sport), (client6(), 40002));
    assert_eq!((e.quoted_dst, e.quoted_dport), (lb6(), 53));
    assert!(e.csum_ok, "ICMPv6 checksum");
}

#[test]
fn icmpv6_that_is_not_about_a_translated_flow_passes_untouched() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb6-icmp-other", Some(node6()));
    program(
        &mut dp,
        &wire(node6().into(), NODE_PORT, PROTO_TCP, &v6(&[(pod6(), true)])),
    );
    let req = Ip6::tcp(client6(), 40000, node6(), NODE_PORT);
    assert_eq!(parse6(&from_uplink(&mut dp, &req).data).dst, pod6());
    for (src, dst, quoted) in [
        // about a flow nobody translated: the node's own
        (
            ip6(ROUTER6),
            node6(),
            Ip6::tcp(node6(), 22, client6(), 50000),
        ),
        // about the translated flow, but not addressed to the quote's source
        (
            ip6(ROUTER6),
            client6(),
            Ip6::tcp(node6(), NODE_PORT, client6(), 40000),
        ),
    ] {
        let f = icmp6_error(
            src,
            dst,
            ICMPV6_PKT_TOOBIG,
            0,
            1280,
            &quote(&quoted),
            UPLINK_MAC,
            ROUTER_MAC,
        );
        let r = run(
            &mut dp,
            Program::FromUplink,
            &f,
            Ctx {
                ingress_ifindex: UPLINK_IF,
                ..Ctx::default()
            },
        );
        assert_eq!(r.verdict, CP_PASS, "{quoted:?}");
        assert_eq!(r.data, f, "untouched");
    }
}

const POD2_IF: u32 = 11;
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];

fn pod2_6() -> Ipv6Addr {
    ip6("fd00:10:244:1::3")
}
fn vip6() -> Ipv6Addr {
    ip6("fd00:96::10")
}

/// An inside-scope frontend (a ClusterIP) `addr:port` over `backends`.
fn inside(addr: Ipv6Addr, port: u16, proto: u8, backends: &[(Ipv6Addr, bool)]) -> SvcDesired {
    let mut d = SvcDesired::new();
    d.insert(
        SvcKey::new(0, addr.into(), port, proto, SVC_SCOPE_INTERNAL),
        frontend(addr.into(), port, proto, &v6(backends), false),
    );
    d
}

fn from_pod_at(dp: &mut Datapath, ifindex: u32, mac: [u8; 6], frame_of: &Ip6) -> Run {
    run(
        dp,
        Program::FromPod,
        &frame_of.frame(GW_MAC, mac),
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
}

/// A pod's packet to an IPv6 ClusterIP that no socket hook translated (a
/// KubeVirt guest's) is translated per packet, keeps the pod's source, and
/// the backend's reply and port unreachable enter the pod from the Service.
#[test]
fn an_ipv6_cluster_ip_no_socket_hook_saw_is_translated_per_packet_and_reversed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb6-inside", Some(node6()));
    add_local_pod(&mut dp, POD2_IF, pod2_6(), POD2_MAC);
    program(&mut dp, &inside(vip6(), 53, PROTO_UDP, &[(pod2_6(), true)]));

    let req = Ip6::udp(pod6(), 40000, vip6(), 53);
    let r = from_pod(&mut dp, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "to the backend pod");
    let p = parse6(&r.data);
    assert_eq!((p.src, p.sport), (pod6(), 40000), "the pod's own source");
    assert_eq!((p.dst, p.dport), (pod2_6(), TARGET));
    assert!(p.l4_csum_ok);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD2_IF);

    let reply = Ip6::udp(pod2_6(), TARGET, pod6(), 40000);
    let r = from_pod_at(&mut dp, POD2_IF, POD2_MAC, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the client pod");
    let q = parse6(&r.data);
    assert_eq!((q.src, q.sport), (vip6(), 53), "the Service as the source");
    assert_eq!((q.dst, q.dport), (pod6(), 40000));
    assert!(q.l4_csum_ok);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD_IF);

    // the backend's port unreachable about the translated request
    let sent = Ip6::udp(pod6(), 40000, pod2_6(), TARGET);
    let f = icmp6_error(
        pod2_6(),
        pod6(),
        ICMPV6_DEST_UNREACH,
        PORT_UNREACH,
        0,
        &quote(&sent),
        GW_MAC,
        POD2_MAC,
    );
    let r = run(
        &mut dp,
        Program::FromPod,
        &f,
        Ctx {
            ingress_ifindex: POD2_IF,
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the client pod");
    let e = parse_icmp6(&r.data);
    assert_eq!((e.src, e.dst), (vip6(), pod6()), "from the Service");
    assert_eq!((e.quoted_src, e.quoted_sport), (pod6(), 40000));
    assert_eq!((e.quoted_dst, e.quoted_dport), (vip6(), 53));
    assert!(e.csum_ok, "ICMPv6 checksum");

    // pod-to-pod traffic between the two that is no Service reply: as sent
    let other = Ip6::udp(pod2_6(), 9999, pod6(), 40000);
    let q = parse6(&from_pod_at(&mut dp, POD2_IF, POD2_MAC, &other).data);
    assert_eq!((q.src, q.sport), (pod2_6(), 9999));
    // other outside traffic passes untouched
    let out = Ip6::tcp(pod6(), 40002, ip6("2001:db8:443::1"), 443);
    let r = from_pod(&mut dp, &out);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse6(&r.data).dst, ip6("2001:db8:443::1"));
}

/// Hairpin over IPv6: a pod that is its own ClusterIP backend gets its
/// request from the node's IPv6 address, and its answer back from the
/// Service through its host veth; without a node IPv6 address the flow is
/// dropped whole.
#[test]
fn an_ipv6_pod_that_is_its_own_cluster_ip_backend_gets_its_answer_from_the_service() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb6-hairpin", Some(node6()));
    program(&mut dp, &inside(vip6(), 80, PROTO_TCP, &[(pod6(), true)]));
    let req = Ip6::tcp(pod6(), 40000, vip6(), 80);
    let r = from_pod(&mut dp, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "back into the pod");
    let p = parse6(&r.data);
    assert_eq!((p.dst, p.dport), (pod6(), TARGET));
    assert_eq!(
        p.src,
        node6(),
        "from the node, so the answer leaves the pod"
    );
    assert!(p.sport >= SNAT_MIN);
    assert!(p.l4_csum_ok);

    let reply = Ip6::tcp(pod6(), TARGET, node6(), p.sport);
    let r = from_pod(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let q = parse6(&r.data);
    assert_eq!((q.src, q.sport), (vip6(), 80), "the Service as the source");
    assert_eq!((q.dst, q.dport), (pod6(), 40000));
    assert!(q.l4_csum_ok);
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!(
        (d.ifindex, d.peer),
        (POD_IF, 2),
        "out of the pod's host veth"
    );
    // the same reply forged from the wire: never let in
    assert_eq!(from_uplink(&mut dp, &reply).verdict, TC_ACT_SHOT);

    let (_pins, mut dp) = node("lb6-hairpin-noaddr", None);
    program(&mut dp, &inside(vip6(), 80, PROTO_TCP, &[(pod6(), true)]));
    let before = dp.drop_count(DropReason::LbNat).unwrap();
    assert_eq!(from_pod(&mut dp, &req).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LbNat).unwrap(), before + 1);
    assert!(no_flow_state(&dp));
}

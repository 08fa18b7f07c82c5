//! BPF_PROG_TEST_RUN attack tests (issue #10, "attack-surface fixes"): what
//! a pod may not make the datapath do, each dropped and counted by reason.
//! - VXLAN injection: pod traffic to the overlay port never reaches a node's
//!   VXLAN socket and never leaves masqueraded as node-sourced VXLAN;
//! - untranslatable pod traffic (fragments, IP options, other protocols) is
//!   dropped at the masquerade instead of leaving with the pod's source;
//! - IPv6 link scope is ND/MLD with the host veth only, and an IPv6 address
//!   in 64:ff9b::/96 never passes for an IPv4 pod's or node's key.
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Params, Port, Remote, OVERLAY_MAC,
    VNI_DEFAULT, VTEP_F_NODE, VXLAN_PORT,
};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const POD2_IF: u32 = 11;
const VXLAN_IF: u32 = 5;
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
/// This node: tunnel endpoint and masquerade address.
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
/// Another node's address this node's topology does not list (a second NIC,
/// a NAT, a host that reflects): reached through the uplink, masqueraded.
const UNLISTED: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 99);
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];
const POD_V6: &str = "fd00:10:244:1::2";
const REMOTE_V6: &str = "fd00:10:244:2::7";

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// A node (NODE) with two local pods (also POD on IPv6), remote pods on NODE2,
/// NODE and NODE2 in node_remotes, NODE2 a known sender, and the masquerade
/// on (NODE, ports 61000-65535, pod CIDR 10.244.0.0/16).
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        masq_ip: NODE.octets(),
        masq_port_min: 61000,
        masq_port_max: 65535,
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip, mac) in [(POD_IF, POD, POD_MAC), (POD2_IF, POD2, POD2_MAC)] {
        add_local_pod(&mut dp, ifindex, ip, mac);
    }
    dp.locals
        .insert(
            &EpKey::new(0, IpAddr::V6(v6(POD_V6))),
            &Endpoint {
                ifindex: POD_IF,
                mac: POD_MAC,
                flags: 0,
            },
        )
        .unwrap();
    for (net, len) in [("10.244.2.0", 24), ("fd00:10:244:2::", 64)] {
        let k = lpm_key(0, net.parse().unwrap(), len).unwrap();
        dp.remotes.insert(&k, &Remote::new(NODE2)).unwrap();
    }
    for n in [NODE, NODE2] {
        dp.node_remotes
            .insert(&Addr128::from_v4(n), &Remote::new(n))
            .unwrap();
    }
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    let pods = lpm_key(0, "10.244.0.0".parse().unwrap(), 16).unwrap();
    dp.masq_srcs.insert(&pods, &1).unwrap();
    dp.internal.insert(&pods, &1).unwrap();
    (pins, dp)
}

fn from_pod_frame(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(
        dp,
        Program::FromPod,
        frame,
        Ctx {
            ingress_ifindex: POD_IF,
            ..Ctx::default()
        },
    )
}

fn from_pod(dp: &mut Datapath, pkt: &Ip4) -> Run {
    from_pod_frame(dp, &pkt.frame(GW_MAC, POD_MAC))
}

fn to_uplink_frame(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(dp, Program::ToUplink, frame, Ctx::default())
}

fn to_uplink(dp: &mut Datapath, pkt: &Ip4) -> Run {
    to_uplink_frame(dp, &pkt.frame(ROUTER_MAC, UPLINK_MAC))
}

/// `frame` decapsulated from NODE2 (a known sender) on VNI 1.
fn from_overlay_frame(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(
        dp,
        Program::FromOverlay,
        frame,
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

fn from_overlay(dp: &mut Datapath, pkt: &Ip4) -> Run {
    from_overlay_frame(dp, &pkt.frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]))
}

fn drops(dp: &Datapath, reason: DropReason) -> u64 {
    dp.drop_count(reason).unwrap()
}

#[test]
fn a_pod_cannot_send_to_any_nodes_overlay_port() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vxlan_node");
    // another node's listed address (encapsulated to it otherwise), this
    // node's own, and one the topology does not list (masqueraded otherwise)
    for (i, dst) in [NODE2, NODE, UNLISTED].into_iter().enumerate() {
        let r = from_pod(&mut dp, &Ip4::udp(POD, 40000, dst, VXLAN_PORT));
        assert_eq!(r.verdict, TC_ACT_SHOT, "pod -> {dst}:4789");
        assert_eq!(drops(&dp, DropReason::OverlayPort), i as u64 + 1);
    }
    // a first fragment carries the port: dropped too; a later one has none
    // (the masquerade drops it, see below) and its first never left
    let first = with_frag(
        Ip4::udp(POD, 40000, UNLISTED, VXLAN_PORT).frame(GW_MAC, POD_MAC),
        0x2000,
    );
    assert_eq!(from_pod_frame(&mut dp, &first).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 4);
    // IP options do not hide the port
    let opts = with_ip_options(
        Ip4::udp(POD, 40000, NODE2, VXLAN_PORT).frame(GW_MAC, POD_MAC),
        &[1, 1, 1, 0],
    );
    assert_eq!(from_pod_frame(&mut dp, &opts).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 5);

    // any other port to a node or the outside: as before
    let r = from_pod(&mut dp, &Ip4::udp(POD, 40000, NODE2, VXLAN_PORT + 1));
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "encapsulated to NODE2");
    let r = from_pod(&mut dp, &Ip4::udp(POD, 40000, UNLISTED, 53));
    assert_eq!(r.verdict, CP_PASS);
    let r = from_pod(&mut dp, &Ip4::tcp(POD, 40000, NODE, VXLAN_PORT));
    assert_eq!(r.verdict, CP_PASS, "TCP 4789 is no VXLAN");
    assert_eq!(drops(&dp, DropReason::OverlayPort), 5);
}

#[test]
fn the_masquerade_never_turns_pod_traffic_into_node_sourced_vxlan() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vxlan_masq");
    // what reaches the uplink after the kernel's own decisions (a Service
    // DNAT to some node's 4789 is never seen by from_pod as such)
    let r = to_uplink(&mut dp, &Ip4::udp(POD, 40000, UNLISTED, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 1);
    assert!(
        dp.masq_fwd.entries().unwrap().is_empty(),
        "no translation was set up for it"
    );

    // the next port is masqueraded as usual
    let r = to_uplink(&mut dp, &Ip4::udp(POD, 40000, UNLISTED, VXLAN_PORT + 1));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse(&r.data).src, NODE);
    // the node's own VXLAN leaves untouched
    let own = Ip4::udp(NODE, 50000, NODE2, VXLAN_PORT).frame(ROUTER_MAC, UPLINK_MAC);
    let r = to_uplink_frame(&mut dp, &own);
    assert_eq!((r.verdict, r.data), (CP_PASS, own));
    assert_eq!(drops(&dp, DropReason::OverlayPort), 1);
}

#[test]
fn pods_may_run_vxlan_between_themselves() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vxlan_pods");
    // nested overlays (VMs running their own VXLAN) are pod to pod
    let r = from_pod(&mut dp, &Ip4::udp(POD, 40000, REMOTE_POD, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_encap().unwrap().unwrap().remote, NODE2.octets());
    let r = from_pod(&mut dp, &Ip4::udp(POD, 40000, POD2, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &POD2_MAC);
    let r = from_overlay(&mut dp, &Ip4::udp(REMOTE_POD, 40000, POD2, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "delivered into POD2");
    assert_eq!(drops(&dp, DropReason::OverlayPort), 0);
}

#[test]
fn a_tunnel_inside_the_tunnel_never_reaches_the_nodes_vxlan_socket() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vxlan_nested");
    // From a known node, for this node's own overlay port: the kernel would
    // decapsulate it again with an outer source the sender's pod chose.
    let r = from_overlay(&mut dp, &Ip4::udp(REMOTE_POD, 40000, NODE, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 1);
    // the node's other ports: handed to the kernel as before
    let r = from_overlay(&mut dp, &Ip4::udp(REMOTE_POD, 40000, NODE, 53));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 1);
}

#[test]
fn untranslatable_pod_traffic_is_dropped_and_counted_not_leaked() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq_untranslatable");
    let peer = Ipv4Addr::new(93, 184, 216, 34);
    let udp = || Ip4::udp(POD, 40000, peer, 443).frame(ROUTER_MAC, UPLINK_MAC);

    // fragments: the first (MF) and a later one (offset 185 * 8 bytes)
    for (i, frag) in [0x2000u16, 185].into_iter().enumerate() {
        let r = to_uplink_frame(&mut dp, &with_frag(udp(), frag));
        assert_eq!(r.verdict, TC_ACT_SHOT, "fragment {frag:#x}");
        assert_eq!(drops(&dp, DropReason::MasqFragment), i as u64 + 1);
    }
    // IP options (NOP, NOP, NOP, end of list)
    let r = to_uplink_frame(&mut dp, &with_ip_options(udp(), &[1, 1, 1, 0]));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::MasqIpOptions), 1);
    // a protocol the masquerade does not translate (GRE), and ICMP other
    // than an echo request (a pod's own destination-unreachable, an echo reply)
    let gre = Ip4 {
        proto: 47,
        ..Ip4::udp(POD, 0, peer, 0)
    };
    let unreach = Ip4 {
        icmp_type: 3,
        ..Ip4::icmp_echo(POD, peer, 7, false)
    };
    let reply = Ip4::icmp_echo(POD, peer, 7, true);
    for (i, pkt) in [gre, unreach, reply].iter().enumerate() {
        assert_eq!(to_uplink(&mut dp, pkt).verdict, TC_ACT_SHOT, "{pkt:?}");
        assert_eq!(drops(&dp, DropReason::MasqProto), i as u64 + 1);
    }
    assert!(dp.masq_fwd.entries().unwrap().is_empty());

    // what is not masqueraded is not the masquerade's to drop: a fragment to
    // a cluster-internal address, or from the node itself
    let internal = with_frag(
        Ip4::udp(POD, 40000, REMOTE_POD, 443).frame(ROUTER_MAC, UPLINK_MAC),
        0x2000,
    );
    assert_eq!(to_uplink_frame(&mut dp, &internal).verdict, CP_PASS);
    let own = with_frag(
        Ip4::udp(NODE, 40000, peer, 443).frame(ROUTER_MAC, UPLINK_MAC),
        0x2000,
    );
    assert_eq!(to_uplink_frame(&mut dp, &own).verdict, CP_PASS);
    // and a plain datagram is translated as ever
    let r = to_uplink_frame(&mut dp, &udp());
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse(&r.data).src, NODE);
    assert_eq!(drops(&dp, DropReason::MasqFragment), 2);
}

#[test]
fn ipv6_link_scope_from_a_pod_is_nd_and_mld_with_its_host_only() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("v6_link_scope");
    let ll = v6("fe80::a858:aff:fef4:102");
    let own = v6(POD_V6);
    let solicited_gw = v6("ff02::1:ff00:1");

    // what neighbour discovery and MLD need: passed to the kernel
    let allowed = [
        // neighbour solicitation for the gateway, from the link-local address
        ip6_frame(ll, solicited_gw, PROTO_ICMPV6, &icmp6(135)),
        // DAD from the unspecified address
        ip6_frame(
            Ipv6Addr::UNSPECIFIED,
            solicited_gw,
            PROTO_ICMPV6,
            &icmp6(135),
        ),
        // router solicitation
        ip6_frame(ll, v6("ff02::2"), PROTO_ICMPV6, &icmp6(133)),
        // neighbour advertisement to the gateway, and unicast NUD probe
        ip6_frame(ll, v6("fe80::1"), PROTO_ICMPV6, &icmp6(136)),
        ip6_frame(own, v6("fe80::1"), PROTO_ICMPV6, &icmp6(135)),
        // NS from the pod's own global address
        ip6_frame(own, solicited_gw, PROTO_ICMPV6, &icmp6(135)),
        // MLDv2 report behind its hop-by-hop router alert
        ip6_frame(
            ll,
            v6("ff02::16"),
            PROTO_HOPOPTS,
            &hop_by_hop(PROTO_ICMPV6, &icmp6(143)),
        ),
    ];
    for f in &allowed {
        assert_eq!(from_pod_frame(&mut dp, f).verdict, CP_PASS, "{f:02x?}");
    }
    assert_eq!(drops(&dp, DropReason::LinkScope), 0);

    // everything else with link scope: dropped and counted
    let denied = [
        // UDP from the link-local address (to multicast, to the host, to a pod)
        ip6_frame(ll, solicited_gw, PROTO_UDP, &udp6(5000, 5000)),
        ip6_frame(ll, v6("fe80::1"), PROTO_UDP, &udp6(5000, 22)),
        ip6_frame(ll, v6(REMOTE_V6), PROTO_UDP, &udp6(5000, 80)),
        // the pod's own address to the host's link-local address
        ip6_frame(own, v6("fe80::1"), PROTO_TCP, &udp6(5000, 22)),
        // mDNS, and a site-scope multicast group
        ip6_frame(own, v6("ff02::fb"), PROTO_UDP, &udp6(5353, 5353)),
        ip6_frame(own, v6("ff05::1:3"), PROTO_ICMPV6, &icmp6(135)),
        // a pod posing as a router: router advertisement, redirect
        ip6_frame(ll, v6("ff02::1"), PROTO_ICMPV6, &icmp6(134)),
        ip6_frame(ll, v6("fe80::1"), PROTO_ICMPV6, &icmp6(137)),
        // echo request to all nodes, an MLD query
        ip6_frame(ll, v6("ff02::1"), PROTO_ICMPV6, &icmp6(128)),
        ip6_frame(
            ll,
            v6("ff02::1"),
            PROTO_HOPOPTS,
            &hop_by_hop(PROTO_ICMPV6, &icmp6(130)),
        ),
    ];
    for (i, f) in denied.iter().enumerate() {
        assert_eq!(from_pod_frame(&mut dp, f).verdict, TC_ACT_SHOT, "{f:02x?}");
        assert_eq!(drops(&dp, DropReason::LinkScope), i as u64 + 1);
    }

    // a multicast destination does not waive RPF for a global source
    let spoofed = ip6_frame(
        v6("fd00:10:244:1::99"),
        solicited_gw,
        PROTO_ICMPV6,
        &icmp6(135),
    );
    assert_eq!(from_pod_frame(&mut dp, &spoofed).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Rpf), 1);

    // link scope never crosses nodes: dropped when it comes decapsulated
    let mut nd = ip6_frame(ll, solicited_gw, PROTO_ICMPV6, &icmp6(135));
    nd[..6].copy_from_slice(&OVERLAY_MAC);
    assert_eq!(from_overlay_frame(&mut dp, &nd).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::LinkScope), denied.len() as u64 + 1);
}

/// `64:ff9b::a.b.c.d`, the IPv6 address whose key is IPv4 a.b.c.d's.
fn nat64(v4: Ipv4Addr) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o[..4].copy_from_slice(&[0x00, 0x64, 0xff, 0x9b]);
    o[12..].copy_from_slice(&v4.octets());
    Ipv6Addr::from(o)
}

#[test]
fn ipv6_in_the_nat64_prefix_never_passes_for_an_ipv4_key() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("v6_nat64");
    let own = v6(POD_V6);

    // the pod's own IPv4 address in its IPv6 form is not its source
    let f = ip6_frame(nat64(POD), v6(REMOTE_V6), PROTO_UDP, &udp6(5000, 80));
    assert_eq!(from_pod_frame(&mut dp, &f).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Rpf), 1);

    // 64:ff9b::/96 destinations are a NAT64 gateway's: not a local pod,
    // a remote pod or a node, whose IPv4 keys they share
    for dst in [POD2, REMOTE_POD, NODE2] {
        let f = ip6_frame(own, nat64(dst), PROTO_UDP, &udp6(5000, 80));
        let r = from_pod_frame(&mut dp, &f);
        assert_eq!((r.verdict, r.data), (CP_PASS, f), "to {}", nat64(dst));
    }
    assert_eq!(dp.test_encap().unwrap(), None, "nothing encapsulated");
    assert_eq!(dp.test_deliver().unwrap(), None, "nothing delivered");
    // ... and their overlay port is no pod's either
    let f = ip6_frame(own, nat64(NODE2), PROTO_UDP, &udp6(5000, VXLAN_PORT));
    assert_eq!(from_pod_frame(&mut dp, &f).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::OverlayPort), 1);

    // decapsulated: not delivered into the IPv4 pod, and a 64:ff9b:: source
    // is never learned as an IPv4 pod's location
    let mut f = ip6_frame(
        nat64(Ipv4Addr::new(10, 244, 3, 50)),
        nat64(POD2),
        PROTO_UDP,
        &udp6(5000, 80),
    );
    f[..6].copy_from_slice(&OVERLAY_MAC);
    assert_eq!(from_overlay_frame(&mut dp, &f).verdict, CP_PASS);
    assert_eq!(dp.test_deliver().unwrap(), None);
    assert!(dp.learned.entries().unwrap().is_empty());

    // routed by the kernel into a pod's veth: the gate refuses it
    // (test_run runs on loopback, ifindex 1: make it a pod veth)
    dp.ports.insert(&1, &Port { net: 0, flags: 0 }).unwrap();
    let lo_pod = Ipv4Addr::new(10, 244, 1, 50);
    dp.locals
        .insert(
            &EpKey::new(0, lo_pod),
            &Endpoint {
                ifindex: 1,
                mac: POD_MAC,
                flags: 0,
            },
        )
        .unwrap();
    let f = ip6_frame(v6(REMOTE_V6), nat64(lo_pod), PROTO_UDP, &udp6(80, 5000));
    assert_eq!(
        run(&mut dp, Program::ToPod, &f, Ctx::default()).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(drops(&dp, DropReason::Misdelivered), 1);
    let ok = Ip4::udp(REMOTE_POD, 80, lo_pod, 5000).frame(POD_MAC, GW_MAC);
    assert_eq!(
        run(&mut dp, Program::ToPod, &ok, Ctx::default()).verdict,
        CP_PASS
    );
}

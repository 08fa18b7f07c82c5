//! BPF_PROG_TEST_RUN attack tests (issue #10, "attack-surface fixes"): what
//! a pod may not make the datapath do, each dropped and counted by reason.
//! - VXLAN injection: pod traffic to the overlay port never reaches a node's
//!   VXLAN socket and never leaves masqueraded as node-sourced VXLAN;
//! - untranslatable pod traffic (fragments, IP options, other protocols) is
//!   dropped at the masquerade instead of leaving with the pod's source.
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Params, Remote, OVERLAY_MAC,
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

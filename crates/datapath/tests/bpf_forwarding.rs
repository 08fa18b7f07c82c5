//! BPF_PROG_TEST_RUN tests of from_pod, to_pod and from_overlay on crafted
//! frames: RPF, same-node redirect, cross-node encapsulation, VNI checks.
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Params, Port, Remote, TestDeliver,
    MARK_ENCAP, OVERLAY_MAC, PARAM_F_DELIVER_EGRESS, PARAM_F_KERNEL_LOCAL, VNI_DEFAULT,
    VTEP_F_NODE,
};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const POD2_IF: u32 = 11;
const VXLAN_IF: u32 = 5;
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];

/// A node with two local pods on net 0, a remote /24 on NODE2, NODE2's
/// own address in node_remotes and its tunnel endpoint in vteps.
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip, mac) in [(POD_IF, POD, POD_MAC), (POD2_IF, POD2, POD2_MAC)] {
        add_local_pod(&mut dp, ifindex, ip, mac);
    }
    let cidr = lpm_key(0, "10.244.2.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
    dp.node_remotes
        .insert(&Addr128::from_v4(NODE2), &Remote::new(NODE2))
        .unwrap();
    dp.node_remotes
        .insert(&Addr128::from_v4(NODE), &Remote::new(NODE))
        .unwrap();
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    (pins, dp)
}

fn from_pod(dp: &mut Datapath, ifindex: u32, pkt: &Ip4) -> Run {
    let frame = pkt.frame(GW_MAC, POD_MAC);
    run(
        dp,
        Program::FromPod,
        &frame,
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
}

#[test]
fn rpf_drops_a_spoofed_source_and_counts_it() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("rpf");
    // an address nobody owns
    let spoofed = Ip4::tcp(Ipv4Addr::new(10, 244, 1, 99), 1234, POD2, 80);
    assert_eq!(from_pod(&mut dp, POD_IF, &spoofed).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 1);
    // the neighbour pod's address, sent from our veth
    let stolen = Ip4::udp(POD2, 53, REMOTE_POD, 53);
    assert_eq!(from_pod(&mut dp, POD_IF, &stolen).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 2);
    // the right address on the wrong network is not ours either
    dp.ports
        .insert(&POD_IF, &Port { net: 7, flags: 0 })
        .unwrap();
    let own = Ip4::tcp(POD, 1234, POD2, 80);
    assert_eq!(from_pod(&mut dp, POD_IF, &own).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 3);
}

#[test]
fn unknown_veth_is_dropped_and_arp_passes() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("noport");
    let pkt = Ip4::tcp(POD, 1234, POD2, 80);
    assert_eq!(from_pod(&mut dp, 99, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoPort).unwrap(), 1);

    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&POD_MAC);
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&POD_MAC);
    arp.extend_from_slice(&POD.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[169, 254, 1, 1]);
    let r = run(
        &mut dp,
        Program::FromPod,
        &arp,
        Ctx {
            ingress_ifindex: POD_IF,
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, arp);
}

#[test]
fn same_node_pod_is_redirected_to_its_veth_with_its_mac() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("local");
    let pkt = Ip4::tcp(POD, 40000, POD2, 80);
    let frame = pkt.frame(GW_MAC, POD_MAC);
    let r = from_pod(&mut dp, POD_IF, &pkt);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &POD2_MAC, "dst MAC rewritten to the pod's");
    assert_eq!(&r.data[6..], &frame[6..], "nothing else changed");
    assert_eq!(dp.test_encap().unwrap(), None, "no encapsulation");
    assert_eq!(
        dp.test_deliver().unwrap(),
        Some(TestDeliver {
            ifindex: POD2_IF,
            peer: 1,
            count: 1,
            pad: 0
        }),
        "straight into the pod with bpf_redirect_peer, past the inline gate"
    );

    // the debugging switch: via the host veth's egress (to_pod runs there)
    let mut cfg = dp.params().unwrap();
    cfg.flags |= PARAM_F_DELIVER_EGRESS;
    dp.set_params(&cfg).unwrap();
    let r = from_pod(&mut dp, POD_IF, &pkt);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &POD2_MAC);
    let d = dp.test_deliver().unwrap().expect("delivered");
    assert_eq!((d.ifindex, d.peer, d.count), (POD2_IF, 0, 2));

    // with an iptables kube-proxy the kernel must carry it instead
    cfg.flags = PARAM_F_KERNEL_LOCAL;
    dp.set_params(&cfg).unwrap();
    let r = from_pod(&mut dp, POD_IF, &pkt);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, frame);
    assert_eq!(dp.test_deliver().unwrap().map(|d| d.count), Some(2));
}

/// A stale `cp_locals` entry pointing at a veth that is not that pod's
/// port on this network: the inline destination gate (the one to_pod
/// runs) must stop the packet before `bpf_redirect_peer`, count it, and
/// leave it unmodified.
fn assert_gate_drops(dp: &mut Datapath, run_it: &dyn Fn(&mut Datapath) -> Run, what: &str) {
    let before = dp.drop_count(DropReason::Misdelivered).unwrap();
    let delivered = dp.test_deliver().unwrap().map_or(0, |d| d.count);
    let r = run_it(dp);
    assert_eq!(r.verdict, TC_ACT_SHOT, "{what}: dropped");
    assert_eq!(
        dp.drop_count(DropReason::Misdelivered).unwrap(),
        before + 1,
        "{what}: counted as misdelivered"
    );
    assert_eq!(
        dp.test_deliver().unwrap().map_or(0, |d| d.count),
        delivered,
        "{what}: never redirected"
    );
    assert_ne!(&r.data[..6], &POD2_MAC, "{what}: not rewritten for the pod");
}

#[test]
fn inline_destination_gate_stops_misdelivery_before_redirect_peer() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("gate");
    let same_node = |dp: &mut Datapath| from_pod(dp, POD_IF, &Ip4::tcp(POD, 40000, POD2, 80));
    let cross_node =
        |dp: &mut Datapath| from_overlay(dp, VNI_DEFAULT, &Ip4::tcp(REMOTE_POD, 80, POD2, 40000));

    // the gate admits the healthy case on both paths
    assert_eq!(same_node(&mut dp).verdict, TC_ACT_REDIRECT);
    assert_eq!(cross_node(&mut dp).verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_deliver().unwrap().map(|d| d.count), Some(2));

    // POD2's veth now belongs to another network (ifindex reused, or a
    // stale entry): a net-0 packet must not enter it
    dp.ports
        .insert(&POD2_IF, &Port { net: 7, flags: 0 })
        .unwrap();
    assert_gate_drops(&mut dp, &same_node, "same node, port on another net");
    assert_gate_drops(&mut dp, &cross_node, "cross node, port on another net");
    // ... even if that network has an endpoint of the same address there
    dp.locals
        .insert(
            &EpKey::new(7, POD2),
            &Endpoint {
                ifindex: POD2_IF,
                mac: POD2_MAC,
                flags: 0,
            },
        )
        .unwrap();
    assert_gate_drops(&mut dp, &same_node, "same node, network crossing");
    assert_gate_drops(&mut dp, &cross_node, "cross node, network crossing");

    // the endpoint points at a veth that is no pod port at all
    dp.locals
        .insert(
            &EpKey::new(0, POD2),
            &Endpoint {
                ifindex: 42,
                mac: POD2_MAC,
                flags: 0,
            },
        )
        .unwrap();
    assert_gate_drops(&mut dp, &same_node, "same node, no port");
    assert_gate_drops(&mut dp, &cross_node, "cross node, no port");

    // repaired: delivered again, into the right veth
    dp.ports
        .insert(&POD2_IF, &Port { net: 0, flags: 0 })
        .unwrap();
    dp.locals
        .insert(
            &EpKey::new(0, POD2),
            &Endpoint {
                ifindex: POD2_IF,
                mac: POD2_MAC,
                flags: 0,
            },
        )
        .unwrap();
    assert_eq!(cross_node(&mut dp).verdict, TC_ACT_REDIRECT);
    let d = dp.test_deliver().unwrap().expect("delivered");
    assert_eq!((d.ifindex, d.peer, d.count), (POD2_IF, 1, 3));
}

#[test]
fn cross_node_pod_is_encapsulated_to_its_node() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("encap");
    let pkt = Ip4::udp(POD, 5353, REMOTE_POD, 53);
    let frame = pkt.frame(GW_MAC, POD_MAC);
    let r = from_pod(&mut dp, POD_IF, &pkt);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(
        &r.data[..6],
        &OVERLAY_MAC,
        "inner dst MAC is the shared overlay MAC"
    );
    assert_eq!(&r.data[6..], &frame[6..]);
    let enc = dp.test_encap().unwrap().expect("encapsulation recorded");
    assert_eq!(enc.vni, VNI_DEFAULT);
    assert_eq!(enc.remote, NODE2.octets());
    assert_eq!(
        enc.key_remote,
        u32::from(NODE2),
        "the helper gets host order"
    );
    assert_eq!(
        enc.key_local,
        u32::from(NODE),
        "the outer source is pinned to this node's tunnel endpoint"
    );
    assert_eq!(enc.ifindex, VXLAN_IF);
    assert_eq!(enc.count, 1);
    assert_eq!(r.mark & MARK_ENCAP, MARK_ENCAP, "marked for to_overlay");
}

fn to_overlay(dp: &mut Datapath, mark: u32, pkt: &Ip4) -> Run {
    let frame = pkt.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    run(
        dp,
        Program::ToOverlay,
        &frame,
        Ctx {
            mark,
            ..Ctx::default()
        },
    )
}

#[test]
fn to_overlay_encapsulates_node_traffic_and_passes_pod_traffic_through() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tooverlay");
    // from_pod already set the key: only the mark is cleared
    let pkt = Ip4::tcp(POD, 40000, REMOTE_POD, 80);
    let r = to_overlay(&mut dp, MARK_ENCAP | 0x1, &pkt);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.mark, 0x1, "only our bit is cleared");
    assert_eq!(r.data, pkt.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]));
    assert_eq!(dp.test_encap().unwrap(), None);

    // the node's own packet to a remote pod
    let node_pkt = Ip4::tcp(NODE, 40000, REMOTE_POD, 80);
    let r = to_overlay(&mut dp, 0, &node_pkt);
    assert_eq!(r.verdict, CP_PASS, "the overlay device transmits it");
    assert_eq!(&r.data[..6], &OVERLAY_MAC);
    // not the shared MAC as source: the receiver would drop it as a loop
    assert_eq!(&r.data[6..12], &[0x02, 0xcf, 10, 250, 0, 1]);
    let enc = dp.test_encap().unwrap().expect("encapsulated");
    assert_eq!(
        (enc.vni, enc.remote, enc.ifindex),
        (VNI_DEFAULT, NODE2.octets(), 0)
    );
    assert_eq!(enc.key_local, u32::from(NODE), "outer source pinned");

    // nobody owns it: dropped rather than sent without a tunnel key
    let lost = Ip4::tcp(NODE, 40000, Ipv4Addr::new(10, 244, 9, 9), 80);
    assert_eq!(to_overlay(&mut dp, 0, &lost).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoRemote).unwrap(), 1);
}

#[test]
fn pod_to_node_is_encapsulated_only_towards_other_nodes() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("podnode");
    let r = from_pod(&mut dp, POD_IF, &Ip4::tcp(POD, 40000, NODE2, 10250));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let enc = dp.test_encap().unwrap().expect("encapsulated");
    assert_eq!((enc.remote, enc.count), (NODE2.octets(), 1));

    // this node's own address: the kernel delivers it
    let r = from_pod(&mut dp, POD_IF, &Ip4::tcp(POD, 40000, NODE, 10250));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(dp.test_encap().unwrap().map(|e| e.count), Some(1));
}

#[test]
fn outside_destination_goes_to_the_kernel_unchanged() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("outside");
    let pkt = Ip4::tcp(POD, 40000, Ipv4Addr::new(1, 1, 1, 1), 443);
    let r = from_pod(&mut dp, POD_IF, &pkt);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, pkt.frame(GW_MAC, POD_MAC));
}

#[test]
fn encap_without_overlay_device_configured_is_dropped() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("noconfig");
    dp.set_params(&Params::default()).unwrap();
    let r = from_pod(&mut dp, POD_IF, &Ip4::udp(POD, 1, REMOTE_POD, 2));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoConfig).unwrap(), 1);
}

/// A packet decapsulated from NODE2 (a known tunnel endpoint).
fn from_overlay(dp: &mut Datapath, vni: u32, pkt: &Ip4) -> Run {
    from_overlay_via(dp, vni, NODE2, pkt)
}

/// A packet decapsulated with outer source `sender`: the test build reads
/// the VNI from `cb[0]` and the sender, host order, from `cb[1]`.
fn from_overlay_via(dp: &mut Datapath, vni: u32, sender: Ipv4Addr, pkt: &Ip4) -> Run {
    let frame = pkt.frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]);
    run(
        dp,
        Program::FromOverlay,
        &frame,
        Ctx {
            cb: [vni, u32::from(sender), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

#[test]
fn from_overlay_drops_forged_or_missing_vni() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vni");
    let pkt = Ip4::tcp(REMOTE_POD, 80, POD, 40000);
    assert_eq!(from_overlay(&mut dp, 4242, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVni).unwrap(), 1);
    // VNI 0 stands for "no tunnel metadata" in the test build
    assert_eq!(from_overlay(&mut dp, 0, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoTunnelKey).unwrap(), 1);
    // a served non-default network without that pod: dropped, never routed
    // (its source must be a Port of that VPC on the sender: bpf_vpc.rs)
    dp.vnis.insert(&100, &100).unwrap();
    let src = lpm_key(100, REMOTE_POD.into(), 32).unwrap();
    dp.remotes.insert(&src, &Remote::new(NODE2)).unwrap();
    assert_eq!(from_overlay(&mut dp, 100, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoEndpoint).unwrap(), 1);
}

#[test]
fn from_overlay_delivers_local_pods_and_hands_node_traffic_to_the_kernel() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("decap");
    let pkt = Ip4::tcp(REMOTE_POD, 80, POD2, 40000);
    let r = from_overlay(&mut dp, VNI_DEFAULT, &pkt);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &POD2_MAC);
    let d = dp.test_deliver().unwrap().expect("delivered");
    assert_eq!(
        (d.ifindex, d.peer),
        (POD2_IF, 1),
        "into the pod with bpf_redirect_peer"
    );

    let to_node = Ip4::tcp(REMOTE_POD, 80, NODE, 40000);
    let r = from_overlay(&mut dp, VNI_DEFAULT, &to_node);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(
        &r.data[..6],
        &OVERLAY_MAC,
        "still addressed to the overlay device"
    );

    // With an iptables kube-proxy, a remote backend's reply to a local pod's
    // ClusterIP flow must pass the kernel's conntrack (the DNAT was made on
    // this node): handed to the kernel unchanged, not redirected.
    let mut cfg = dp.params().unwrap();
    cfg.flags |= PARAM_F_KERNEL_LOCAL;
    dp.set_params(&cfg).unwrap();
    let delivered = dp.test_deliver().unwrap().map(|d| d.count);
    let frame = pkt.frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]);
    let r = from_overlay(&mut dp, VNI_DEFAULT, &pkt);
    assert_eq!(
        r.verdict, CP_PASS,
        "to the kernel, which routes it to the veth"
    );
    assert_eq!(r.data, frame, "unchanged");
    assert_eq!(dp.test_deliver().unwrap().map(|d| d.count), delivered);
}

#[test]
fn to_pod_admits_only_the_pods_own_address() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("topod");
    // test_run runs on loopback (ifindex 1): make it a pod veth
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
    let ok = Ip4::tcp(REMOTE_POD, 80, lo_pod, 40000).frame(POD_MAC, GW_MAC);
    assert_eq!(
        run(&mut dp, Program::ToPod, &ok, Ctx::default()).verdict,
        CP_PASS
    );
    let wrong = Ip4::tcp(REMOTE_POD, 80, POD2, 40000).frame(POD_MAC, GW_MAC);
    assert_eq!(
        run(&mut dp, Program::ToPod, &wrong, Ctx::default()).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(dp.drop_count(DropReason::Misdelivered).unwrap(), 1);
}

/// An Ethernet/IPv6/UDP frame from a pod (checksums are not looked at on this path).
fn ip6_udp(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr) -> Vec<u8> {
    ip6_frame(src, dst, PROTO_UDP, &udp6(5000, 53))
}

#[test]
fn ipv6_gets_the_same_rpf_and_forwarding_with_link_local_left_to_the_kernel() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("ipv6");
    let own: std::net::Ipv6Addr = "fd00:10:244:1::2".parse().unwrap();
    dp.locals
        .insert(
            &EpKey::new(0, std::net::IpAddr::V6(own)),
            &Endpoint {
                ifindex: POD_IF,
                mac: POD_MAC,
                flags: 0,
            },
        )
        .unwrap();
    let remote_net = lpm_key(0, "fd00:10:244:2::".parse().unwrap(), 64).unwrap();
    dp.remotes.insert(&remote_net, &Remote::new(NODE2)).unwrap();
    let ctx = Ctx {
        ingress_ifindex: POD_IF,
        ..Ctx::default()
    };
    let remote: std::net::Ipv6Addr = "fd00:10:244:2::7".parse().unwrap();

    let spoofed = ip6_udp("fd00:10:244:1::99".parse().unwrap(), remote);
    assert_eq!(
        run(&mut dp, Program::FromPod, &spoofed, ctx).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 1);

    // neighbour discovery (a solicitation for the gateway) is the kernel's;
    // what else link scope may carry is in bpf_attack.rs
    let ndp = ip6_frame(
        "fe80::1234".parse().unwrap(),
        "ff02::1:ff00:1".parse().unwrap(),
        PROTO_ICMPV6,
        &icmp6(135),
    );
    assert_eq!(run(&mut dp, Program::FromPod, &ndp, ctx).verdict, CP_PASS);

    let r = run(&mut dp, Program::FromPod, &ip6_udp(own, remote), ctx);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &OVERLAY_MAC);
    let enc = dp.test_encap().unwrap().expect("encapsulated");
    assert_eq!(
        enc.remote,
        NODE2.octets(),
        "IPv6 inner rides the IPv4 underlay"
    );
}

//! BPF_PROG_TEST_RUN tests of VPC tenancy in the datapath (issue #10): a VPC
//! pod reaches its own VPC's endpoints and nothing else, cross-node VPC
//! traffic is checked on receipt (VNI, sender, source Port), the kernel's
//! path into a VPC port is closed, a quarantined (severed) port sends and
//! receives nothing, and VPC traffic is metered per network. Each refusal is
//! dropped and counted by reason, globally and for the VPC.
//!
//! The node: this node NODE; VPC A (net = VNI 100) with pods A1, A2 here and
//! A3 on NODE2; its twin VPC B (net 101, the same CIDR) with B1 here at A1's
//! very address, B2 here and B3 on NODE3; a default-network pod POD0 here
//! and net-0 pods on NODE2.
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Learned, Params, Port, Remote,
    OVERLAY_MAC, PARAM_F_DELIVER_EGRESS, PORT_F_QUARANTINE, VNI_DEFAULT, VTEP_F_NODE, VXLAN_PORT,
};
use cozyplane_datapath::meter::Traffic;
use cozyplane_datapath::{Datapath, Program};

const VXLAN_IF: u32 = 5;
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const NODE3: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 3);

/// The default network: POD0 here, 10.244.2.0/24 on NODE2.
const POD0_IF: u32 = 10;
const POD0: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const REMOTE0: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);

/// VPC A.
const A: u32 = 100;
const A1_IF: u32 = 20;
const A2_IF: u32 = 21;
const A1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
const A2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 6);
/// On NODE2.
const A3: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);
const A1_V6: &str = "fd00:a::5";
const A3_V6: &str = "fd00:a::7";
const A1_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0, 0, 0x05];
const A2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0, 0, 0x06];

/// VPC B, A's twin: B1 has A1's address.
const B: u32 = 101;
const B1_IF: u32 = 30;
const B2_IF: u32 = 31;
const B1: Ipv4Addr = A1;
const B2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 8);
/// On NODE3.
const B3: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
const B1_MAC: [u8; 6] = [0x0a, 0x58, 0x0b, 0, 0, 0x05];
const B2_MAC: [u8; 6] = [0x0a, 0x58, 0x0b, 0, 0, 0x08];

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn endpoint(ifindex: u32, mac: [u8; 6]) -> Endpoint {
    Endpoint {
        ifindex,
        mac,
        flags: 0,
    }
}

/// A pod on network `net` as the agent registers it.
fn add_pod(dp: &mut Datapath, net: u32, ifindex: u32, ip: IpAddr, mac: [u8; 6]) {
    dp.ports.insert(&ifindex, &Port { net, flags: 0 }).unwrap();
    dp.locals
        .insert(&EpKey::new(net, ip), &endpoint(ifindex, mac))
        .unwrap();
}

fn add_remote(dp: &mut Datapath, net: u32, ip: IpAddr, node: Ipv4Addr) {
    let len = if ip.is_ipv4() { 32 } else { 128 };
    dp.remotes
        .insert(&lpm_key(net, ip, len).unwrap(), &Remote::new(node))
        .unwrap();
}

fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    add_pod(&mut dp, 0, POD0_IF, POD0.into(), POD_MAC);
    let net0 = lpm_key(0, "10.244.2.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&net0, &Remote::new(NODE2)).unwrap();
    for n in [NODE, NODE2, NODE3] {
        dp.node_remotes
            .insert(&Addr128::from_v4(n), &Remote::new(n))
            .unwrap();
    }
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    for vpc in [A, B] {
        dp.vnis.insert(&vpc, &vpc).unwrap();
    }
    for n in [NODE2, NODE3] {
        dp.vteps.insert(&vtep_key(n), &VTEP_F_NODE).unwrap();
    }

    add_pod(&mut dp, A, A1_IF, A1.into(), A1_MAC);
    dp.locals
        .insert(
            &EpKey::new(A, IpAddr::V6(v6(A1_V6))),
            &endpoint(A1_IF, A1_MAC),
        )
        .unwrap();
    add_pod(&mut dp, A, A2_IF, A2.into(), A2_MAC);
    add_remote(&mut dp, A, A3.into(), NODE2);
    add_remote(&mut dp, A, IpAddr::V6(v6(A3_V6)), NODE2);

    add_pod(&mut dp, B, B1_IF, B1.into(), B1_MAC);
    add_pod(&mut dp, B, B2_IF, B2.into(), B2_MAC);
    add_remote(&mut dp, B, B3.into(), NODE3);
    (pins, dp)
}

fn from_pod_frame(dp: &mut Datapath, ifindex: u32, frame: &[u8]) -> Run {
    run(
        dp,
        Program::FromPod,
        frame,
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
}

fn from_pod(dp: &mut Datapath, ifindex: u32, pkt: &Ip4) -> Run {
    from_pod_frame(dp, ifindex, &pkt.frame(GW_MAC, POD_MAC))
}

/// `pkt` decapsulated on `vni` with outer source `sender`.
fn from_overlay(dp: &mut Datapath, vni: u32, sender: Ipv4Addr, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromOverlay,
        &pkt.frame(OVERLAY_MAC, [2, 0xcf, 10, 250, 0, 2]),
        Ctx {
            cb: [vni, u32::from(sender), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

/// What the kernel routes into the pod port behind loopback (test_run runs
/// there, ifindex 1).
fn to_pod_frame(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(dp, Program::ToPod, frame, Ctx::default())
}

fn drops(dp: &Datapath, reason: DropReason) -> u64 {
    dp.drop_count(reason).unwrap()
}

/// Deliveries and encapsulations so far.
fn forwarded(dp: &Datapath) -> (u32, u32) {
    (
        dp.test_deliver().unwrap().map_or(0, |d| d.count),
        dp.test_encap().unwrap().map_or(0, |e| e.count),
    )
}

/// The drops of `reason` metered for network `net`.
fn net_drops(dp: &Datapath, net: u32, reason: DropReason) -> Traffic {
    dp.net_counters()
        .unwrap()
        .get(&net)
        .and_then(|c| c.drops.get(&reason).copied())
        .unwrap_or_default()
}

/// `frame` is dropped as `reason`, counted globally and for `net` (one more
/// packet of its length), and neither delivered nor encapsulated.
fn assert_dropped(
    dp: &mut Datapath,
    net: u32,
    reason: DropReason,
    what: &str,
    go: impl FnOnce(&mut Datapath) -> (Run, usize),
) {
    let before = (drops(dp, reason), net_drops(dp, net, reason), forwarded(dp));
    let (r, len) = go(dp);
    assert_eq!(r.verdict, TC_ACT_SHOT, "{what}: dropped");
    assert_eq!(
        drops(dp, reason),
        before.0 + 1,
        "{what}: counted as {reason:?}"
    );
    let after = net_drops(dp, net, reason);
    assert_eq!(
        (after.packets, after.bytes),
        (before.1.packets + 1, before.1.bytes + len as u64),
        "{what}: counted for net {net}"
    );
    assert_eq!(forwarded(dp), before.2, "{what}: not forwarded");
}

#[test]
fn a_vpc_pod_reaches_its_own_vpc_and_nothing_else() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_isolation");

    // its own VPC: the neighbour, itself, the remote Port (v4 and v6)
    let r = from_pod(&mut dp, A1_IF, &Ip4::tcp(A1, 40000, A2, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &A2_MAC);
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!((d.ifindex, d.peer), (A2_IF, 1));
    let r = from_pod(&mut dp, A1_IF, &Ip4::udp(A1, 40000, A1, 53));
    assert_eq!(
        r.verdict, TC_ACT_REDIRECT,
        "itself: within the VPC, not the kernel"
    );
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, A1_IF);
    let r = from_pod(&mut dp, A1_IF, &Ip4::udp(A1, 40000, A3, 53));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let e = dp.test_encap().unwrap().unwrap();
    assert_eq!((e.vni, e.remote, e.ifindex), (A, NODE2.octets(), VXLAN_IF));
    let f = ip6_frame(v6(A1_V6), v6(A3_V6), PROTO_UDP, &udp6(5000, 53));
    assert_eq!(from_pod_frame(&mut dp, A1_IF, &f).verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_encap().unwrap().unwrap().vni, A);
    // pod to pod VXLAN inside the VPC (nested overlays) is the VPC's business
    let r = from_pod(&mut dp, A1_IF, &Ip4::udp(A1, 40000, A3, VXLAN_PORT));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    // ARP and neighbour discovery with its own host veth, as on net 0
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&A1_MAC);
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&A1_MAC);
    arp.extend_from_slice(&A1.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[169, 254, 1, 1]);
    assert_eq!(from_pod_frame(&mut dp, A1_IF, &arp).verdict, CP_PASS);
    let ns = ip6_frame(
        v6("fe80::a858:aff:fe00:5"),
        v6("ff02::1:ff00:1"),
        PROTO_ICMPV6,
        &icmp6(135),
    );
    assert_eq!(from_pod_frame(&mut dp, A1_IF, &ns).verdict, CP_PASS);
    // the twin: B1 has A1's address, and its packets stay in B
    let r = from_pod(&mut dp, B1_IF, &Ip4::tcp(B1, 40000, B2, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, B2_IF);
    let r = from_pod(&mut dp, B1_IF, &Ip4::udp(B1, 40000, B1, 53));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, B1_IF, "not A1");
    let r = from_pod(&mut dp, B1_IF, &Ip4::udp(B1, 40000, B3, 53));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let e = dp.test_encap().unwrap().unwrap();
    assert_eq!((e.vni, e.remote), (B, NODE3.octets()));
    assert_eq!(drops(&dp, DropReason::VpcIsolated), 0);

    // a learned entry on the VPC's net is no Port (only net 0 learns)
    dp.learned
        .insert(
            &EpKey::new(A, Ipv4Addr::new(10, 0, 0, 77)),
            &Learned {
                tunnel_ip: NODE2.octets(),
                pad: 0,
                expires_ns: u64::MAX,
            },
        )
        .unwrap();
    let outside = Ipv4Addr::new(1, 1, 1, 1);
    let denied: [(&str, u32, Ip4); 13] = [
        ("a net-0 pod here", A1_IF, Ip4::tcp(A1, 40000, POD0, 80)),
        (
            "a net-0 pod elsewhere",
            A1_IF,
            Ip4::tcp(A1, 40000, REMOTE0, 80),
        ),
        ("this node", A1_IF, Ip4::tcp(A1, 40000, NODE, 10250)),
        ("another node", A1_IF, Ip4::tcp(A1, 40000, NODE2, 10250)),
        ("the outside", A1_IF, Ip4::tcp(A1, 40000, outside, 443)),
        ("the twin's pod here", A1_IF, Ip4::tcp(A1, 40000, B2, 80)),
        (
            "the twin's pod elsewhere",
            A1_IF,
            Ip4::tcp(A1, 40000, B3, 80),
        ),
        ("A's pod from the twin", B1_IF, Ip4::tcp(B1, 40000, A2, 80)),
        (
            "A's remote from the twin",
            B1_IF,
            Ip4::tcp(B1, 40000, A3, 80),
        ),
        (
            "a learned address",
            A1_IF,
            Ip4::tcp(A1, 40000, Ipv4Addr::new(10, 0, 0, 77), 80),
        ),
        (
            "a node's overlay port",
            A1_IF,
            Ip4::udp(A1, 40000, NODE2, VXLAN_PORT),
        ),
        (
            "this node's overlay port",
            A1_IF,
            Ip4::udp(A1, 40000, NODE, VXLAN_PORT),
        ),
        (
            "the outside's overlay port",
            A1_IF,
            Ip4::udp(A1, 40000, outside, VXLAN_PORT),
        ),
    ];
    for (what, ifindex, pkt) in &denied {
        let net = if *ifindex == A1_IF { A } else { B };
        assert_dropped(&mut dp, net, DropReason::VpcIsolated, what, |dp| {
            let frame = pkt.frame(GW_MAC, POD_MAC);
            (from_pod_frame(dp, *ifindex, &frame), frame.len())
        });
    }
    // IPv6: the outside, and 64:ff9b::/96, which aliases A2's IPv4 key
    let mut nat64 = [0u8; 16];
    nat64[..4].copy_from_slice(&[0x00, 0x64, 0xff, 0x9b]);
    nat64[12..].copy_from_slice(&A2.octets());
    for dst in [v6("2001:db8::1"), Ipv6Addr::from(nat64)] {
        assert_dropped(
            &mut dp,
            A,
            DropReason::VpcIsolated,
            &dst.to_string(),
            |dp| {
                let f = ip6_frame(v6(A1_V6), dst, PROTO_UDP, &udp6(5000, 53));
                (from_pod_frame(dp, A1_IF, &f), f.len())
            },
        );
    }
    // none of it was anything else's drop
    assert_eq!(drops(&dp, DropReason::OverlayPort), 0);
    assert_eq!(drops(&dp, DropReason::Rpf), 0);
}

#[test]
fn cross_node_vpc_traffic_is_checked_on_receipt() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_receive");
    // A3 (a Port of A on NODE2) to A1, from NODE2
    let r = from_overlay(&mut dp, A, NODE2, &Ip4::tcp(A3, 80, A1, 40000));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &A1_MAC);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, A1_IF);
    // the twin's B3 to the same address: B1, not A1
    let r = from_overlay(&mut dp, B, NODE3, &Ip4::tcp(B3, 80, B1, 40000));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, B1_IF);

    // a forged VNI: no network of this node
    let before = forwarded(&dp);
    let r = from_overlay(&mut dp, 4242, NODE2, &Ip4::tcp(A3, 80, A1, 40000));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::UnknownVni), 1);
    assert_eq!(forwarded(&dp), before);

    // spoofed inner sources: nobody's, the twin's Port, a Port of this node,
    // a net-0 pod, and 64:ff9b:: aliasing A3's IPv4 key
    for (what, src) in [
        ("nobody's address", Ipv4Addr::new(10, 0, 0, 99)),
        ("the twin's Port", B3),
        ("a Port of this node", A2),
        ("a net-0 pod", REMOTE0),
    ] {
        assert_dropped(&mut dp, A, DropReason::VpcSource, what, |dp| {
            let pkt = Ip4::tcp(src, 80, A1, 40000);
            (
                from_overlay(dp, A, NODE2, &pkt),
                pkt.frame(OVERLAY_MAC, [0; 6]).len(),
            )
        });
    }
    let mut nat64 = [0u8; 16];
    nat64[..4].copy_from_slice(&[0x00, 0x64, 0xff, 0x9b]);
    nat64[12..].copy_from_slice(&A3.octets());
    assert_dropped(&mut dp, A, DropReason::VpcSource, "64:ff9b::A3", |dp| {
        let mut f = ip6_frame(Ipv6Addr::from(nat64), v6(A1_V6), PROTO_UDP, &udp6(53, 5000));
        f[..6].copy_from_slice(&OVERLAY_MAC);
        let r = run(
            dp,
            Program::FromOverlay,
            &f,
            Ctx {
                cb: [A, u32::from(NODE2), 0, 0, 0],
                ..Ctx::default()
            },
        );
        (r, f.len())
    });
    // the right source, but another node claims to send it (a forged outer
    // source, or a node posing as another node's pods)
    assert_dropped(&mut dp, A, DropReason::VpcSender, "A3 from NODE3", |dp| {
        let pkt = Ip4::tcp(A3, 80, A1, 40000);
        (
            from_overlay(dp, A, NODE3, &pkt),
            pkt.frame(OVERLAY_MAC, [0; 6]).len(),
        )
    });
    // the twin's Port on its own node, but tagged with A's VNI
    assert_dropped(&mut dp, A, DropReason::VpcSource, "B3 on VNI A", |dp| {
        let pkt = Ip4::tcp(B3, 80, A1, 40000);
        (
            from_overlay(dp, A, NODE3, &pkt),
            pkt.frame(OVERLAY_MAC, [0; 6]).len(),
        )
    });
    // a VPC never learns
    assert!(dp.learned.entries().unwrap().is_empty());
    // a Port of A, to an address A does not have here
    assert_dropped(
        &mut dp,
        A,
        DropReason::NoEndpoint,
        "no such endpoint",
        |dp| {
            let pkt = Ip4::tcp(A3, 80, B2, 40000);
            (
                from_overlay(dp, A, NODE2, &pkt),
                pkt.frame(OVERLAY_MAC, [0; 6]).len(),
            )
        },
    );

    // a net-0 frame for A1's address is never delivered into A1: it is no
    // net-0 endpoint, so the kernel gets it (and its routes hold no VPC
    // address; to_pod refuses it anyway: the_kernel_path_into_a_vpc_port_is_closed)
    let before = forwarded(&dp);
    let r = from_overlay(
        &mut dp,
        VNI_DEFAULT,
        NODE2,
        &Ip4::tcp(REMOTE0, 80, A1, 40000),
    );
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(&r.data[..6], &OVERLAY_MAC, "not addressed to A1");
    assert_eq!(forwarded(&dp), before);
    // ... and even a stale net-0 entry pointing at A1's veth does not get it
    // in: the gate checks the port's network
    dp.locals
        .insert(&EpKey::new(0, A1), &endpoint(A1_IF, A1_MAC))
        .unwrap();
    let r = from_overlay(
        &mut dp,
        VNI_DEFAULT,
        NODE2,
        &Ip4::tcp(REMOTE0, 80, A1, 40000),
    );
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 1);
    assert_eq!(forwarded(&dp), before);
}

#[test]
fn the_kernel_path_into_a_vpc_port_is_closed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_to_pod");
    // loopback is a VPC pod's host veth here
    let lo_pod = Ipv4Addr::new(10, 0, 0, 60);
    add_pod(&mut dp, A, 1, lo_pod.into(), A1_MAC);

    // routed by the kernel to its VPC address (the host has no route for
    // it, but a route can be added, or a twin's address collide): refused
    for (what, src) in [
        ("from a net-0 pod", REMOTE0),
        ("from the node", NODE),
        ("from the VPC", A3),
    ] {
        assert_dropped(&mut dp, A, DropReason::VpcKernelPath, what, |dp| {
            let f = Ip4::tcp(src, 80, lo_pod, 40000).frame(A1_MAC, GW_MAC);
            (to_pod_frame(dp, &f), f.len())
        });
    }
    assert_eq!(drops(&dp, DropReason::Misdelivered), 0);

    // IPv6 link scope from the host: ND and ICMPv6 errors pass, data does not
    let ll = v6("fe80::1");
    let pod_ll = v6("fe80::a858:aff:fe00:3c");
    for f in [
        ip6_frame(ll, v6("ff02::1:ff00:3c"), PROTO_ICMPV6, &icmp6(135)),
        ip6_frame(ll, v6("fd00:a::3c"), PROTO_ICMPV6, &icmp6(136)),
        ip6_frame(ll, pod_ll, PROTO_ICMPV6, &icmp6(1)),
    ] {
        assert_eq!(to_pod_frame(&mut dp, &f).verdict, CP_PASS, "{f:02x?}");
    }
    for (what, f) in [
        ("UDP", ip6_frame(ll, pod_ll, PROTO_UDP, &udp6(5000, 53))),
        ("TCP", ip6_frame(ll, pod_ll, PROTO_TCP, &udp6(5000, 22))),
        ("echo", ip6_frame(ll, pod_ll, PROTO_ICMPV6, &icmp6(128))),
        (
            "UDP to all nodes",
            ip6_frame(ll, v6("ff02::1"), PROTO_UDP, &udp6(5000, 53)),
        ),
    ] {
        assert_dropped(&mut dp, A, DropReason::VpcKernelPath, what, |dp| {
            (to_pod_frame(dp, &f), f.len())
        });
    }

    // a default-network port behind it takes what the gate admits, as before
    add_pod(&mut dp, 0, 1, Ipv4Addr::new(10, 244, 1, 60).into(), POD_MAC);
    let f = Ip4::tcp(REMOTE0, 80, Ipv4Addr::new(10, 244, 1, 60), 40000).frame(POD_MAC, GW_MAC);
    assert_eq!(to_pod_frame(&mut dp, &f).verdict, CP_PASS);
    let f = ip6_frame(ll, pod_ll, PROTO_UDP, &udp6(5000, 53));
    assert_eq!(to_pod_frame(&mut dp, &f).verdict, CP_PASS);

    // the debugging switch (deliveries via the host veth's egress) leaves
    // VPC deliveries inline: the egress path is closed to them
    let mut cfg = dp.params().unwrap();
    cfg.flags |= PARAM_F_DELIVER_EGRESS;
    dp.set_params(&cfg).unwrap();
    let r = from_pod(&mut dp, A1_IF, &Ip4::tcp(A1, 40000, A2, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!((d.ifindex, d.peer), (A2_IF, 1));
    let r = from_pod(
        &mut dp,
        POD0_IF,
        &Ip4::tcp(POD0, 40000, Ipv4Addr::new(10, 244, 1, 60), 80),
    );
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(
        dp.test_deliver().unwrap().unwrap().peer,
        0,
        "net 0 as before"
    );
}

#[test]
fn a_quarantined_port_sends_and_receives_nothing() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_quarantine");
    assert!(dp.set_port_quarantine(A1_IF, true).unwrap());
    assert_eq!(
        dp.ports.get(&A1_IF).unwrap(),
        Some(Port {
            net: A,
            flags: PORT_F_QUARANTINE
        }),
        "its network is kept"
    );
    assert!(!dp.set_port_quarantine(99, true).unwrap(), "no such port");
    assert_eq!(dp.ports.get(&99).unwrap(), None, "and none made up");

    // from it: IP within its VPC, ARP, neighbour discovery
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&A1_MAC);
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&A1_MAC);
    arp.extend_from_slice(&A1.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[169, 254, 1, 1]);
    let ns = ip6_frame(
        v6("fe80::a858:aff:fe00:5"),
        v6("ff02::1:ff00:1"),
        PROTO_ICMPV6,
        &icmp6(135),
    );
    for (what, f) in [
        (
            "to its neighbour",
            Ip4::tcp(A1, 40000, A2, 80).frame(GW_MAC, A1_MAC),
        ),
        (
            "to its remote",
            Ip4::tcp(A1, 40000, A3, 80).frame(GW_MAC, A1_MAC),
        ),
        ("ARP", arp),
        ("ND", ns),
    ] {
        assert_dropped(&mut dp, A, DropReason::Quarantined, what, |dp| {
            (from_pod_frame(dp, A1_IF, &f), f.len())
        });
    }
    // into it: from its neighbour, from the overlay, from the kernel
    assert_dropped(&mut dp, A, DropReason::Quarantined, "from A2", |dp| {
        let f = Ip4::tcp(A2, 80, A1, 40000).frame(GW_MAC, A2_MAC);
        (from_pod_frame(dp, A2_IF, &f), f.len())
    });
    assert_dropped(&mut dp, A, DropReason::Quarantined, "from A3", |dp| {
        let pkt = Ip4::tcp(A3, 80, A1, 40000);
        (
            from_overlay(dp, A, NODE2, &pkt),
            pkt.frame(OVERLAY_MAC, [0; 6]).len(),
        )
    });
    add_pod(&mut dp, 0, 1, Ipv4Addr::new(10, 244, 1, 60).into(), POD_MAC);
    assert!(dp.set_port_quarantine(1, true).unwrap());
    let f = Ip4::tcp(REMOTE0, 80, Ipv4Addr::new(10, 244, 1, 60), 40000).frame(POD_MAC, GW_MAC);
    assert_eq!(to_pod_frame(&mut dp, &f).verdict, TC_ACT_SHOT, "net 0 too");
    let f = ip6_frame(v6("fe80::1"), v6("ff02::1"), PROTO_ICMPV6, &icmp6(135));
    assert_eq!(to_pod_frame(&mut dp, &f).verdict, TC_ACT_SHOT, "even ND");
    assert_eq!(drops(&dp, DropReason::Quarantined), 8);
    // its neighbours are untouched
    let r = from_pod(&mut dp, A2_IF, &Ip4::tcp(A2, 40000, A3, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);

    // restored (a new attach): traffic flows again
    assert!(dp.set_port_quarantine(A1_IF, false).unwrap());
    assert_eq!(
        dp.ports.get(&A1_IF).unwrap(),
        Some(Port { net: A, flags: 0 })
    );
    let r = from_pod(&mut dp, A1_IF, &Ip4::tcp(A1, 40000, A2, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let r = from_overlay(&mut dp, A, NODE2, &Ip4::tcp(A3, 80, A1, 40000));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(drops(&dp, DropReason::Quarantined), 8);
}

#[test]
fn vpc_traffic_is_metered_by_network_and_direction() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_meter");
    let t = |packets: u64, bytes: usize| Traffic {
        packets,
        bytes: bytes as u64,
    };
    let local = Ip4::tcp(A1, 40000, A2, 80).frame(GW_MAC, A1_MAC);
    let remote = Ip4::udp(A1, 40000, A3, 53).frame(GW_MAC, A1_MAC);
    let mut incoming = Ip4::tcp(A3, 80, A1, 40000);
    incoming.payload = vec![7; 200];
    let incoming_len = incoming.frame(OVERLAY_MAC, [0; 6]).len();
    let twin = Ip4::tcp(B1, 40000, B2, 80).frame(GW_MAC, B1_MAC);
    let isolated = Ip4::tcp(A1, 40000, POD0, 80).frame(GW_MAC, A1_MAC);

    for _ in 0..2 {
        assert_eq!(
            from_pod_frame(&mut dp, A1_IF, &local).verdict,
            TC_ACT_REDIRECT
        );
    }
    assert_eq!(
        from_pod_frame(&mut dp, A1_IF, &remote).verdict,
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_overlay(&mut dp, A, NODE2, &incoming).verdict,
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod_frame(&mut dp, B1_IF, &twin).verdict,
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod_frame(&mut dp, A1_IF, &isolated).verdict,
        TC_ACT_SHOT
    );
    // the default network: forwarded and dropped, never metered
    assert_eq!(
        from_pod(&mut dp, POD0_IF, &Ip4::tcp(POD0, 1, REMOTE0, 2)).verdict,
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, POD0_IF, &Ip4::tcp(POD2_SPOOF, 1, REMOTE0, 2)).verdict,
        TC_ACT_SHOT
    );

    let c = dp.net_counters().unwrap();
    assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![A, B], "{c:?}");
    // A: sent two local + one remote; received two local + one from NODE2
    assert_eq!(c[&A].egress, t(3, 2 * local.len() + remote.len()));
    assert_eq!(c[&A].ingress, t(3, 2 * local.len() + incoming_len));
    assert_eq!(c[&A].drops.len(), 1);
    assert_eq!(c[&A].drops[&DropReason::VpcIsolated], t(1, isolated.len()));
    // B: its own, not A's, though the addresses are the same
    assert_eq!(c[&B].egress, t(1, twin.len()));
    assert_eq!(c[&B].ingress, t(1, twin.len()));
    assert!(c[&B].drops.is_empty());

    // a network this node no longer serves is forgotten
    assert_eq!(dp.forget_net_counters(B).unwrap(), 2);
    assert_eq!(dp.forget_net_counters(B).unwrap(), 0);
    let c = dp.net_counters().unwrap();
    assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![A]);
    assert_eq!(c[&A].egress.packets, 3);
}

/// A source POD0's veth does not own (RPF drop on net 0).
const POD2_SPOOF: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 99);

/// VPC C (net 102, 10.3.0.0/24) with C1 here and C3 on NODE3, peered with A;
/// VPC D (net 103, 10.4.0.0/24) with D1 here, peered with C only.
const C: u32 = 102;
const C1_IF: u32 = 40;
const C1: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 5);
const C3: Ipv4Addr = Ipv4Addr::new(10, 3, 0, 9);
const C1_MAC: [u8; 6] = [0x0a, 0x58, 0x0c, 0, 0, 0x05];
const D: u32 = 103;
const D1_IF: u32 = 50;
const D1: Ipv4Addr = Ipv4Addr::new(10, 4, 0, 5);

/// `{net, cidr} -> peer`, as the agent's sync writes a live peering.
fn peer_route(dp: &mut Datapath, net: u32, cidr: &str, peer: u32) {
    let (ip, len) = cidr.split_once('/').unwrap();
    dp.peer_routes
        .insert(
            &lpm_key(net, ip.parse().unwrap(), len.parse().unwrap()).unwrap(),
            &peer,
        )
        .unwrap();
}

#[test]
fn peered_vpcs_reach_each_other_and_nothing_more() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vpc_peering");
    for vpc in [C, D] {
        dp.vnis.insert(&vpc, &vpc).unwrap();
    }
    add_pod(&mut dp, C, C1_IF, C1.into(), C1_MAC);
    add_remote(&mut dp, C, C3.into(), NODE3);
    add_pod(&mut dp, D, D1_IF, D1.into(), [0x0a, 0x58, 0x0d, 0, 0, 5]);

    // Not peered yet: C is as foreign to A as the twin.
    assert_dropped(&mut dp, A, DropReason::VpcIsolated, "unpeered", |dp| {
        let f = Ip4::tcp(A1, 40000, C1, 80).frame(GW_MAC, POD_MAC);
        (from_pod_frame(dp, A1_IF, &f), f.len())
    });

    // A <-> C live; C <-> D live (A and D are not peered).
    peer_route(&mut dp, A, "10.3.0.0/24", C);
    peer_route(&mut dp, C, "10.0.0.0/24", A);
    peer_route(&mut dp, C, "10.4.0.0/24", D);
    peer_route(&mut dp, D, "10.3.0.0/24", C);

    // same node: into C1 through the gate on C's net
    let r = from_pod(&mut dp, A1_IF, &Ip4::tcp(A1, 40000, C1, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &C1_MAC);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, C1_IF);
    // and back
    let r = from_pod(&mut dp, C1_IF, &Ip4::tcp(C1, 80, A1, 40000));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, A1_IF);
    // cross node: carried with C's VNI to C3's node
    let r = from_pod(&mut dp, A1_IF, &Ip4::tcp(A1, 40000, C3, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let e = dp.test_encap().unwrap().unwrap();
    assert_eq!((e.vni, e.remote), (C, NODE3.octets()));
    // received: C3's reply to A1 arrives on A's VNI from C3's node
    let r = from_overlay(&mut dp, A, NODE3, &Ip4::tcp(C3, 80, A1, 40000));
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "a peer's Port from its node");
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, A1_IF);
    // ...but not from another node, and not an address of C no Port holds
    assert_dropped(&mut dp, A, DropReason::VpcSender, "wrong sender", |dp| {
        let p = Ip4::tcp(C3, 80, A1, 40000);
        (
            from_overlay(dp, A, NODE2, &p),
            p.frame(OVERLAY_MAC, [0; 6]).len(),
        )
    });
    assert_dropped(&mut dp, A, DropReason::VpcSource, "no such Port", |dp| {
        let p = Ip4::tcp(Ipv4Addr::new(10, 3, 0, 99), 80, A1, 40000);
        (
            from_overlay(dp, A, NODE3, &p),
            p.frame(OVERLAY_MAC, [0; 6]).len(),
        )
    });

    // Not transitive: A has no route to D, D none to A; the twin B none to C.
    for (what, net, ifindex, pkt) in [
        ("A to D", A, A1_IF, Ip4::tcp(A1, 40000, D1, 80)),
        ("D to A", D, D1_IF, Ip4::tcp(D1, 40000, A2, 80)),
        ("B to C", B, B1_IF, Ip4::tcp(B1, 40000, C1, 80)),
    ] {
        assert_dropped(&mut dp, net, DropReason::VpcIsolated, what, |dp| {
            let f = pkt.frame(GW_MAC, POD_MAC);
            (from_pod_frame(dp, ifindex, &f), f.len())
        });
    }
    // a peer route only opens the peer's Ports: not its other addresses
    assert_dropped(
        &mut dp,
        A,
        DropReason::VpcIsolated,
        "C's unused address",
        |dp| {
            let f = Ip4::tcp(A1, 40000, Ipv4Addr::new(10, 3, 0, 99), 80).frame(GW_MAC, POD_MAC);
            (from_pod_frame(dp, A1_IF, &f), f.len())
        },
    );

    // Either half deleted: the agent removes both routes, traffic stops.
    for (net, cidr) in [(A, "10.3.0.0/24"), (C, "10.0.0.0/24")] {
        let (ip, len) = cidr.split_once('/').unwrap();
        dp.peer_routes
            .remove(&lpm_key(net, ip.parse().unwrap(), len.parse().unwrap()).unwrap())
            .unwrap();
    }
    assert_dropped(
        &mut dp,
        A,
        DropReason::VpcIsolated,
        "unpeered again",
        |dp| {
            let f = Ip4::tcp(A1, 40000, C1, 80).frame(GW_MAC, POD_MAC);
            (from_pod_frame(dp, A1_IF, &f), f.len())
        },
    );
}

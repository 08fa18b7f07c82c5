//! BPF_PROG_TEST_RUN tests of the dual-address bridge (`bpf/bridge.h`): the
//! node reaches a VPC pod by its fabric address; `to_pod` translates to the
//! VPC address from `169.254.1.1:<claimed port>`, `from_pod` reverses the
//! pod's replies exactly, ICMP echo and errors included; net-0 traffic from
//! anywhere but the node's own stack never enters the VPC port. Checksums are
//! recomputed in Rust over the real bytes. Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;

use bpf_support::*;
use cozyplane_datapath::abi::{
    sg_member_key, vtep_key, Addr128, Bridge, BridgeCt, BridgeKey, DropReason, Endpoint, EpKey,
    Params, Port, SgGroups, BRIDGE_PORT_MAX, BRIDGE_PORT_MIN, GATEWAY_V4, OVERLAY_MAC, VNI_DEFAULT,
    VTEP_F_NODE,
};
use cozyplane_datapath::{Datapath, Program};

/// The VPC pod's host veth: loopback, where test_run runs `to_pod`.
const VPC_IF: u32 = 1;
const NET: u32 = 100;
/// A twin VPC with the same CIDR, its pod on another veth.
const TWIN_NET: u32 = 101;
const TWIN_IF: u32 = 12;
/// A net-0 pod on this node.
const POD0_IF: u32 = 10;
const POD0: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const VXLAN_IF: u32 = 5;
const VPC_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
const FABRIC: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 9);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// A second address of this node (another NIC).
const NODE_B: Ipv4Addr = Ipv4Addr::new(192, 168, 7, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const GW: Ipv4Addr = GATEWAY_V4;
const VPC_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0, 0, 5];
const HOST_MAC: [u8; 6] = [0xee, 0xee, 0xee, 0xee, 0xee, 0xee];

/// A node with the VPC pod (net 100, `VPC_IP` on `VPC_IF`) bridged from
/// `FABRIC`, its twin in net 101 (same address), a net-0 pod, and NODE2 a
/// known overlay sender.
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    for (ifindex, net) in [(VPC_IF, NET), (TWIN_IF, TWIN_NET)] {
        dp.ports.insert(&ifindex, &Port { net, flags: 0 }).unwrap();
        dp.locals
            .insert(
                &EpKey::new(net, VPC_IP),
                &Endpoint {
                    ifindex,
                    mac: VPC_MAC,
                    flags: 0,
                },
            )
            .unwrap();
    }
    add_local_pod(&mut dp, POD0_IF, POD0, POD_MAC);
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vnis.insert(&NET, &NET).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    dp.put_bridge(FABRIC.into(), NET, VPC_IP.into(), VPC_IF)
        .unwrap();
    (pins, dp)
}

/// The node's own packet (no input device) leaving through the VPC pod's
/// host veth, as the kernel routes it: to the pod's MAC from the host veth's.
fn to_pod(dp: &mut Datapath, pkt: &Ip4) -> Run {
    to_pod_frame(dp, &pkt.frame(VPC_MAC, HOST_MAC), 0)
}

/// `frame` through `to_pod` with input device `iif` (0: the node's own).
fn to_pod_frame(dp: &mut Datapath, frame: &[u8], iif: u32) -> Run {
    run(
        dp,
        Program::ToPod,
        frame,
        Ctx {
            ingress_ifindex: iif,
            ..Ctx::default()
        },
    )
}

/// The pod's packet arriving on its host veth.
fn from_vpc_pod(dp: &mut Datapath, pkt: &Ip4) -> Run {
    from_port(dp, VPC_IF, &pkt.frame(HOST_MAC, VPC_MAC))
}

fn from_port(dp: &mut Datapath, ifindex: u32, frame: &[u8]) -> Run {
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

fn drops(dp: &Datapath, reason: DropReason) -> u64 {
    dp.drop_count(reason).unwrap()
}

/// `pkt`'s TCP frame with the flags byte set to `flags`, checksum recomputed.
fn tcp_with_flags(pkt: &Ip4, flags: u8, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
    let mut f = pkt.frame(dst_mac, src_mac);
    f[34 + 13] = flags;
    f[34 + 16..34 + 18].copy_from_slice(&[0, 0]);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&f[26..34]);
    pseudo.push(0);
    pseudo.push(PROTO_TCP);
    pseudo.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
    pseudo.extend_from_slice(&f[34..]);
    let c = csum(&pseudo);
    f[34 + 16..34 + 18].copy_from_slice(&c.to_be_bytes());
    f
}

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;

/// Bridge `out` (node -> fabric address): check the translation, return the
/// claimed port.
fn bridged_port(dp: &mut Datapath, out: &Ip4) -> u16 {
    let r = to_pod(dp, out);
    assert_eq!(r.verdict, CP_PASS, "bridged into the pod");
    let p = parse(&r.data);
    assert_eq!(p.dst, VPC_IP, "destination is the VPC address");
    assert_eq!(p.src, GW, "source is the pod's gateway");
    assert!(p.ip_csum_ok && p.l4_csum_ok, "checksums after the bridge");
    let port = p.sport;
    assert!((BRIDGE_PORT_MIN..=BRIDGE_PORT_MAX).contains(&port));
    if out.proto != PROTO_ICMP {
        assert_eq!(p.dport, out.dport, "the pod's port is kept");
    }
    port
}

#[test]
fn a_node_tcp_syn_is_bridged_and_the_reply_reversed_exactly() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-tcp");
    let syn = Ip4::tcp(NODE, 40000, FABRIC, 8080);
    let r = to_pod_frame(&mut dp, &tcp_with_flags(&syn, SYN, VPC_MAC, HOST_MAC), 0);
    assert_eq!(r.verdict, CP_PASS, "bridged into the pod");
    let p = parse(&r.data);
    let port = p.sport;
    assert!((BRIDGE_PORT_MIN..=BRIDGE_PORT_MAX).contains(&port));
    // byte for byte the packet the pod would get from 169.254.1.1:port
    let want = tcp_with_flags(&Ip4::tcp(GW, port, VPC_IP, 8080), SYN, VPC_MAC, HOST_MAC);
    assert_eq!(r.data, want, "SYN translated exactly");

    // the same flow keeps its port (retransmits, later segments)
    assert_eq!(
        bridged_port(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080)),
        port
    );

    // connection table: forward by the node's tuple, reverse by the pod's
    let fwd = dp.bridge_fwd.entries().unwrap();
    let rev = dp.bridge_rev.entries().unwrap();
    assert_eq!((fwd.len(), rev.len()), (1, 1));
    assert_eq!(fwd[0].0.net, 0);
    assert_eq!(fwd[0].0.t.src, Addr128::from_v4(NODE));
    assert_eq!(fwd[0].0.t.dst, Addr128::from_v4(FABRIC));
    assert_eq!(fwd[0].1.port, port.to_be_bytes(), "ports in network order");
    assert_eq!(rev[0].0.net, NET, "the reverse key is scoped by the VPC");
    assert_eq!(rev[0].0.t.src, Addr128::from_v4(VPC_IP));
    assert_eq!(rev[0].0.t.dst, Addr128::from_v4(GW));
    assert_eq!(rev[0].1.addr, Addr128::from_v4(NODE));
    assert_eq!(rev[0].1.fabric, Addr128::from_v4(FABRIC));

    // the pod's SYN-ACK to 169.254.1.1:port comes back from the fabric address
    let reply = Ip4::tcp(VPC_IP, 8080, GW, port);
    let r = from_port(
        &mut dp,
        VPC_IF,
        &tcp_with_flags(&reply, SYN_ACK, HOST_MAC, VPC_MAC),
    );
    assert_eq!(r.verdict, CP_PASS, "handed to the node's stack");
    let want = tcp_with_flags(
        &Ip4::tcp(FABRIC, 8080, NODE, 40000),
        SYN_ACK,
        HOST_MAC,
        VPC_MAC,
    );
    assert_eq!(r.data, want, "reply reversed exactly");
}

#[test]
fn udp_and_icmp_echo_are_bridged_by_port_and_identifier() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-echo");
    let port = bridged_port(&mut dp, &Ip4::udp(NODE, 5353, FABRIC, 53));
    let r = from_vpc_pod(&mut dp, &Ip4::udp(VPC_IP, 53, GW, port));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(
        r.data,
        Ip4::udp(FABRIC, 53, NODE, 5353).frame(HOST_MAC, VPC_MAC)
    );

    let id = bridged_port(&mut dp, &Ip4::icmp_echo(NODE, FABRIC, 777, false));
    let want = Ip4::icmp_echo(GW, VPC_IP, id, false).frame(VPC_MAC, HOST_MAC);
    assert_eq!(
        to_pod(&mut dp, &Ip4::icmp_echo(NODE, FABRIC, 777, false)).data,
        want,
        "echo request translated exactly, the id is the port"
    );
    let r = from_vpc_pod(&mut dp, &Ip4::icmp_echo(VPC_IP, GW, id, true));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(
        r.data,
        Ip4::icmp_echo(FABRIC, NODE, 777, true).frame(HOST_MAC, VPC_MAC),
        "echo reply reversed exactly, the node's id restored"
    );
}

#[test]
fn two_node_addresses_with_one_source_port_get_distinct_ports() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-ports");
    let a = bridged_port(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080));
    let b = bridged_port(&mut dp, &Ip4::tcp(NODE_B, 40000, FABRIC, 8080));
    assert_ne!(a, b, "one port each, or the pod could not tell them apart");
    assert_eq!(dp.bridge_rev.entries().unwrap().len(), 2);
    for (port, node) in [(a, NODE), (b, NODE_B)] {
        let r = from_vpc_pod(&mut dp, &Ip4::tcp(VPC_IP, 8080, GW, port));
        let p = parse(&r.data);
        assert_eq!((p.src, p.dst, p.dport), (FABRIC, node, 40000));
        assert!(p.ip_csum_ok && p.l4_csum_ok);
    }
    // a replaced reverse entry (LRU eviction and reuse) does not hand a flow
    // another flow's port: the forward entry is checked against it
    let rev = dp.bridge_rev.entries().unwrap();
    let (k, mut v) = rev
        .iter()
        .find(|(_, v)| v.addr == Addr128::from_v4(NODE))
        .copied()
        .unwrap();
    v.addr = Addr128::from_v4(NODE2);
    dp.bridge_rev.insert(&k, &v).unwrap();
    let again = bridged_port(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080));
    assert_ne!(again, a, "the taken port is not reused");
}

#[test]
fn net0_traffic_for_a_fabric_address_never_enters_the_vpc_port() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-admit");
    let pkt = Ip4::tcp(POD0, 40000, FABRIC, 8080);
    // A net-0 pod's packet: from_pod finds no local or remote entry for
    // the fabric address and leaves it to the kernel ...
    let r = from_port(&mut dp, POD0_IF, &pkt.frame(GW_MAC, POD_MAC));
    assert_eq!(r.verdict, CP_PASS);
    assert!(
        dp.test_deliver().unwrap().is_none(),
        "not redirected into a pod"
    );
    // ... which routes it into the VPC pod's veth: forwarded, so to_pod has
    // its input device and refuses it
    let frame = pkt.frame(VPC_MAC, HOST_MAC);
    let r = to_pod_frame(&mut dp, &frame, POD0_IF);
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 1);
    // the same from the overlay (a remote pod or node) and the uplink
    let r = run(
        &mut dp,
        Program::FromOverlay,
        &Ip4::tcp(NODE2, 40000, FABRIC, 8080).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, CP_PASS, "net 0 to a non-pod address: the kernel");
    assert_eq!(to_pod_frame(&mut dp, &frame, VXLAN_IF).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 2);
    assert!(
        dp.bridge_fwd.entries().unwrap().is_empty(),
        "nothing was translated"
    );

    // Were the fabric address ever a net-0 local pointing at the VPC port,
    // the inline deliveries' gate compares the port's net and refuses it.
    dp.locals
        .insert(
            &EpKey::new(0, FABRIC),
            &Endpoint {
                ifindex: VPC_IF,
                mac: VPC_MAC,
                flags: 0,
            },
        )
        .unwrap();
    let r = from_port(&mut dp, POD0_IF, &pkt.frame(GW_MAC, POD_MAC));
    assert_eq!(
        r.verdict, TC_ACT_SHOT,
        "net 0 never redirected into net 100"
    );
    let r = run(
        &mut dp,
        Program::FromOverlay,
        &Ip4::tcp(NODE2, 40000, FABRIC, 8080).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    );
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 4);
    assert!(dp.test_deliver().unwrap().is_none());

    // VPC CIDRs may overlap the fabric pool: a pod whose fabric address
    // equals its own VPC address. The node's packet is bridged, a forwarded
    // one still refused (the bridge is looked up before the gate, which
    // would take it for the pod's own address).
    dp.locals.remove(&EpKey::new(0, FABRIC)).unwrap();
    dp.locals
        .insert(
            &EpKey::new(NET, FABRIC),
            &Endpoint {
                ifindex: VPC_IF,
                mac: VPC_MAC,
                flags: 0,
            },
        )
        .unwrap();
    dp.put_bridge(FABRIC.into(), NET, FABRIC.into(), VPC_IF)
        .unwrap();
    assert_eq!(to_pod_frame(&mut dp, &frame, POD0_IF).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 5);
    let r = to_pod(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse(&r.data).src, GW, "the node's own packet is bridged");
}

/// A pod in a SecurityGroup that admits nothing: the node's probe enters
/// (the bridge's gate skips the ingress check) and its reply to the gateway
/// leaves (reversed by the bridge before the egress check); a packet to the
/// gateway that answers no bridged flow is judged by the rules.
#[test]
fn a_policed_pod_still_answers_the_nodes_probes_and_only_them() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-sg");
    dp.sg
        .members
        .insert(
            &sg_member_key(NET, std::net::IpAddr::V4(VPC_IP)),
            &SgGroups::new(&[7]).unwrap(),
        )
        .unwrap();
    let syn = Ip4::tcp(NODE, 40000, FABRIC, 8080);
    let r = to_pod_frame(&mut dp, &tcp_with_flags(&syn, SYN, VPC_MAC, HOST_MAC), 0);
    assert_eq!(r.verdict, CP_PASS, "the probe enters");
    let port = parse(&r.data).sport;
    let reply = Ip4::tcp(VPC_IP, 8080, GW, port);
    let r = from_port(
        &mut dp,
        VPC_IF,
        &tcp_with_flags(&reply, SYN_ACK, HOST_MAC, VPC_MAC),
    );
    assert_eq!(r.verdict, CP_PASS, "the pod answers the probe");
    assert_eq!(parse(&r.data).src, FABRIC, "reversed by the bridge");
    assert_eq!(drops(&dp, DropReason::SgEgress), 0);
    // Not a reply of the node's flow: no bridge state, so its groups judge it.
    let stray = Ip4::tcp(VPC_IP, 8080, GW, port.wrapping_add(1));
    let r = from_port(&mut dp, VPC_IF, &stray.frame(HOST_MAC, VPC_MAC));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::SgEgress), 1);
    // Anything else the pod sends is judged by its groups too.
    let out = Ip4::tcp(VPC_IP, 8080, Ipv4Addr::new(10, 0, 0, 6), 80);
    assert_eq!(
        from_port(&mut dp, VPC_IF, &out.frame(HOST_MAC, VPC_MAC)).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(drops(&dp, DropReason::SgEgress), 2);
}

#[test]
fn only_the_bridged_pod_and_only_known_flows_are_reversed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-rev");
    let port = bridged_port(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080));
    // the twin VPC's pod holds the same address: its identical "reply" is
    // not the bridged flow's (the reverse key carries the net)
    let twin = Ip4::tcp(VPC_IP, 8080, GW, port).frame(HOST_MAC, VPC_MAC);
    let r = from_port(&mut dp, TWIN_IF, &twin);
    assert_eq!(r.data, twin, "not rewritten");
    // no state: not rewritten either (isolation decides its fate)
    let stray = Ip4::tcp(VPC_IP, 8080, GW, port.wrapping_add(1)).frame(HOST_MAC, VPC_MAC);
    assert_eq!(from_port(&mut dp, VPC_IF, &stray).data, stray);
    // a spoofed source fails RPF before any of it
    let spoof = Ip4::tcp(Ipv4Addr::new(10, 0, 0, 6), 8080, GW, port).frame(HOST_MAC, VPC_MAC);
    assert_eq!(from_port(&mut dp, VPC_IF, &spoof).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Rpf), 1);
}

#[test]
fn what_the_bridge_cannot_translate_is_dropped_and_counted() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-drop");
    let frag = with_frag(
        Ip4::udp(NODE, 5000, FABRIC, 53).frame(VPC_MAC, HOST_MAC),
        0x2000,
    );
    assert_eq!(to_pod_frame(&mut dp, &frag, 0).verdict, TC_ACT_SHOT);
    let opts = with_ip_options(
        Ip4::udp(NODE, 5000, FABRIC, 53).frame(VPC_MAC, HOST_MAC),
        &[1, 1, 1, 0],
    );
    assert_eq!(to_pod_frame(&mut dp, &opts, 0).verdict, TC_ACT_SHOT);
    let mut gre = Ip4::udp(NODE, 5000, FABRIC, 53).frame(VPC_MAC, HOST_MAC);
    gre[23] = 47;
    fix_ip4_csum(&mut gre);
    assert_eq!(to_pod_frame(&mut dp, &gre, 0).verdict, TC_ACT_SHOT);
    let reply = Ip4::icmp_echo(NODE, FABRIC, 9, true);
    assert_eq!(
        to_pod(&mut dp, &reply).verdict,
        TC_ACT_SHOT,
        "echo reply: no flow"
    );
    assert_eq!(drops(&dp, DropReason::BridgeUntranslatable), 4);
    assert!(dp.bridge_fwd.entries().unwrap().is_empty());

    // a bridge whose veth is not the one the packet leaves by: stale route
    dp.put_bridge(FABRIC.into(), NET, VPC_IP.into(), 77)
        .unwrap();
    assert_eq!(
        to_pod(&mut dp, &Ip4::udp(NODE, 5000, FABRIC, 53)).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(drops(&dp, DropReason::Misdelivered), 1);
}

#[test]
fn icmp_errors_are_translated_both_ways() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-icmp");
    let port = bridged_port(&mut dp, &Ip4::udp(NODE, 5353, FABRIC, 53));
    // the pod's error about the bridged datagram (it saw 169.254.1.1:port)
    let seen = Ip4::udp(GW, port, VPC_IP, 53);
    let err = icmp_error(VPC_IP, GW, &quote(&seen), HOST_MAC, VPC_MAC);
    let r = from_port(&mut dp, VPC_IF, &err);
    assert_eq!(r.verdict, CP_PASS);
    assert_icmp_error(&r.data, FABRIC, NODE, &Ip4::udp(NODE, 5353, FABRIC, 53));

    // the pod's error about a bridged echo request restores the node's id
    let id = bridged_port(&mut dp, &Ip4::icmp_echo(NODE, FABRIC, 4242, false));
    let seen = Ip4::icmp_echo(GW, VPC_IP, id, false);
    let err = icmp_error(VPC_IP, GW, &quote(&seen), HOST_MAC, VPC_MAC);
    let r = from_port(&mut dp, VPC_IF, &err);
    assert_eq!(r.verdict, CP_PASS);
    assert_icmp_error(
        &r.data,
        FABRIC,
        NODE,
        &Ip4::icmp_echo(NODE, FABRIC, 4242, false),
    );

    // the node's error about the pod's reversed reply (FABRIC:53 -> NODE:5353)
    let sent = Ip4::udp(FABRIC, 53, NODE, 5353);
    let err = icmp_error(NODE, FABRIC, &quote(&sent), VPC_MAC, HOST_MAC);
    let r = to_pod_frame(&mut dp, &err, 0);
    assert_eq!(r.verdict, CP_PASS);
    assert_icmp_error(&r.data, GW, VPC_IP, &Ip4::udp(VPC_IP, 53, GW, port));

    // an error about no bridged flow is not translated into the pod
    let other = Ip4::udp(FABRIC, 53, NODE, 5354);
    let err = icmp_error(NODE, FABRIC, &quote(&other), VPC_MAC, HOST_MAC);
    assert_eq!(to_pod_frame(&mut dp, &err, 0).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::BridgeUntranslatable), 1);
}

#[test]
fn the_bridge_api_refuses_what_it_cannot_bridge_and_forgets_flows() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-api");
    let v6: std::net::IpAddr = "fd00::9".parse().unwrap();
    assert!(
        dp.put_bridge(v6, NET, VPC_IP.into(), VPC_IF).is_err(),
        "one family"
    );
    for bad in ["64:ff9b::a00:9", "fe80::9", "ff02::1", "::"] {
        let bad: std::net::IpAddr = bad.parse().unwrap();
        assert!(
            dp.put_bridge(bad, NET, "fd10::5".parse().unwrap(), VPC_IF)
                .is_err(),
            "{bad} is no fabric address"
        );
    }
    assert!(
        dp.put_bridge(FABRIC.into(), 0, VPC_IP.into(), VPC_IF)
            .is_err(),
        "net 0"
    );
    assert_eq!(
        dp.bridges.get(&EpKey::new(0, FABRIC)).unwrap(),
        Some(Bridge {
            net: NET,
            ifindex: VPC_IF,
            vpc: Addr128::from_v4(VPC_IP)
        })
    );
    bridged_port(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080));
    // another veth's delete leaves it alone
    assert!(!dp.delete_bridge(FABRIC.into(), Some(99)).unwrap());
    assert!(dp.delete_bridge(FABRIC.into(), Some(VPC_IF)).unwrap());
    assert!(
        !dp.delete_bridge(FABRIC.into(), None).unwrap(),
        "idempotent"
    );
    let empty: Vec<(BridgeKey, BridgeCt)> = Vec::new();
    assert_eq!(dp.bridge_fwd.entries().unwrap(), empty);
    assert_eq!(dp.bridge_rev.entries().unwrap(), empty);
    // without the bridge the fabric address is nobody's: the gate refuses
    assert_eq!(
        to_pod(&mut dp, &Ip4::tcp(NODE, 40000, FABRIC, 8080)).verdict,
        TC_ACT_SHOT
    );
}

const FABRIC6: &str = "fd00:10:244:1::9";
const VPC6: &str = "fd10::5";
const NODE6: &str = "fd00:99::1";
const GW6: &str = "fe80::1";

fn ip6(s: &str) -> std::net::Ipv6Addr {
    s.parse().unwrap()
}

/// An Ethernet/IPv6 frame carrying `l4` (next header `proto`) with its
/// checksum (at `csum_at` in `l4`) computed over the pseudo header.
fn frame6(
    src: &str,
    dst: &str,
    proto: u8,
    mut l4: Vec<u8>,
    csum_at: usize,
    to_pod: bool,
) -> Vec<u8> {
    let (src, dst) = (ip6(src), ip6(dst));
    l4[csum_at..csum_at + 2].copy_from_slice(&[0, 0]);
    let c = pseudo_sum6(src, dst, proto, &l4);
    l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    let (dst_mac, src_mac) = if to_pod {
        (VPC_MAC, HOST_MAC)
    } else {
        (HOST_MAC, VPC_MAC)
    };
    eth_ip6(dst_mac, src_mac, src, dst, proto, 64, &l4)
}

fn tcp6(src: &str, sport: u16, dst: &str, dport: u16, to_pod: bool) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = SYN;
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    h.extend_from_slice(b"bridged over IPv6");
    frame6(src, dst, PROTO_TCP, h, 16, to_pod)
}

fn echo6(src: &str, dst: &str, id: u16, reply: bool, to_pod: bool) -> Vec<u8> {
    let mut h = vec![if reply { 129 } else { 128 }, 0, 0, 0, 0, 0, 0, 1];
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h.extend_from_slice(b"ping6");
    frame6(src, dst, 58, h, 2, to_pod)
}

/// Source port (or echo id) of an IPv6 frame from `frame6`.
fn port6(f: &[u8], icmp: bool) -> u16 {
    let at = if icmp { 54 + 4 } else { 54 };
    u16::from_be_bytes([f[at], f[at + 1]])
}

#[test]
fn ipv6_is_bridged_from_fe80_1_and_reversed_exactly() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("bridge-v6");
    let vpc6: std::net::IpAddr = VPC6.parse().unwrap();
    dp.locals
        .insert(
            &EpKey::new(NET, vpc6),
            &Endpoint {
                ifindex: VPC_IF,
                mac: VPC_MAC,
                flags: 0,
            },
        )
        .unwrap();
    dp.put_bridge(FABRIC6.parse().unwrap(), NET, vpc6, VPC_IF)
        .unwrap();

    // TCP: [NODE6]:40000 -> [FABRIC6]:8080 becomes [fe80::1]:P -> [VPC6]:8080
    let r = to_pod_frame(&mut dp, &tcp6(NODE6, 40000, FABRIC6, 8080, true), 0);
    assert_eq!(r.verdict, CP_PASS, "bridged into the pod");
    let port = port6(&r.data, false);
    assert!((BRIDGE_PORT_MIN..=BRIDGE_PORT_MAX).contains(&port));
    assert_eq!(
        r.data,
        tcp6(GW6, port, VPC6, 8080, true),
        "translated exactly"
    );
    let rev = dp.bridge_rev.entries().unwrap();
    assert_eq!(
        rev[0].0.t.dst,
        Addr128::from_v6(ip6(GW6)),
        "reverse key: to fe80::1"
    );
    // the pod's reply to fe80::1 (link scope) is reversed before the
    // link-scope filter
    let r = from_port(&mut dp, VPC_IF, &tcp6(VPC6, 8080, GW6, port, false));
    assert_eq!(r.verdict, CP_PASS, "handed to the node's stack");
    assert_eq!(
        r.data,
        tcp6(FABRIC6, 8080, NODE6, 40000, false),
        "reversed exactly"
    );

    // ICMPv6 echo: the id is the port, the checksum has a pseudo header
    let r = to_pod_frame(&mut dp, &echo6(NODE6, FABRIC6, 777, false, true), 0);
    assert_eq!(r.verdict, CP_PASS);
    let id = port6(&r.data, true);
    assert_eq!(r.data, echo6(GW6, VPC6, id, false, true));
    let r = from_port(&mut dp, VPC_IF, &echo6(VPC6, GW6, id, true, false));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, echo6(FABRIC6, NODE6, 777, true, false));

    // without state, or from the pod's link-local address: no reversal, and
    // TCP to fe80::1 stays what the link-scope filter drops
    let stray = tcp6(VPC6, 8080, GW6, port.wrapping_add(1), false);
    assert_eq!(from_port(&mut dp, VPC_IF, &stray).verdict, TC_ACT_SHOT);
    let ll = tcp6("fe80::5", 8080, GW6, port, false);
    assert_eq!(from_port(&mut dp, VPC_IF, &ll).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::LinkScope), 2);
    // forwarded IPv6 for the fabric address is refused like IPv4
    let fwd = tcp6("fd00:10:244:1::2", 40000, FABRIC6, 8080, true);
    assert_eq!(to_pod_frame(&mut dp, &fwd, POD0_IF).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::Misdelivered), 1);
    // ICMPv6 errors both ways: the node's "packet too big" about the pod's
    // reversed reply, and the pod's "port unreachable" about a bridged packet
    let mut ptb = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
    ptb.extend_from_slice(&tcp6(FABRIC6, 8080, NODE6, 40000, false)[14..14 + 48]);
    let r = to_pod_frame(&mut dp, &frame6(NODE6, FABRIC6, 58, ptb, 2, true), 0);
    assert_eq!(r.verdict, CP_PASS);
    assert_icmp6_error(&r.data, GW6, VPC6, &tcp6(VPC6, 8080, GW6, port, false));
    assert_eq!(&r.data[58..62], &[0, 0, 0x05, 0x00], "MTU untouched");
    let mut unreach = vec![1, 4, 0, 0, 0, 0, 0, 0];
    unreach.extend_from_slice(&tcp6(GW6, port, VPC6, 8080, true)[14..14 + 48]);
    let r = from_port(&mut dp, VPC_IF, &frame6(VPC6, GW6, 58, unreach, 2, false));
    assert_eq!(r.verdict, CP_PASS);
    assert_icmp6_error(
        &r.data,
        FABRIC6,
        NODE6,
        &tcp6(NODE6, 40000, FABRIC6, 8080, true),
    );
    // an error about no bridged flow is not translated into the pod
    let mut other = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
    other.extend_from_slice(&tcp6(FABRIC6, 8080, NODE6, 40001, false)[14..14 + 48]);
    let other = frame6(NODE6, FABRIC6, 58, other, 2, true);
    assert_eq!(to_pod_frame(&mut dp, &other, 0).verdict, TC_ACT_SHOT);
    assert_eq!(drops(&dp, DropReason::BridgeUntranslatable), 1);
}

/// Check a translated ICMPv6 error: outer addresses, the ICMPv6 checksum
/// over its pseudo header and message, and the quote as `quoted` (a frame
/// from `frame6`) says, its addresses and ports.
fn assert_icmp6_error(f: &[u8], src: &str, dst: &str, quoted: &[u8]) {
    assert_eq!(&f[22..38], &ip6(src).octets(), "outer source");
    assert_eq!(&f[38..54], &ip6(dst).octets(), "outer destination");
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&f[22..54]);
    pseudo.extend_from_slice(&((f.len() - 54) as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&f[54..]);
    assert_eq!(csum(&pseudo), 0, "ICMPv6 checksum");
    assert_eq!(
        &f[62 + 8..62 + 40],
        &quoted[14 + 8..14 + 40],
        "quoted addresses"
    );
    assert_eq!(&f[102..106], &quoted[54..58], "quoted ports");
}

//! BPF_PROG_TEST_RUN tests of the overlay in tc (`CP_PARAM_F_TC_TUNNEL`,
//! `bpf/encap.h`): from_pod and to_overlay build the VXLAN headers the
//! device would and hand the frame to the uplink; from_uplink checks the
//! sender and the VNI of what arrives for this node, decapsulates what is for
//! a local pod and delivers it, and leaves everything else to the device.
//! Unlike the device path's tests, these see real tunnel headers: the test
//! run hands the frame back as the programs left it. Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, Endpoint, EpKey, Params, Port, Remote, OVERLAY_MAC,
    PARAM_F_KERNEL_LOCAL, PARAM_F_TC_TUNNEL, VNI_DEFAULT, VTEP_F_NODE, VXLAN_PORT,
};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const VXLAN_IF: u32 = 5;
const UPLINK_IF: u32 = 2;
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2);
/// A pod on NODE2, known to this node.
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const REMOTE_POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 7);
/// A pod on no node this one knows.
const NOBODY: Ipv4Addr = Ipv4Addr::new(10, 244, 9, 9);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
/// Reaches UDP 4789 but is no node of the cluster.
const STRANGER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const NODE2_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
/// This node's inner source MAC: 02:cf:<node IPv4>.
const NODE_INNER_MAC: [u8; 6] = [0x02, 0xcf, 10, 250, 0, 1];
const VXLAN_ROOM: usize = 50;

/// This node (NODE, tc mode unless `flags` says otherwise) with one local
/// pod (v4 and v6), REMOTE_POD(6) on NODE2, and NODE2 as the only known
/// tunnel endpoint.
fn node(test: &str, flags: u32) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        flags,
        ..Params::default()
    })
    .unwrap();
    add_local_pod(&mut dp, POD_IF, POD, POD_MAC);
    dp.locals
        .insert(
            &EpKey::new(0, std::net::IpAddr::V6(POD6)),
            &Endpoint {
                ifindex: POD_IF,
                mac: POD_MAC,
                flags: 0,
            },
        )
        .unwrap();
    for ip in [REMOTE_POD.into(), std::net::IpAddr::V6(REMOTE_POD6)] {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        dp.remotes
            .insert(&lpm_key(0, ip, bits).unwrap(), &Remote::new(NODE2))
            .unwrap();
    }
    dp.node_remotes
        .insert(&Addr128::from_v4(NODE2), &Remote::new(NODE2))
        .unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.arm_tc_decap().unwrap();
    (pins, dp)
}

/// `inner` (an Ethernet frame) as another node's VXLAN to `dst` would carry it.
fn vxlan(sender: Ipv4Addr, dst: Ipv4Addr, vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut inner = inner.to_vec();
    inner[0..6].copy_from_slice(&OVERLAY_MAC);
    inner[6..12].copy_from_slice(&[0x02, 0xcf, 10, 250, 0, 2]);
    let udp_len = (8 + 8 + inner.len()) as u16;
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = PROTO_UDP;
    ip[12..16].copy_from_slice(&sender.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&UPLINK_MAC);
    f.extend_from_slice(&NODE2_MAC);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&50123u16.to_be_bytes());
    f.extend_from_slice(&VXLAN_PORT.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&0x0800_0000u32.to_be_bytes());
    f.extend_from_slice(&(vni << 8).to_be_bytes());
    f.extend_from_slice(&inner);
    f
}

fn from_uplink(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(
        dp,
        Program::FromUplink,
        frame,
        Ctx {
            ingress_ifindex: UPLINK_IF,
            ..Ctx::default()
        },
    )
}

fn from_pod(dp: &mut Datapath, frame: &[u8]) -> Run {
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

/// Checks `out` is `inner` in VXLAN from NODE to `remote` on `vni`, as the
/// device would have sent it, and returns the outer UDP source port.
fn assert_vxlan(out: &[u8], inner: &[u8], remote: Ipv4Addr, vni: u32) -> u16 {
    assert_eq!(out.len(), inner.len() + VXLAN_ROOM, "50 bytes of headers");
    assert_eq!(&out[12..14], &[0x08, 0x00], "outer ethertype IPv4");
    let ip = &out[14..34];
    assert_eq!(ip[0], 0x45, "IPv4 without options");
    assert_eq!(
        usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        out.len() - 14,
        "outer total length"
    );
    assert_eq!(ip[6] & 0x40, 0x40, "DF: the pod MTU leaves the room");
    assert_eq!(ip[8], 64, "TTL");
    assert_eq!(ip[9], PROTO_UDP);
    assert_eq!(csum(ip), 0, "outer header checksum");
    assert_eq!(Ipv4Addr::from([ip[12], ip[13], ip[14], ip[15]]), NODE);
    assert_eq!(Ipv4Addr::from([ip[16], ip[17], ip[18], ip[19]]), remote);
    let udp = &out[34..42];
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    assert!(sport >= 49152, "source port {sport} in 49152-65535");
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), VXLAN_PORT);
    assert_eq!(
        usize::from(u16::from_be_bytes([udp[4], udp[5]])),
        out.len() - 34,
        "UDP length"
    );
    assert_eq!(&udp[6..8], &[0, 0], "no outer UDP checksum (IPv4)");
    assert_eq!(&out[42..46], &0x0800_0000u32.to_be_bytes(), "I flag");
    assert_eq!(&out[46..50], &(vni << 8).to_be_bytes(), "VNI");
    assert_eq!(
        &out[50..56],
        &OVERLAY_MAC,
        "inner destination: the overlay MAC"
    );
    assert_eq!(&out[56..62], &NODE_INNER_MAC, "inner source: this node's");
    assert_eq!(&out[62..64], &inner[12..14], "inner ethertype");
    assert_eq!(&out[64..], &inner[14..], "the packet itself untouched");
    sport
}

#[test]
fn from_pod_encapsulates_in_tc_and_sends_to_the_uplink() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-encap", PARAM_F_TC_TUNNEL);
    let inner = Ip4::tcp(POD, 40000, REMOTE_POD, 80).frame(GW_MAC, POD_MAC);
    let r = from_pod(&mut dp, &inner);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let sport = assert_vxlan(&r.data, &inner, NODE2, VNI_DEFAULT);
    let e = dp.test_encap().unwrap().expect("recorded");
    assert_eq!(e.ifindex, UPLINK_IF, "to the uplink, not the VXLAN device");
    assert_eq!(r.mark & 0x0080_0000, 0, "no device hand-off mark");

    // one flow keeps its outer source port (one underlay path, one RSS
    // queue); the set of flows spreads over several
    let again = from_pod(&mut dp, &inner);
    assert_eq!(assert_vxlan(&again.data, &inner, NODE2, VNI_DEFAULT), sport);
    let ports: std::collections::BTreeSet<u16> = (0..32)
        .map(|i| {
            let f = Ip4::tcp(POD, 41000 + i, REMOTE_POD, 80).frame(GW_MAC, POD_MAC);
            assert_vxlan(&from_pod(&mut dp, &f).data, &f, NODE2, VNI_DEFAULT)
        })
        .collect();
    assert!(ports.len() > 8, "flows spread over source ports: {ports:?}");

    // IPv6 inside IPv4: the outer frame says IPv4, the inner one IPv6
    let inner6 = ip6_frame(POD6, REMOTE_POD6, PROTO_UDP, &udp6(5353, 53));
    let r = from_pod(&mut dp, &inner6);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_vxlan(&r.data, &inner6, NODE2, VNI_DEFAULT);
    assert_eq!(&r.data[62..64], &[0x86, 0xdd]);

    // the node's own traffic into the overlay: to_overlay, same headers
    let node_pkt = Ip4::udp(NODE, 5000, REMOTE_POD, 53).frame(OVERLAY_MAC, OVERLAY_MAC);
    let r = run(&mut dp, Program::ToOverlay, &node_pkt, Ctx::default());
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_vxlan(&r.data, &node_pkt, NODE2, VNI_DEFAULT);
}

#[test]
fn device_mode_leaves_the_headers_to_the_vxlan_device() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-device", 0);
    let inner = Ip4::tcp(POD, 40000, REMOTE_POD, 80).frame(GW_MAC, POD_MAC);
    let r = from_pod(&mut dp, &inner);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(r.data.len(), inner.len(), "no headers added in tc");
    assert_eq!(dp.test_encap().unwrap().map(|e| e.ifindex), Some(VXLAN_IF));
    // and VXLAN arriving on the uplink is the device's
    let f = vxlan(NODE2, NODE, VNI_DEFAULT, &inner_to_pod());
    let r = from_uplink(&mut dp, &f);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, f, "untouched");
    assert_eq!(dp.test_deliver().unwrap(), None);
}

/// REMOTE_POD -> POD, as NODE2 would send it.
fn inner_to_pod() -> Vec<u8> {
    Ip4::tcp(REMOTE_POD, 80, POD, 40000).frame(OVERLAY_MAC, NODE2_MAC)
}

#[test]
fn from_uplink_decapsulates_for_a_local_pod_and_delivers() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-decap", PARAM_F_TC_TUNNEL);
    let inner = inner_to_pod();
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &inner));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let d = dp.test_deliver().unwrap().expect("delivered");
    assert_eq!((d.ifindex, d.peer), (POD_IF, 1), "straight into the pod");
    assert_eq!(r.data.len(), inner.len(), "the outer headers are gone");
    assert_eq!(&r.data[0..6], &POD_MAC, "to the pod's MAC");
    assert_eq!(&r.data[12..], &inner[12..], "the packet itself untouched");

    // IPv6 inside
    let inner6 = {
        let mut f = ip6_frame(REMOTE_POD6, POD6, PROTO_UDP, &udp6(53, 5353));
        f[0..6].copy_from_slice(&OVERLAY_MAC);
        f
    };
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &inner6));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[12..14], &[0x86, 0xdd], "the inner ethertype");
    assert_eq!(&r.data[14..], &inner6[14..]);
    assert_eq!(dp.test_deliver().unwrap().map(|d| d.count), Some(2));

    // the headers tc builds are the ones tc takes off: a round trip
    let sent = from_pod(
        &mut dp,
        &Ip4::tcp(POD, 40000, REMOTE_POD, 80).frame(GW_MAC, POD_MAC),
    );
    let mut back = sent.data.clone();
    // as NODE2 would see it: to NODE2's address, from this node's; so take
    // NODE2's place by naming this node NODE2 and trusting NODE
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE2.octets(),
        flags: PARAM_F_TC_TUNNEL,
        ..Params::default()
    })
    .unwrap();
    dp.vteps.insert(&vtep_key(NODE), &VTEP_F_NODE).unwrap();
    add_local_pod(&mut dp, POD_IF + 2, REMOTE_POD, NODE2_MAC);
    back[0..6].copy_from_slice(&UPLINK_MAC);
    let r = from_uplink(&mut dp, &back);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(
        dp.test_deliver().unwrap().map(|d| d.ifindex),
        Some(POD_IF + 2)
    );
    assert_eq!(
        &r.data[14..],
        &sent.data[64..],
        "the packet as the pod sent it"
    );
}

#[test]
fn a_forged_sender_and_an_unknown_vni_are_dropped_and_counted() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-forged", PARAM_F_TC_TUNNEL);
    let inner = inner_to_pod();
    // a stranger that reaches UDP 4789, and this node's own address
    for (n, sender) in [STRANGER, NODE].into_iter().enumerate() {
        let r = from_uplink(&mut dp, &vxlan(sender, NODE, VNI_DEFAULT, &inner));
        assert_eq!(r.verdict, TC_ACT_SHOT, "from {sender}");
        assert_eq!(
            dp.drop_count(DropReason::UnknownVtep).unwrap(),
            n as u64 + 1
        );
    }
    // a node of the cluster, on a VNI this node does not serve
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, 4242, &inner));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVni).unwrap(), 1);
    // ... and once the VNI is withdrawn, net 0's too
    assert!(dp.vnis.remove(&VNI_DEFAULT).unwrap());
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &inner));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVni).unwrap(), 2);
    assert_eq!(dp.test_deliver().unwrap(), None, "nothing delivered");
    // a sender leaving the cluster is refused from then on
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    assert_eq!(
        from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &inner)).verdict,
        TC_ACT_REDIRECT
    );
    assert!(dp.vteps.remove(&vtep_key(NODE2)).unwrap());
    assert_eq!(
        from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &inner)).verdict,
        TC_ACT_SHOT
    );
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 3);
}

#[test]
fn until_the_decapsulation_is_armed_the_device_takes_the_overlay() {
    if !needs!().root().ready() {
        return;
    }
    // a fresh load with an empty cp_progs slot 1: what an older from_uplink
    // would call before this agent has written the node's maps
    let (_pins, mut dp) = load_test("tc-unarmed");
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        flags: PARAM_F_TC_TUNNEL,
        ..Params::default()
    })
    .unwrap();
    add_local_pod(&mut dp, POD_IF, POD, POD_MAC);
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    let f = vxlan(NODE2, NODE, VNI_DEFAULT, &inner_to_pod());
    let r = from_uplink(&mut dp, &f);
    assert_eq!(r.verdict, CP_PASS, "on to the VXLAN device");
    assert_eq!(r.data, f, "untouched");
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 0);
    // armed, the same packet is judged in tc: NODE2 is no known sender yet
    dp.arm_tc_decap().unwrap();
    assert_eq!(from_uplink(&mut dp, &f).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 1);
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    assert_eq!(from_uplink(&mut dp, &f).verdict, TC_ACT_REDIRECT);
}

#[test]
fn the_inner_packet_meets_the_same_checks_as_on_the_device_path() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-inner", PARAM_F_TC_TUNNEL);
    // a VPC: NODE2 claims a source that is no Port of net 100 there
    dp.vnis.insert(&100, &100).unwrap();
    dp.ports
        .insert(&(POD_IF + 1), &Port { net: 100, flags: 0 })
        .unwrap();
    dp.locals
        .insert(
            &EpKey::new(100, POD),
            &Endpoint {
                ifindex: POD_IF + 1,
                mac: POD_MAC,
                flags: 0,
            },
        )
        .unwrap();
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, 100, &inner_to_pod()));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::VpcSource).unwrap(), 1);
    // IPv6 link scope never crosses nodes
    let ll = ip6_frame("fe80::1".parse().unwrap(), POD6, PROTO_UDP, &udp6(53, 5353));
    let r = from_uplink(&mut dp, &vxlan(NODE2, NODE, VNI_DEFAULT, &ll));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LinkScope).unwrap(), 1);
    assert_eq!(dp.test_deliver().unwrap(), None);
}

#[test]
fn what_is_not_for_a_local_pod_goes_on_to_the_device() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("tc-pass", PARAM_F_TC_TUNNEL);
    let pass = |dp: &mut Datapath, f: &[u8], what: &str| {
        let r = from_uplink(dp, f);
        assert_eq!(r.verdict, CP_PASS, "{what}");
        assert_eq!(r.data, f, "{what}: untouched");
    };
    // for the node itself, or an address no local pod has
    let to_node = Ip4::udp(REMOTE_POD, 5353, NODE, 53).frame(OVERLAY_MAC, NODE2_MAC);
    pass(
        &mut dp,
        &vxlan(NODE2, NODE, VNI_DEFAULT, &to_node),
        "to the node",
    );
    let elsewhere = Ip4::udp(REMOTE_POD, 5353, NOBODY, 53).frame(OVERLAY_MAC, NODE2_MAC);
    pass(
        &mut dp,
        &vxlan(NODE2, NODE, VNI_DEFAULT, &elsewhere),
        "to no pod",
    );
    // VXLAN to another of the node's addresses, or with IP options
    pass(
        &mut dp,
        &vxlan(
            NODE2,
            Ipv4Addr::new(10, 250, 0, 99),
            VNI_DEFAULT,
            &inner_to_pod(),
        ),
        "to another address",
    );
    // the overlay port from a node that is no VXLAN (no I flag)
    let mut no_i = vxlan(NODE2, NODE, VNI_DEFAULT, &inner_to_pod());
    no_i[42] = 0;
    pass(&mut dp, &no_i, "no I flag");
    // plain traffic to the node
    let plain = Ip4::udp(NODE2, 4000, NODE, 4000).frame(UPLINK_MAC, NODE2_MAC);
    pass(&mut dp, &plain, "not VXLAN");
    assert_eq!(dp.test_deliver().unwrap(), None);
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 0);

    // with an iptables kube-proxy, net 0 goes through the kernel's conntrack
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        flags: PARAM_F_TC_TUNNEL | PARAM_F_KERNEL_LOCAL,
        ..Params::default()
    })
    .unwrap();
    pass(
        &mut dp,
        &vxlan(NODE2, NODE, VNI_DEFAULT, &inner_to_pod()),
        "kernel-local",
    );
    // ... but the sender check still runs first
    let r = from_uplink(
        &mut dp,
        &vxlan(STRANGER, NODE, VNI_DEFAULT, &inner_to_pod()),
    );
    assert_eq!(r.verdict, TC_ACT_SHOT);
}

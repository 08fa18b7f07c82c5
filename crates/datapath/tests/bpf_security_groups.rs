//! BPF_PROG_TEST_RUN tests of SecurityGroups (issue #10): the engine in
//! `bpf/policy.h` with the tracker in `bpf/ct.h`, through every path into
//! a pod (same node from `from_pod`, cross node from `from_overlay`, what
//! the kernel routes through `to_pod`) and egress at the source, and the
//! exemption of the node's flows through the fabric-IP bridge (both
//! families, both ways, and nothing that merely names the gateway). Each
//! verdict is asserted together with the drop counters by reason.
//!
//! The VPC is net 100 (a VPC's net is its VNI). Groups: `web` (id 1) and
//! `app` (id 2). `app` admits TCP 8000 from `web`, TCP 22 from
//! 10.1.0.4/32, TCP 23 from 10.1.0.0/24, UDP 5000-5010 and ICMP from
//! `web`; `web` may send TCP 8000-8001, UDP 5000-5010 and ICMP to `app`
//! and TCP 443 to 192.0.2.0/24.
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    port_range_prefixes, sg_cidr_key, sg_member_key, vtep_key, DropReason, Endpoint, EpKey, Params,
    Port, SgGroups, SgRule, CT_F_DST_OK, CT_F_SRC_OK, SG_EGRESS, SG_INGRESS, SG_PEER_CIDR,
    VTEP_F_NODE,
};
use cozyplane_datapath::{Datapath, Program};

const NET: u32 = 100;
const VNI: u32 = 100;
const WEB: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const APP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 3);
const OTHER: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 4);
const OTHER2: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
/// Pods on NODE2.
const REMOTE_WEB: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 9);
const REMOTE_NOGROUP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 77);
const WEB_IF: u32 = 20;
const APP_IF: u32 = 21;
const OTHER_IF: u32 = 22;
const OTHER2_IF: u32 = 23;
const APP_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x01, 0x00, 0x03];
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const GW: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

const G_WEB: u32 = 1;
const G_APP: u32 = 2;
const TCP: u8 = PROTO_TCP;
const UDP: u8 = PROTO_UDP;
const ICMP: u8 = PROTO_ICMP;

fn add_vpc_pod(dp: &mut Datapath, ifindex: u32, ip: Ipv4Addr) {
    dp.ports
        .insert(&ifindex, &Port { net: NET, flags: 0 })
        .unwrap();
    let mut mac = APP_MAC;
    mac[5] = ip.octets()[3];
    dp.locals
        .insert(
            &EpKey::new(NET, ip),
            &Endpoint {
                ifindex,
                mac,
                flags: 0,
            },
        )
        .unwrap();
}

fn member(dp: &mut Datapath, ip: Ipv4Addr, groups: &[u32]) {
    dp.sg
        .members
        .insert(
            &sg_member_key(NET, IpAddr::V4(ip)),
            &SgGroups::new(groups).unwrap(),
        )
        .unwrap();
}

/// `group` allows `dir` traffic with the peer `{peer_net, peer}`, protocol
/// `proto`, ports `lo..=hi` (what the agent's compiler writes).
#[allow(clippy::too_many_arguments)]
fn allow(
    dp: &mut Datapath,
    group: u32,
    dir: u8,
    peer_net: u32,
    peer: u32,
    proto: u8,
    lo: u16,
    hi: u16,
) {
    for (start, bits) in port_range_prefixes(lo, hi) {
        let rule = SgRule {
            net: NET,
            group,
            peer_net,
            peer,
            dir,
            proto,
            port: start.to_be_bytes(),
        };
        dp.sg.rules.insert(&rule.key(bits), &1).unwrap();
    }
}

/// `group`'s `dir` rules name `cidr/len` as CIDR class `class`.
fn cidr(dp: &mut Datapath, group: u32, dir: u8, cidr: &str, len: u8, class: u32) {
    let k = sg_cidr_key(NET, group, dir, cidr.parse().unwrap(), len).unwrap();
    dp.sg.cidrs.insert(&k, &class).unwrap();
}

/// This node: WEB (group web), APP (group app), OTHER and OTHER2 (no group)
/// on net 100; NODE2 a known sender with REMOTE_WEB (web) and
/// REMOTE_NOGROUP; the rules of the module docs.
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: 5,
        node_ip: [10, 250, 0, 1],
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip) in [
        (WEB_IF, WEB),
        (APP_IF, APP),
        (OTHER_IF, OTHER),
        (OTHER2_IF, OTHER2),
    ] {
        add_vpc_pod(&mut dp, ifindex, ip);
    }
    dp.vnis.insert(&VNI, &NET).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    // NODE2's Ports, as the agent compiles them (a VPC accepts a source only
    // as a Port of the node that sent it, bpf/vpc.h)
    for ip in [REMOTE_WEB, REMOTE_NOGROUP] {
        dp.remotes
            .insert(
                &cozyplane_datapath::abi::lpm_key(NET, ip.into(), 32).unwrap(),
                &cozyplane_datapath::abi::Remote::new(NODE2),
            )
            .unwrap();
    }
    member(&mut dp, WEB, &[G_WEB]);
    member(&mut dp, REMOTE_WEB, &[G_WEB]);
    member(&mut dp, APP, &[G_APP]);

    allow(&mut dp, G_APP, SG_INGRESS, NET, G_WEB, TCP, 8000, 8000);
    allow(&mut dp, G_APP, SG_INGRESS, NET, G_WEB, UDP, 5000, 5010);
    allow(&mut dp, G_APP, SG_INGRESS, NET, G_WEB, ICMP, 0, 255);
    // CIDR classes: 1 = 10.1.0.0/24 (TCP 23), 2 = 10.1.0.4/32, which lies
    // inside the /24 and so holds its ports too (TCP 22 and 23)
    cidr(&mut dp, G_APP, SG_INGRESS, "10.1.0.0", 24, 1);
    cidr(&mut dp, G_APP, SG_INGRESS, "10.1.0.4", 32, 2);
    allow(&mut dp, G_APP, SG_INGRESS, SG_PEER_CIDR, 1, TCP, 23, 23);
    allow(&mut dp, G_APP, SG_INGRESS, SG_PEER_CIDR, 2, TCP, 22, 23);

    allow(&mut dp, G_WEB, SG_EGRESS, NET, G_APP, TCP, 8000, 8001);
    allow(&mut dp, G_WEB, SG_EGRESS, NET, G_APP, UDP, 5000, 5010);
    allow(&mut dp, G_WEB, SG_EGRESS, NET, G_APP, ICMP, 0, 255);
    cidr(&mut dp, G_WEB, SG_EGRESS, "192.0.2.0", 24, 3);
    allow(&mut dp, G_WEB, SG_EGRESS, SG_PEER_CIDR, 3, TCP, 443, 443);
    (pins, dp)
}

fn from_pod(dp: &mut Datapath, ifindex: u32, pkt: &Ip4) -> i32 {
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
    .verdict
}

fn from_overlay_frame(dp: &mut Datapath, frame: &[u8]) -> i32 {
    run(
        dp,
        Program::FromOverlay,
        frame,
        Ctx {
            cb: [VNI, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
    .verdict
}

fn from_overlay(dp: &mut Datapath, pkt: &Ip4) -> i32 {
    from_overlay_frame(
        dp,
        &pkt.frame([2, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf], [2, 0, 0, 0, 0, 9]),
    )
}

/// What the kernel routes into the pod `pod` (node -> pod). test_run runs
/// on loopback (ifindex 1), so the pod's veth is loopback for this packet.
fn to_pod(dp: &mut Datapath, pod: Ipv4Addr, pkt: &Ip4) -> i32 {
    let key = EpKey::new(NET, pod);
    let ep = dp.locals.get(&key).unwrap().unwrap();
    dp.ports.insert(&1, &Port { net: NET, flags: 0 }).unwrap();
    dp.locals
        .insert(&key, &Endpoint { ifindex: 1, ..ep })
        .unwrap();
    let verdict = run(
        dp,
        Program::ToPod,
        &pkt.frame(APP_MAC, GW_MAC),
        Ctx::default(),
    )
    .verdict;
    dp.locals.insert(&key, &ep).unwrap();
    dp.ports.remove(&1).unwrap();
    verdict
}

/// The SG drop counters: (ingress, egress, no L4).
fn sg_drops(dp: &Datapath) -> (u64, u64, u64) {
    (
        dp.drop_count(DropReason::SgIngress).unwrap(),
        dp.drop_count(DropReason::SgEgress).unwrap(),
        dp.drop_count(DropReason::SgNoL4).unwrap(),
    )
}

#[test]
fn only_web_reaches_app_on_tcp_8000() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_8000");
    // a web member -> 8000: admitted on both sides, delivered into APP
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, APP, 8000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(sg_drops(&dp), (0, 0, 0));
    // 8001: web's egress allows it, app's ingress does not
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40001, APP, 8001)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (1, 0, 0));
    // a non-member (no group: its own egress is open) -> 8000
    assert_eq!(
        from_pod(&mut dp, OTHER_IF, &Ip4::tcp(OTHER, 40000, APP, 8000)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (2, 0, 0));
    // a web member on another node -> 8000 (cross node: from_overlay's gate)
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_WEB, 40000, APP, 8000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_WEB, 40000, APP, 8001)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_NOGROUP, 40000, APP, 8000)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (4, 0, 0));
    // The node reaches a VPC pod only through the fabric-IP bridge, whose
    // flows SecurityGroups exempt (the kubelet's probes; bpf_bridge.rs);
    // whatever else the kernel routes into a VPC port is refused before any
    // group is asked (bpf/vpc.h).
    let node_src = Ipv4Addr::new(10, 250, 0, 1);
    for src in [node_src, GW] {
        assert_eq!(
            to_pod(&mut dp, APP, &Ip4::tcp(src, 40000, APP, 8000)),
            TC_ACT_SHOT
        );
    }
    assert_eq!(dp.drop_count(DropReason::VpcKernelPath).unwrap(), 2);
    assert_eq!(sg_drops(&dp), (4, 0, 0));
    assert_eq!(dp.drop_count(DropReason::Misdelivered).unwrap(), 0);
}

#[test]
fn replies_of_an_admitted_flow_pass_and_nothing_else_does() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_reply");
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, APP, 8000)),
        TC_ACT_REDIRECT
    );
    // the flow is tracked once, with both sides' verdicts
    let ct = dp.sg.ct.entries().unwrap();
    assert_eq!(ct.len(), 1);
    assert_eq!(
        ct[0].1.flags & (CT_F_SRC_OK | CT_F_DST_OK),
        CT_F_SRC_OK | CT_F_DST_OK
    );
    // APP answers: app has no egress rule (default deny), WEB's ingress has
    // no rule for app, yet the reply passes both ways
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8000, WEB, 40000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(sg_drops(&dp), (0, 0, 0));
    // and the conversation goes on
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, APP, 8000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8000, WEB, 40000)),
        TC_ACT_REDIRECT
    );
    // what looks like a reply without a flow: APP from 8000 to another port
    // of WEB is new, and app's egress denies it at the source
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8000, WEB, 40001)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, 1, 0));

    // cross node: REMOTE_WEB's flow into APP; APP's reply is encapsulated
    // back to NODE2 (REMOTE_WEB's Port): app's egress lets it out
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_WEB, 41000, APP, 8000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8000, REMOTE_WEB, 41000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8000, REMOTE_WEB, 41001)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, 2, 0));

    // a flow APP's ingress refused leaves no reply path: WEB -> APP 8001
    // passed WEB's egress (tracked with WEB's verdict only), so APP's
    // "reply" is checked against app's egress and dropped
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40002, APP, 8001)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::tcp(APP, 8001, WEB, 40002)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (1, 3, 0));
}

#[test]
fn egress_is_enforced_at_the_source() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_egress");
    // OTHER has no group and admits anything, but WEB may not send to it
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, OTHER, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, 1, 0));
    // nor outside but 192.0.2.0/24 TCP 443
    let out = Ipv4Addr::new(192, 0, 2, 10);
    // (the group lets 443 out; the VPC has no way out yet, so isolation
    // drops it after the SecurityGroup admitted it: not an sg drop)
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, out, 443)),
        TC_ACT_SHOT
    );
    assert_eq!(dp.drop_count(DropReason::VpcIsolated).unwrap(), 1);
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, out, 80)),
        TC_ACT_SHOT
    );
    let elsewhere = Ipv4Addr::new(198, 51, 100, 1);
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, elsewhere, 443)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, 3, 0));
}

#[test]
fn port_ranges_admit_exactly_their_ports() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_range");
    let mut shot = 0;
    for (port, admitted) in [
        (4999, false),
        (5000, true),
        (5001, true),
        (5007, true),
        (5008, true),
        (5010, true),
        (5011, false),
        (6000, false),
    ] {
        let v = from_pod(&mut dp, WEB_IF, &Ip4::udp(WEB, 40000, APP, port));
        if admitted {
            assert_eq!(v, TC_ACT_REDIRECT, "UDP {port}");
        } else {
            assert_eq!(v, TC_ACT_SHOT, "UDP {port}");
            shot += 1;
        }
    }
    // web's egress range is the same 5000-5010, so the source drops first
    assert_eq!(sg_drops(&dp), (0, shot, 0));
    // TCP 8000-8001 egress, but only 8000 ingress: the range ends where it ends
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, APP, 8002)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, shot + 1, 0));
}

#[test]
fn cidr_peers_match_by_longest_prefix_with_the_ports_of_every_enclosing_rule() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_cidr");
    // OTHER (10.1.0.4/32): TCP 22 by its own rule, TCP 23 by the /24's
    assert_eq!(
        from_pod(&mut dp, OTHER_IF, &Ip4::tcp(OTHER, 40000, APP, 22)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, OTHER_IF, &Ip4::tcp(OTHER, 40000, APP, 23)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, OTHER_IF, &Ip4::tcp(OTHER, 40000, APP, 24)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (1, 0, 0));
    // another address of the /24 (a pod on NODE2, no group): 23 only
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_NOGROUP, 40000, APP, 23)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_NOGROUP, 40000, APP, 22)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (2, 0, 0));
    // a web member is also an address of the /24: CIDR rules match anyone
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::tcp(WEB, 40000, APP, 23)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (2, 1, 0), "web's egress has no rule for 23");
}

#[test]
fn icmp_echo_is_a_rule_and_its_reply_a_flow() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_icmp");
    assert_eq!(
        from_pod(&mut dp, WEB_IF, &Ip4::icmp_echo(WEB, APP, 7, false)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::icmp_echo(APP, WEB, 7, true)),
        TC_ACT_REDIRECT
    );
    assert_eq!(sg_drops(&dp), (0, 0, 0));
    // a reply to an echo nobody sent (another id) is a new packet: app may
    // not send ICMP at all
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::icmp_echo(APP, WEB, 8, true)),
        TC_ACT_SHOT
    );
    // APP may not ping WEB; OTHER may not ping APP
    assert_eq!(
        from_pod(&mut dp, APP_IF, &Ip4::icmp_echo(APP, WEB, 9, false)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (0, 2, 0));
    assert_eq!(
        from_pod(&mut dp, OTHER_IF, &Ip4::icmp_echo(OTHER, APP, 9, false)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (1, 2, 0));
}

#[test]
fn an_endpoint_in_no_group_is_unrestricted() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_nogroup");
    for dport in [1, 22, 8000, 65535] {
        assert_eq!(
            from_pod(&mut dp, OTHER_IF, &Ip4::tcp(OTHER, 40000, OTHER2, dport)),
            TC_ACT_REDIRECT
        );
        assert_eq!(
            from_overlay(&mut dp, &Ip4::udp(REMOTE_NOGROUP, 40000, OTHER2, dport)),
            TC_ACT_REDIRECT
        );
    }
    assert_eq!(
        from_pod(&mut dp, OTHER2_IF, &Ip4::icmp_echo(OTHER2, OTHER, 1, false)),
        TC_ACT_REDIRECT
    );
    assert_eq!(sg_drops(&dp), (0, 0, 0));
    assert!(
        dp.sg.ct.entries().unwrap().is_empty(),
        "unpoliced flows are not tracked"
    );
}

#[test]
fn a_policed_pod_drops_what_it_cannot_classify() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_frag");
    let later = with_frag(
        Ip4::udp(WEB, 40000, APP, 5000).frame(GW_MAC, POD_MAC),
        0x0010,
    );
    let v = run(
        &mut dp,
        Program::FromPod,
        &later,
        Ctx {
            ingress_ifindex: WEB_IF,
            ..Ctx::default()
        },
    )
    .verdict;
    assert_eq!(v, TC_ACT_SHOT);
    assert_eq!(sg_drops(&dp), (0, 0, 1));
    // an unpoliced pod's later fragment is not the engine's business
    let later = with_frag(
        Ip4::udp(OTHER, 40000, OTHER2, 5000).frame(GW_MAC, POD_MAC),
        0x0010,
    );
    let v = run(
        &mut dp,
        Program::FromPod,
        &later,
        Ctx {
            ingress_ifindex: OTHER_IF,
            ..Ctx::default()
        },
    )
    .verdict;
    assert_eq!(v, TC_ACT_REDIRECT);
    assert_eq!(sg_drops(&dp), (0, 0, 1));
}

#[test]
fn a_vpc_holds_far_more_than_62_groups() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_many");
    // 300 groups with ids spread over the 32-bit space; group k admits TCP
    // 7000 from group k-1 only
    let id = |k: u32| 1000 + k * 14_000_000;
    for k in 1..300 {
        allow(&mut dp, id(k), SG_INGRESS, 100, id(k - 1), TCP, 7000, 7000);
    }
    // OTHER2 is in group 299 (and 16 groups in all, the most an endpoint
    // holds); REMOTE_WEB moves into group 298, REMOTE_NOGROUP into 297
    let mut groups: Vec<u32> = (284..300).map(id).collect();
    groups.sort_unstable();
    member(&mut dp, OTHER2, &groups);
    member(&mut dp, REMOTE_WEB, &[id(298)]);
    member(&mut dp, REMOTE_NOGROUP, &[id(297)]);
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_WEB, 40000, OTHER2, 7000)),
        TC_ACT_REDIRECT
    );
    // 297 -> OTHER2: group 298 of OTHER2 admits 297, so this passes too
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_NOGROUP, 40000, OTHER2, 7000)),
        TC_ACT_REDIRECT
    );
    member(&mut dp, REMOTE_NOGROUP, &[id(100)]);
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_NOGROUP, 40001, OTHER2, 7000)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(REMOTE_WEB, 40001, OTHER2, 7001)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (2, 0, 0));
}

/// APP's fabric addresses (FabricIP claims), bridged to its VPC addresses.
const FABRIC: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 9);
const FABRIC6: &str = "fd00:10:244:1::9";
/// APP's IPv6 VPC address, a member of `app` like its IPv4 one.
const APP6: &str = "fd10::3";
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE6: &str = "fd00:99::1";
const GW6: &str = "fe80::1";
/// test_run runs `to_pod` on loopback: the bridged pod's veth.
const LO: u32 = 1;

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// APP, dual stack, moved onto loopback and bridged from its fabric
/// addresses (as `bpf_bridge.rs` sets a VPC pod up), both addresses members
/// of `app`, whose rules admit nothing from the node or the gateway.
fn bridge_app(dp: &mut Datapath) {
    dp.ports.insert(&LO, &Port { net: NET, flags: 0 }).unwrap();
    for ip in [IpAddr::V4(APP), IpAddr::V6(ip6(APP6))] {
        dp.locals
            .insert(
                &EpKey::new(NET, ip),
                &Endpoint {
                    ifindex: LO,
                    mac: APP_MAC,
                    flags: 0,
                },
            )
            .unwrap();
        dp.sg
            .members
            .insert(&sg_member_key(NET, ip), &SgGroups::new(&[G_APP]).unwrap())
            .unwrap();
    }
    dp.put_bridge(FABRIC.into(), NET, APP.into(), LO).unwrap();
    dp.put_bridge(ip6(FABRIC6).into(), NET, ip6(APP6).into(), LO)
        .unwrap();
}

/// An IPv6 TCP SYN (checksums are not looked at on these paths).
fn tcp6(src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = 0x02;
    ip6_frame(ip6(src), ip6(dst), PROTO_TCP, &h)
}

/// An ICMPv6 echo request (128) or reply (129) with identifier `id`.
fn echo6(src: &str, dst: &str, id: u16, reply: bool) -> Vec<u8> {
    let mut h = vec![if reply { 129 } else { 128 }, 0, 0, 0, 0, 0, 0, 1];
    h[4..6].copy_from_slice(&id.to_be_bytes());
    ip6_frame(ip6(src), ip6(dst), PROTO_ICMPV6, &h)
}

/// (source, destination, source port or echo id, destination port) of an
/// IPv6 frame.
fn addrs6(f: &[u8]) -> (Ipv6Addr, Ipv6Addr, u16, u16) {
    let a = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap());
    let (sport, dport) = if f[20] == PROTO_ICMPV6 {
        (u16::from_be_bytes([f[58], f[59]]), 0)
    } else {
        (
            u16::from_be_bytes([f[54], f[55]]),
            u16::from_be_bytes([f[56], f[57]]),
        )
    };
    (a(22), a(38), sport, dport)
}

/// The node's own packet into the bridged pod (no input device).
fn node_to_app(dp: &mut Datapath, frame: &[u8]) -> bpf_support::Run {
    run(dp, Program::ToPod, frame, Ctx::default())
}

/// The bridged pod's packet on its host veth.
fn from_app(dp: &mut Datapath, frame: &[u8]) -> bpf_support::Run {
    run(
        dp,
        Program::FromPod,
        frame,
        Ctx {
            ingress_ifindex: LO,
            ..Ctx::default()
        },
    )
}

#[test]
fn the_nodes_bridged_probes_pass_a_policed_pod_in_both_families() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_bridge");
    bridge_app(&mut dp);

    // IPv4: the kubelet's TCP probe of port 8080 (no rule admits it) and a
    // ping; each request is bridged in and its reply reversed to the node
    let r = node_to_app(
        &mut dp,
        &Ip4::tcp(NODE, 40000, FABRIC, 8080).frame(APP_MAC, GW_MAC),
    );
    assert_eq!(r.verdict, CP_PASS, "the probe is bridged into the pod");
    let p = parse(&r.data);
    assert_eq!((p.src, p.dst, p.dport), (GW, APP, 8080));
    let r = from_app(
        &mut dp,
        &Ip4::tcp(APP, 8080, GW, p.sport).frame(GW_MAC, APP_MAC),
    );
    assert_eq!(r.verdict, CP_PASS, "the pod's reply reaches the node");
    let p = parse(&r.data);
    assert_eq!((p.src, p.dst, p.dport), (FABRIC, NODE, 40000));
    let r = node_to_app(
        &mut dp,
        &Ip4::icmp_echo(NODE, FABRIC, 5, false).frame(APP_MAC, GW_MAC),
    );
    assert_eq!(r.verdict, CP_PASS);
    let id = parse(&r.data).sport;
    let r = from_app(
        &mut dp,
        &Ip4::icmp_echo(APP, GW, id, true).frame(GW_MAC, APP_MAC),
    );
    assert_eq!(r.verdict, CP_PASS, "the pod's echo reply reaches the node");
    assert_eq!((parse(&r.data).src, parse(&r.data).dst), (FABRIC, NODE));

    // IPv6 the same way, from fe80::1
    let r = node_to_app(&mut dp, &tcp6(NODE6, 40000, FABRIC6, 8080));
    assert_eq!(r.verdict, CP_PASS, "the IPv6 probe is bridged into the pod");
    let (src, dst, port, dport) = addrs6(&r.data);
    assert_eq!((src, dst, dport), (ip6(GW6), ip6(APP6), 8080));
    let r = from_app(&mut dp, &tcp6(APP6, 8080, GW6, port));
    assert_eq!(r.verdict, CP_PASS, "the pod's IPv6 reply reaches the node");
    let (src, dst, _, dport) = addrs6(&r.data);
    assert_eq!((src, dst, dport), (ip6(FABRIC6), ip6(NODE6), 40000));
    let r = node_to_app(&mut dp, &echo6(NODE6, FABRIC6, 5, false));
    assert_eq!(r.verdict, CP_PASS);
    let (_, _, id, _) = addrs6(&r.data);
    let r = from_app(&mut dp, &echo6(APP6, GW6, id, true));
    assert_eq!(
        r.verdict, CP_PASS,
        "the pod's ICMPv6 echo reply reaches the node"
    );
    assert_eq!(addrs6(&r.data).1, ip6(NODE6));

    assert_eq!(sg_drops(&dp), (0, 0, 0));
    assert!(
        dp.sg.ct.entries().unwrap().is_empty(),
        "bridged flows are exempt, not tracked"
    );
}

#[test]
fn only_bridged_flows_are_exempt_and_a_pod_cannot_forge_the_gateway() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("sg_bridge_forge");
    bridge_app(&mut dp);
    let no_deliveries = |dp: &Datapath| assert!(dp.test_deliver().unwrap().is_none());

    // A pod on this node claiming the gateway as its source, policed (WEB)
    // or not (OTHER): RPF refuses 169.254.1.1, the link-scope filter fe80::1
    // (a link-local source is for ND/MLD with the host veth only).
    for ifindex in [WEB_IF, OTHER_IF] {
        let forged = Ip4::tcp(GW, 40000, APP, 8080);
        assert_eq!(from_pod(&mut dp, ifindex, &forged), TC_ACT_SHOT);
        let forged6 = tcp6(GW6, 40000, APP6, 8080);
        let r = run(
            &mut dp,
            Program::FromPod,
            &forged6,
            Ctx {
                ingress_ifindex: ifindex,
                ..Ctx::default()
            },
        );
        assert_eq!(r.verdict, TC_ACT_SHOT);
    }
    assert_eq!(dp.drop_count(DropReason::Rpf).unwrap(), 2);
    assert_eq!(dp.drop_count(DropReason::LinkScope).unwrap(), 2);
    no_deliveries(&dp);
    // From another node: a VPC source must be a Port of the sending node.
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(GW, 40000, APP, 8080)),
        TC_ACT_SHOT
    );
    assert_eq!(dp.drop_count(DropReason::VpcSource).unwrap(), 1);
    // (IPv6 link scope never crosses nodes)
    let mut inner6 = tcp6(GW6, 40000, APP6, 8080);
    inner6[..6].copy_from_slice(&APP_MAC);
    assert_eq!(from_overlay_frame(&mut dp, &inner6), TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LinkScope).unwrap(), 3);
    no_deliveries(&dp);
    assert_eq!(
        sg_drops(&dp),
        (0, 0, 0),
        "refused before any group is asked"
    );

    // Were the gateway ever a VPC source (it cannot be: link-local VPC
    // CIDRs are refused), its packets would get no exemption: only the
    // bridge's own flows have one.
    dp.remotes
        .insert(
            &cozyplane_datapath::abi::lpm_key(NET, GW.into(), 32).unwrap(),
            &cozyplane_datapath::abi::Remote::new(NODE2),
        )
        .unwrap();
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(GW, 40000, APP, 8080)),
        TC_ACT_SHOT
    );
    assert_eq!(sg_drops(&dp), (1, 0, 0), "judged by app's rules");
    no_deliveries(&dp);

    // The policed pod's own packets to the gateway that reply to no bridged
    // flow are judged by its egress rules (IPv4) or the link-scope filter
    // (IPv6), as before.
    let r = from_app(
        &mut dp,
        &Ip4::tcp(APP, 8080, GW, 1024).frame(GW_MAC, APP_MAC),
    );
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(sg_drops(&dp), (1, 1, 0));
    let r = from_app(&mut dp, &tcp6(APP6, 8080, GW6, 1024));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LinkScope).unwrap(), 4);
}

//! BPF_PROG_TEST_RUN tests of NetworkPolicy (issue #12): the engine in
//! `bpf/netpol.h` with the tracker in `bpf/ct.h`, through every path into a
//! pod (same node from `from_pod`, cross node from `from_overlay`, what the
//! kernel routes through `to_pod`) and egress at the source. The maps are
//! written by the real sync (`NpMaps::sync`), so every change bumps the
//! epoch as the agent's does. Each verdict is asserted together with the
//! drop counters by reason.
//!
//! Net 0. This node: A (identity 1), B (2), C (3); node2 (10.250.0.2) has
//! R (4, 10.244.2.2) and R2 (no identity, 10.244.2.3).
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, np_cidr_key, np_ep_key, port_range_prefixes, vtep_key, Addr128, DropReason, NpEp,
    NpMatch, NpRule, Params, Remote, CT_F_NP_DST, CT_F_NP_NODE, CT_F_NP_SRC, NP_EGRESS,
    NP_F_DENY_IN, NP_F_ISOLATED_IN, NP_F_ISOLATED_OUT, NP_INGRESS, NP_PEER_ANY, NP_PEER_CIDR,
    VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::netpol::NpDesired;
use cozyplane_datapath::{Datapath, Program};

const A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const C: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 4);
const R: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const R2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 3);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const WORLD: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const A_IF: u32 = 20;
const B_IF: u32 = 21;
const C_IF: u32 = 22;
const ID_A: u32 = 1;
const ID_B: u32 = 2;
const ID_C: u32 = 3;
const ID_R: u32 = 4;
const TCP: u8 = PROTO_TCP;
const UDP: u8 = PROTO_UDP;
const SCTP: u8 = 132;

fn mac(ip: Ipv4Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x0a, 0x58, o[0], o[1], o[2], o[3]]
}

fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: 5,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip) in [(A_IF, A), (B_IF, B), (C_IF, C)] {
        add_local_pod(&mut dp, ifindex, ip, mac(ip));
    }
    let cidr = lpm_key(0, "10.244.2.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
    dp.node_remotes
        .insert(&Addr128::from_v4(NODE2), &Remote::new(NODE2))
        .unwrap();
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    (pins, dp)
}

/// The policy state, built up like the agent's compile.
#[derive(Default, Clone)]
struct Policy(NpDesired);

impl Policy {
    /// Every pod with its identity; `isolated` maps a pod to its flags.
    fn new(isolated: &[(Ipv4Addr, u32)]) -> Self {
        let mut p = Self::default();
        for (ip, id) in [(A, ID_A), (B, ID_B), (C, ID_C), (R, ID_R)] {
            let flags = isolated
                .iter()
                .filter(|(i, _)| *i == ip)
                .map(|(_, f)| *f)
                .sum();
            p.0.eps
                .insert(np_ep_key(IpAddr::V4(ip)), NpEp { id, flags });
        }
        p
    }

    /// `subject` admits `dir` traffic with `peer` on `proto` ports `lo..=hi`.
    fn allow(mut self, subject: u32, dir: u8, peer: u32, proto: u8, lo: u16, hi: u16) -> Self {
        for (start, bits) in port_range_prefixes(lo, hi) {
            let what = NpMatch::Ports { proto, start, bits };
            self.0
                .rules
                .insert(NpRule::key(subject, dir, peer, what).into(), 1);
        }
        self
    }

    /// `subject` admits every protocol and port with `peer`.
    fn allow_all(mut self, subject: u32, dir: u8, peer: u32) -> Self {
        self.0
            .rules
            .insert(NpRule::key(subject, dir, peer, NpMatch::Any).into(), 1);
        self
    }

    /// `subject`'s `dir` rules name `cidr/len` as CIDR class `class`.
    fn cidr(mut self, subject: u32, dir: u8, cidr: &str, len: u8, class: u32) -> Self {
        let k = np_cidr_key(subject, dir, cidr.parse().unwrap(), len).unwrap();
        self.0.cidrs.insert(k.into(), class);
        self
    }

    /// `subject` refuses `dir` traffic with `peer` on `what` (a deny rule).
    fn deny(mut self, subject: u32, dir: u8, peer: u32, what: NpMatch) -> Self {
        self.0
            .deny
            .insert(NpRule::key(subject, dir, peer, what).into(), 1);
        self
    }

    fn apply(&self, dp: &mut Datapath) {
        let r = dp.np.sync(&self.0).unwrap();
        assert!(r.converged(), "{:?}", r.failures);
    }
}

fn from_pod_frame(dp: &mut Datapath, ifindex: u32, frame: &[u8]) -> i32 {
    run(
        dp,
        Program::FromPod,
        frame,
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
    .verdict
}

fn from_pod(dp: &mut Datapath, ifindex: u32, pkt: &Ip4) -> i32 {
    from_pod_frame(dp, ifindex, &pkt.frame(GW_MAC, POD_MAC))
}

fn from_overlay(dp: &mut Datapath, pkt: &Ip4) -> i32 {
    run(
        dp,
        Program::FromOverlay,
        &pkt.frame([2, 0xcf, 0xcf, 0xcf, 0xcf, 0xcf], [2, 0, 0, 0, 0, 9]),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
    .verdict
}

/// What the kernel routes into `pod`: from the node itself
/// (`ingress_ifindex` 0) or forwarded from device `from`. test_run runs on
/// loopback (ifindex 1), so the pod's veth is loopback for this packet.
fn to_pod(dp: &mut Datapath, pod: Ipv4Addr, from: u32, frame: &[u8]) -> i32 {
    use cozyplane_datapath::abi::{Endpoint, EpKey, Port};
    let key = EpKey::new(0, pod);
    let ep = dp.locals.get(&key).unwrap().unwrap();
    dp.ports.insert(&1, &Port { net: 0, flags: 0 }).unwrap();
    dp.locals
        .insert(&key, &Endpoint { ifindex: 1, ..ep })
        .unwrap();
    let verdict = run(
        dp,
        Program::ToPod,
        frame,
        Ctx {
            ingress_ifindex: from,
            ..Ctx::default()
        },
    )
    .verdict;
    dp.locals.insert(&key, &ep).unwrap();
    dp.ports.remove(&1).unwrap();
    verdict
}

/// The NetworkPolicy drop counters: (ingress, egress, no L4).
fn np_drops(dp: &Datapath) -> (u64, u64, u64) {
    (
        dp.drop_count(DropReason::NpIngress).unwrap(),
        dp.drop_count(DropReason::NpEgress).unwrap(),
        dp.drop_count(DropReason::NpNoL4).unwrap(),
    )
}

/// An SCTP packet: a UDP one with the protocol changed (the common header
/// starts with the same two ports).
fn sctp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut f = Ip4::udp(src, sport, dst, dport).frame(GW_MAC, POD_MAC);
    f[14 + 9] = SCTP;
    fix_ip4_csum(&mut f);
    f
}

/// An ICMP destination-unreachable (port) from `src` to `dst` quoting the
/// first 28 bytes of `quoted` (an Ethernet frame).
fn icmp_unreachable(src: Ipv4Addr, dst: Ipv4Addr, quoted: &[u8]) -> Vec<u8> {
    let mut f = Ip4::icmp_echo(src, dst, 0, false).frame(GW_MAC, POD_MAC);
    f.truncate(14 + 20);
    let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&quoted[14..14 + 28]);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&icmp);
    let len = (20 + icmp.len()) as u16;
    f[14 + 2..14 + 4].copy_from_slice(&len.to_be_bytes());
    fix_ip4_csum(&mut f);
    f
}

#[test]
fn an_isolated_pod_admits_what_its_policies_allow_on_every_path() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_paths");
    // B: ingress from A on TCP 80-81, from anyone on UDP 53, from
    // 10.244.2.0/24 except 10.244.2.2/32 on TCP 443
    Policy::new(&[(B, NP_F_ISOLATED_IN)])
        .allow(ID_B, NP_INGRESS, ID_A, TCP, 80, 81)
        .allow(ID_B, NP_INGRESS, NP_PEER_ANY, UDP, 53, 53)
        .cidr(ID_B, NP_INGRESS, "10.244.2.0", 24, 1)
        .cidr(ID_B, NP_INGRESS, "10.244.2.2", 32, 2)
        .allow(ID_B, NP_INGRESS, NP_PEER_CIDR | 1, TCP, 443, 443)
        .apply(&mut dp);

    // same node
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40001, B, 81)),
        TC_ACT_REDIRECT
    );
    assert_eq!(np_drops(&dp), (0, 0, 0));
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40002, B, 82)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 40000, B, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(np_drops(&dp), (2, 0, 0));
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::udp(C, 40000, B, 53)),
        TC_ACT_REDIRECT
    );
    // an unisolated pod takes anything
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 40000, A, 9999)),
        TC_ACT_REDIRECT
    );

    // cross node: R has an identity but no rule; R2 is in the CIDR
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(R, 40000, B, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(R, 40000, B, 443)),
        TC_ACT_SHOT,
        "the except masks R inside the /24"
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::tcp(R2, 40000, B, 443)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_overlay(&mut dp, &Ip4::udp(R, 40000, B, 53)),
        TC_ACT_REDIRECT
    );
    assert_eq!(np_drops(&dp), (4, 0, 0));

    // what the kernel forwards into B (from the uplink, ifindex 3) is
    // judged; what the node itself sends (the kubelet's probes) is not
    let world = Ip4::tcp(WORLD, 40000, B, 80).frame(mac(B), GW_MAC);
    assert_eq!(to_pod(&mut dp, B, 3, &world), TC_ACT_SHOT);
    assert_eq!(np_drops(&dp), (5, 0, 0));
    let probe = Ip4::tcp(NODE, 40000, B, 8080).frame(mac(B), GW_MAC);
    assert_eq!(to_pod(&mut dp, B, 0, &probe), CP_PASS);
    assert_eq!(np_drops(&dp), (5, 0, 0));

    // SCTP by port
    Policy::new(&[(B, NP_F_ISOLATED_IN)])
        .allow(ID_B, NP_INGRESS, ID_A, SCTP, 9999, 9999)
        .apply(&mut dp);
    assert_eq!(
        from_pod_frame(&mut dp, A_IF, &sctp(A, 5000, B, 9999)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod_frame(&mut dp, A_IF, &sctp(A, 5000, B, 9998)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::udp(A, 5000, B, 9999)),
        TC_ACT_SHOT,
        "SCTP 9999 is not UDP 9999"
    );
    // a later fragment has no ports to judge: an isolated pod refuses it
    let frag = with_frag(Ip4::udp(A, 5000, B, 9999).frame(GW_MAC, POD_MAC), 64);
    assert_eq!(from_pod_frame(&mut dp, A_IF, &frag), TC_ACT_SHOT);
    assert_eq!(np_drops(&dp), (7, 0, 1));
}

#[test]
fn egress_is_judged_at_the_source_before_any_path() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_egress");
    // A may send TCP 80 to C and anything to 192.0.2.0/24; nothing else
    Policy::new(&[(A, NP_F_ISOLATED_OUT)])
        .allow(ID_A, NP_EGRESS, ID_C, TCP, 80, 80)
        .cidr(ID_A, NP_EGRESS, "192.0.2.0", 24, 1)
        .allow_all(ID_A, NP_EGRESS, NP_PEER_CIDR | 1)
        .apply(&mut dp);
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, C, 80)),
        TC_ACT_REDIRECT
    );
    // same node, cross node, the node: all refused at A's egress
    for dst in [B, R, NODE2] {
        assert_eq!(
            from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, dst, 80)),
            TC_ACT_SHOT,
            "{dst}"
        );
    }
    assert_eq!(np_drops(&dp), (0, 3, 0));
    // the world in the CIDR, any protocol
    assert_ne!(
        from_pod(&mut dp, A_IF, &Ip4::udp(A, 40000, WORLD, 5353)),
        TC_ACT_SHOT
    );
    assert_ne!(
        from_pod(&mut dp, A_IF, &Ip4::icmp_echo(A, WORLD, 7, false)),
        TC_ACT_SHOT
    );
    assert_eq!(np_drops(&dp), (0, 3, 0));
}

#[test]
fn replies_of_admitted_flows_pass_and_an_unsolicited_reply_does_not() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_replies");
    // A and B isolated both ways; B admits TCP 80 and ICMP-less UDP 53
    // from A; A may send them. Neither admits anything else.
    Policy::new(&[
        (A, NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT),
        (B, NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT),
    ])
    .allow(ID_A, NP_EGRESS, ID_B, TCP, 80, 80)
    .allow(ID_A, NP_EGRESS, ID_B, UDP, 53, 53)
    .allow(ID_B, NP_INGRESS, ID_A, TCP, 80, 80)
    .allow(ID_B, NP_INGRESS, ID_A, UDP, 53, 53)
    .apply(&mut dp);

    let mut syn = Ip4::tcp(A, 40000, B, 80);
    syn.tcp_flags = 0x02;
    assert_eq!(from_pod(&mut dp, A_IF, &syn), TC_ACT_REDIRECT);
    // one entry, both sides' verdicts on it
    let ct = dp.sg.ct.entries().unwrap();
    assert_eq!(ct.len(), 1);
    assert_eq!(
        ct[0].1.flags & (CT_F_NP_SRC | CT_F_NP_DST),
        CT_F_NP_SRC | CT_F_NP_DST
    );
    // B answers: B's egress and A's ingress have no rule for it, yet it
    // passes both (the flow's originating direction is admitted)
    let mut synack = Ip4::tcp(B, 80, A, 40000);
    synack.tcp_flags = 0x12;
    assert_eq!(from_pod(&mut dp, B_IF, &synack), TC_ACT_REDIRECT);
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 80, A, 40000)),
        TC_ACT_REDIRECT
    );
    assert_eq!(np_drops(&dp), (0, 0, 0));
    // an ACK that looks like a reply but has no flow: refused at B's egress
    let mut ack = Ip4::tcp(B, 80, A, 40001);
    ack.tcp_flags = 0x10;
    assert_eq!(from_pod(&mut dp, B_IF, &ack), TC_ACT_SHOT);
    assert_eq!(np_drops(&dp), (0, 1, 0));
    // the same ACK from a remote pod, into A: refused at A's ingress
    let mut ack = Ip4::tcp(R, 80, A, 40000);
    ack.tcp_flags = 0x10;
    assert_eq!(from_overlay(&mut dp, &ack), TC_ACT_SHOT);
    assert_eq!(np_drops(&dp), (1, 1, 0));

    // UDP: A's query and B's answer pass; B's ICMP error about A's query
    // (port unreachable) passes too, though no rule admits ICMP
    let query = Ip4::udp(A, 5353, B, 53);
    assert_eq!(from_pod(&mut dp, A_IF, &query), TC_ACT_REDIRECT);
    assert_eq!(
        from_pod(&mut dp, B_IF, &Ip4::udp(B, 53, A, 5353)),
        TC_ACT_REDIRECT
    );
    let quoted = query.frame(GW_MAC, POD_MAC);
    assert_eq!(
        from_pod_frame(&mut dp, B_IF, &icmp_unreachable(B, A, &quoted)),
        TC_ACT_REDIRECT
    );
    assert_eq!(np_drops(&dp), (1, 1, 0));
    // an error quoting a flow that never was is judged as plain ICMP: refused
    let never = Ip4::udp(A, 5999, B, 53).frame(GW_MAC, POD_MAC);
    assert_eq!(
        from_pod_frame(&mut dp, B_IF, &icmp_unreachable(B, A, &never)),
        TC_ACT_SHOT
    );
    assert_eq!(np_drops(&dp), (1, 2, 0));
}

#[test]
fn a_policy_change_keeps_flows_it_admits_and_cuts_those_it_denies() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_change");
    // no policy: A -> B:80, C -> B:80 and B -> C:9000 are established
    Policy::new(&[]).apply(&mut dp);
    for (ifindex, pkt) in [
        (A_IF, Ip4::tcp(A, 40000, B, 80)),
        (B_IF, Ip4::tcp(B, 80, A, 40000)),
        (C_IF, Ip4::tcp(C, 40000, B, 80)),
        (B_IF, Ip4::tcp(B, 80, C, 40000)),
        (B_IF, Ip4::tcp(B, 41000, C, 9000)),
        (C_IF, Ip4::tcp(C, 9000, B, 41000)),
    ] {
        assert_eq!(from_pod(&mut dp, ifindex, &pkt), TC_ACT_REDIRECT);
    }
    // every flow is tracked though nothing is policed
    assert_eq!(dp.sg.ct.entries().unwrap().len(), 3);

    // now B admits TCP 80 from A only (ingress; egress stays open)
    Policy::new(&[(B, NP_F_ISOLATED_IN)])
        .allow(ID_B, NP_INGRESS, ID_A, TCP, 80, 80)
        .apply(&mut dp);
    // A's flow goes on both ways
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 80, A, 40000)),
        TC_ACT_REDIRECT
    );
    // C's established flow is cut, in both directions
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 40000, B, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 80, C, 40000)),
        TC_ACT_SHOT
    );
    // B's own flow to C keeps its replies: ingress isolation is about
    // flows others open
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 9000, B, 41000)),
        TC_ACT_REDIRECT
    );
    // (the answer was refused at B's own hook: its egress side of the gate)
    assert_eq!(np_drops(&dp), (1, 1, 0));

    // the policy goes away: C's flow is admitted again
    Policy::new(&[]).apply(&mut dp);
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 40000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(np_drops(&dp), (1, 1, 0));
}

#[test]
fn the_node_reaches_an_isolated_pod_and_the_pod_answers_it() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_node");
    // B is isolated both ways and admits nothing
    Policy::new(&[(B, NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT)]).apply(&mut dp);
    let probe = Ip4::tcp(NODE, 45000, B, 8080);
    assert_eq!(to_pod(&mut dp, B, 0, &probe.frame(mac(B), GW_MAC)), CP_PASS);
    let ct = dp.sg.ct.entries().unwrap();
    assert_eq!(ct.len(), 1);
    assert_ne!(ct[0].1.flags & CT_F_NP_NODE, 0);
    // B's answer goes out though its egress admits nothing, and stays
    // admitted after a policy change
    assert_ne!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 8080, NODE, 45000)),
        TC_ACT_SHOT
    );
    Policy::new(&[(B, NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT)])
        .allow(ID_B, NP_INGRESS, ID_C, TCP, 1, 1)
        .apply(&mut dp);
    assert_ne!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 8080, NODE, 45000)),
        TC_ACT_SHOT
    );
    // B itself may not open a flow to the node
    assert_eq!(
        from_pod(&mut dp, B_IF, &Ip4::tcp(B, 8081, NODE, 10250)),
        TC_ACT_SHOT
    );
    // the same source forwarded by the kernel (not the node's own packet)
    // is judged: refused
    let forwarded = Ip4::tcp(NODE, 46000, B, 8080).frame(mac(B), GW_MAC);
    assert_eq!(to_pod(&mut dp, B, 3, &forwarded), TC_ACT_SHOT);
    assert_eq!(np_drops(&dp), (1, 1, 0));
}

#[test]
fn a_deny_rule_refuses_over_every_allow_isolated_or_not() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_deny");
    // B: not isolated, refuses A on TCP 80; C: isolated, admits anyone,
    // refuses UDP from anyone
    Policy::new(&[(B, NP_F_DENY_IN), (C, NP_F_ISOLATED_IN | NP_F_DENY_IN)])
        .deny(
            ID_B,
            NP_INGRESS,
            ID_A,
            NpMatch::Ports {
                proto: TCP,
                start: 80,
                bits: 16,
            },
        )
        .allow_all(ID_C, NP_INGRESS, NP_PEER_ANY)
        .deny(ID_C, NP_INGRESS, NP_PEER_ANY, NpMatch::Proto(UDP))
        .apply(&mut dp);
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 41000, B, 80)),
        TC_ACT_SHOT
    );
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 41001, B, 81)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, C_IF, &Ip4::tcp(C, 41000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 41002, C, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::udp(A, 41000, C, 53)),
        TC_ACT_SHOT
    );
    assert_eq!(np_drops(&dp), (2, 0, 0));
    // the deny lifted: the established-looking retry of the refused flow
    // is a new flow, admitted
    Policy::new(&[]).apply(&mut dp);
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 41000, B, 80)),
        TC_ACT_REDIRECT
    );
}

/// The tracker is an LRU: a pod that opens flows fast enough evicts other
/// flows' entries. The documented rule (docs/policy.md, "Connection
/// tracking"): an evicted flow's next packet is a new flow, judged as one -
/// a reply into an isolated pod is then refused (fail closed), never
/// admitted; the pod's new connections are unaffected.
#[test]
fn a_flooded_tracker_evicts_fail_closed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("np_ct_flood");
    // A is isolated for ingress and admits nothing; its own flows out are
    // free, their replies admitted by the tracker
    Policy::new(&[(A, NP_F_ISOLATED_IN)]).apply(&mut dp);
    let reply = |dp: &mut Datapath| {
        let mut r = Ip4::tcp(B, 80, A, 40000);
        r.tcp_flags = 0x10; // ACK
        from_pod(dp, B_IF, &r)
    };
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40000, B, 80)),
        TC_ACT_REDIRECT
    );
    assert_eq!(reply(&mut dp), TC_ACT_REDIRECT, "a reply of A's flow");

    // C opens twice the tracker's capacity of flows to B (not isolated)
    let mut flood = Ip4::udp(C, 1, B, 1);
    for i in 0..131_072u32 {
        flood.sport = 1024 + (i % 60_000) as u16;
        flood.dport = 1 + (i / 60_000) as u16;
        assert_eq!(from_pod(&mut dp, C_IF, &flood), TC_ACT_REDIRECT);
    }
    let before = np_drops(&dp).0;
    // A's entry is gone: B's next packet is a new flow into an isolated pod
    assert_eq!(reply(&mut dp), TC_ACT_SHOT, "fail closed after eviction");
    assert_eq!(np_drops(&dp).0, before + 1);
    // a new connection of A's is tracked anew and its replies pass
    assert_eq!(
        from_pod(&mut dp, A_IF, &Ip4::tcp(A, 40001, B, 80)),
        TC_ACT_REDIRECT
    );
    let mut r = Ip4::tcp(B, 80, A, 40001);
    r.tcp_flags = 0x10;
    assert_eq!(from_pod(&mut dp, B_IF, &r), TC_ACT_REDIRECT);
}

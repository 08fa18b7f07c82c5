//! BPF_PROG_TEST_RUN tests of the node's own firewall (issue #12,
//! `bpf/hostfw.h`): the cgroup_skb programs `host_ingress`/`host_egress`
//! judging what the node's sockets receive and send, with NetworkPolicy's
//! maps under the host's pseudo identity, written by the real sync. Each
//! verdict (1 pass, 0 drop) is asserted with the drop counters.
//!
//! This node: 10.250.0.1, its pod A (10.244.1.2); node2: 10.250.0.2.
//!
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::{IpAddr, Ipv4Addr};

use aya::programs::{TestRun, TestRunOptions};
use bpf_support::*;
use cozyplane_datapath::abi::{
    np_cidr_key, np_ep_key, np_host_key, port_range_prefixes, Addr128, DropReason, NpEp, NpMatch,
    NpRule, Params, Remote, NP_EGRESS, NP_F_DENY_IN, NP_F_ISOLATED_IN, NP_F_ISOLATED_OUT,
    NP_HOST_ID, NP_INGRESS, NP_PEER_ANY, NP_PEER_CIDR,
};
use cozyplane_datapath::netpol::NpDesired;
use cozyplane_datapath::{Datapath, HostProgram};

const A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const WORLD: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const OPS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 9);
const TCP: u8 = PROTO_TCP;
const UDP: u8 = PROTO_UDP;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: 5,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    add_local_pod(&mut dp, 20, A, [0x0a, 0x58, 10, 244, 1, 2]);
    for n in [NODE, NODE2] {
        dp.node_remotes
            .insert(&Addr128::from_v4(n), &Remote::new(n))
            .unwrap();
    }
    (pins, dp)
}

/// 1 (pass) or 0 (drop) of `prog` for `frame`.
fn host(dp: &mut Datapath, prog: HostProgram, frame: &[u8]) -> i32 {
    let p = dp.host_program_mut(prog).unwrap();
    let mut out = vec![0u8; frame.len() + 256];
    let res = p
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    res.return_value as i32
}

fn syn(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut p = Ip4::tcp(src, sport, dst, dport);
    p.tcp_flags = SYN;
    p.frame(GW_MAC, POD_MAC)
}

fn ack(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut p = Ip4::tcp(src, sport, dst, dport);
    p.tcp_flags = ACK;
    p.frame(GW_MAC, POD_MAC)
}

fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    Ip4::udp(src, sport, dst, dport).frame(GW_MAC, POD_MAC)
}

fn drops(dp: &Datapath) -> (u64, u64) {
    (
        dp.drop_count(DropReason::HostIngress).unwrap(),
        dp.drop_count(DropReason::HostEgress).unwrap(),
    )
}

/// The node: ingress TCP 8000 from anyone and everything from
/// 198.51.100.0/24, but never TCP 10250 from anyone (a deny); egress UDP
/// 53 only. Pod A has an identity, as every pod does.
fn policy() -> NpDesired {
    let mut d = NpDesired::default();
    d.eps.insert(
        np_host_key(),
        NpEp {
            id: NP_HOST_ID,
            flags: NP_F_ISOLATED_IN | NP_F_DENY_IN | NP_F_ISOLATED_OUT,
        },
    );
    d.eps
        .insert(np_ep_key(IpAddr::V4(A)), NpEp { id: 1, flags: 0 });
    let ports = |proto, lo, hi| {
        port_range_prefixes(lo, hi)
            .into_iter()
            .map(move |(start, bits)| NpMatch::Ports { proto, start, bits })
    };
    for m in ports(TCP, 8000, 8000) {
        d.rules.insert(
            NpRule::key(NP_HOST_ID, NP_INGRESS, NP_PEER_ANY, m).into(),
            1,
        );
    }
    let k = np_cidr_key(NP_HOST_ID, NP_INGRESS, "198.51.100.0".parse().unwrap(), 24).unwrap();
    d.cidrs.insert(k.into(), 1);
    d.rules.insert(
        NpRule::key(NP_HOST_ID, NP_INGRESS, NP_PEER_CIDR | 1, NpMatch::Any).into(),
        1,
    );
    for m in ports(TCP, 10250, 10250) {
        d.deny.insert(
            NpRule::key(NP_HOST_ID, NP_INGRESS, NP_PEER_ANY, m).into(),
            1,
        );
    }
    for m in ports(UDP, 53, 53) {
        d.rules
            .insert(NpRule::key(NP_HOST_ID, NP_EGRESS, NP_PEER_ANY, m).into(), 1);
    }
    d
}

#[test]
fn the_node_admits_what_its_firewall_allows_and_never_locks_out_its_cluster() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("hostfw");
    use HostProgram::{Egress, Ingress};

    // no host policy: everything passes, nothing is counted
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40000, NODE, 22)), 1);
    assert_eq!(host(&mut dp, Egress, &syn(NODE, 40000, WORLD, 80)), 1);
    assert_eq!(drops(&dp), (0, 0));

    let r = dp.np.sync(&policy()).unwrap();
    assert!(r.converged(), "{:?}", r.failures);

    // ingress: an allowed port, a refused one, a trusted block, the deny
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40000, NODE, 8000)), 1);
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40001, NODE, 22)), 0);
    assert_eq!(drops(&dp), (1, 0));
    assert_eq!(host(&mut dp, Ingress, &syn(OPS, 40000, NODE, 22)), 1);
    assert_eq!(host(&mut dp, Ingress, &udp(OPS, 40000, NODE, 161)), 1);
    assert_eq!(host(&mut dp, Ingress, &syn(OPS, 40001, NODE, 10250)), 0);
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40002, NODE, 10250)), 0);
    assert_eq!(drops(&dp), (3, 0));
    // only connection attempts are judged: the rest of a TCP connection
    // belongs to a socket the kernel keeps for admitted ones
    assert_eq!(host(&mut dp, Ingress, &ack(WORLD, 40001, NODE, 22)), 1);
    // a pod is judged like anyone
    assert_eq!(host(&mut dp, Ingress, &syn(A, 40000, NODE, 22)), 0);
    assert_eq!(host(&mut dp, Ingress, &syn(A, 40001, NODE, 8000)), 1);
    assert_eq!(drops(&dp), (4, 0));

    // structural: another node (the overlay, kubelets, control plane),
    // even on a denied port; ICMP; what is not for the node's addresses
    assert_eq!(host(&mut dp, Ingress, &syn(NODE2, 40000, NODE, 22)), 1);
    assert_eq!(host(&mut dp, Ingress, &syn(NODE2, 40001, NODE, 10250)), 1);
    assert_eq!(host(&mut dp, Ingress, &udp(NODE2, 4789, NODE, 4789)), 1);
    let echo = Ip4::icmp_echo(WORLD, NODE, 7, false).frame(GW_MAC, POD_MAC);
    assert_eq!(host(&mut dp, Ingress, &echo), 1);
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40003, A, 22)), 1);
    assert_eq!(drops(&dp), (4, 0));

    // egress: UDP 53 out, and its replies in; nothing unsolicited
    assert_eq!(host(&mut dp, Egress, &udp(NODE, 5353, WORLD, 53)), 1);
    assert_eq!(host(&mut dp, Ingress, &udp(WORLD, 53, NODE, 5353)), 1);
    assert_eq!(host(&mut dp, Ingress, &udp(WORLD, 53, NODE, 5354)), 0);
    assert_eq!(drops(&dp), (5, 0));
    // an inbound UDP flow admitted: its replies go out though egress is
    // isolated to UDP 53
    assert_eq!(host(&mut dp, Ingress, &udp(OPS, 50000, NODE, 161)), 1);
    assert_eq!(host(&mut dp, Egress, &udp(NODE, 161, OPS, 50000)), 1);
    assert_eq!(host(&mut dp, Egress, &udp(NODE, 161, OPS, 50001)), 0);
    assert_eq!(host(&mut dp, Egress, &syn(NODE, 40000, WORLD, 443)), 0);
    assert_eq!(drops(&dp), (5, 2));
    // the node's own flows into its pods (the kubelet's probes), to another node
    assert_eq!(host(&mut dp, Egress, &syn(NODE, 40001, A, 8080)), 1);
    assert_eq!(host(&mut dp, Egress, &syn(NODE, 40002, NODE2, 6443)), 1);
    assert_eq!(drops(&dp), (5, 2));

    // the policy gone: open again
    let r = dp.np.sync(&NpDesired::default()).unwrap();
    assert!(r.converged());
    assert_eq!(host(&mut dp, Ingress, &syn(WORLD, 40004, NODE, 22)), 1);
    assert_eq!(host(&mut dp, Egress, &syn(NODE, 40005, WORLD, 443)), 1);
    assert_eq!(drops(&dp), (5, 2));
}

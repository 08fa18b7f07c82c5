//! What SecurityGroups cost at the destination gate, in ns per packet with
//! BPF_PROG_TEST_RUN (`repeat`, the kernel's own per-run average, best of
//! 3), side by side in one run: the same frames through a node without any
//! SecurityGroup and through a node whose maps hold 1 000 SecurityGroup
//! rules (200 groups × 5 rules, TCP port ranges from peer groups, plus a
//! CIDR rule per group and the source's egress rule; the destination and the source are in 4 groups
//! each). Run it as root with
//!
//! ```text
//! cargo bench -p cozyplane-datapath --bench bpf_sg_cost
//! ```
//!
//! A measurement, not a test of speed: it asserts only that every frame
//! takes the path it is meant to measure. A repeated admitted packet is an
//! established flow after its first run (the tracker's hit); a denied one
//! walks every rule of its groups on every run (the worst case for a new
//! flow: 4 × (4 + 2) lookups).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[path = "../tests/bpf_support/mod.rs"]
mod bpf_support;

use std::net::{IpAddr, Ipv4Addr};

use aya::programs::{TestRun, TestRunOptions};
use bpf_support::*;
use cozyplane_datapath::abi::{
    port_range_prefixes, sg_cidr_key, sg_member_key, Endpoint, EpKey, Params, Port, SgGroups,
    SgRule, SG_EGRESS, SG_INGRESS, SG_PEER_CIDR,
};
use cozyplane_datapath::{Datapath, Object, Program};

const REPEAT: u32 = 200_000;
const NET: u32 = 100;
const SRC_IF: u32 = 10;
const SRC: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
/// On loopback (ifindex 1), where test runs happen, so to_pod sees its veth.
const DST: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 3);
const GROUPS: u32 = 200;
const RULES_PER_GROUP: u32 = 5;

fn gid(k: u32) -> u32 {
    0x1000 + k * 7919
}

fn node(test: &str, with_sgs: bool) -> (PinDir, Datapath) {
    let pins = PinDir::new(test);
    let mut dp = Datapath::load_object(Object::Production, pins.path()).expect("load");
    dp.set_params(&Params {
        vxlan_ifindex: 5,
        node_ip: [10, 250, 0, 1],
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip) in [(SRC_IF, SRC), (1, DST)] {
        dp.ports
            .insert(&ifindex, &Port { net: NET, flags: 0 })
            .unwrap();
        dp.locals
            .insert(
                &EpKey::new(NET, ip),
                &Endpoint {
                    ifindex,
                    mac: POD_MAC,
                    flags: 0,
                },
            )
            .unwrap();
    }
    if !with_sgs {
        return (pins, dp);
    }
    let mut rules = 0;
    for k in 0..GROUPS {
        // rule r of group k: TCP 8000+10r .. 8010+10r from group k+r+1
        for r in 0..RULES_PER_GROUP {
            let lo = 8000 + 10 * r as u16;
            for (start, bits) in port_range_prefixes(lo, lo + 10) {
                let rule = SgRule {
                    net: NET,
                    group: gid(k),
                    peer_net: NET,
                    peer: gid((k + r + 1) % GROUPS),
                    dir: SG_INGRESS,
                    proto: PROTO_TCP,
                    port: start.to_be_bytes(),
                };
                dp.sg.rules.insert(&rule.key(bits), &1).unwrap();
            }
            rules += 1;
        }
        let c = sg_cidr_key(NET, gid(k), SG_INGRESS, "10.0.0.0".parse().unwrap(), 8).unwrap();
        dp.sg.cidrs.insert(&c, &1).unwrap();
        let rule = SgRule {
            net: NET,
            group: gid(k),
            peer_net: SG_PEER_CIDR,
            peer: 1,
            dir: SG_INGRESS,
            proto: PROTO_TCP,
            port: 443u16.to_be_bytes(),
        };
        dp.sg.rules.insert(&rule.key(16), &1).unwrap();
    }
    // SRC's group 14 may send anything TCP to group 13 (from_pod's egress)
    let egress = SgRule {
        net: NET,
        group: gid(14),
        peer_net: NET,
        peer: gid(13),
        dir: SG_EGRESS,
        proto: PROTO_TCP,
        port: [0, 0],
    };
    dp.sg.rules.insert(&egress.key(0), &1).unwrap();
    rules += 1;
    assert_eq!(rules, 1001);
    // DST in groups 10..13; SRC in 14, 50, 60, 70: only group 13's rule 0
    // (from group 14) admits SRC, on TCP 8000-8010
    let member = |dp: &mut Datapath, ip: Ipv4Addr, ks: &[u32]| {
        let ids: Vec<u32> = ks.iter().map(|&k| gid(k)).collect();
        dp.sg
            .members
            .insert(
                &sg_member_key(NET, IpAddr::V4(ip)),
                &SgGroups::new(&ids).unwrap(),
            )
            .unwrap();
    };
    member(&mut dp, DST, &[10, 11, 12, 13]);
    member(&mut dp, SRC, &[14, 50, 60, 70]);
    (pins, dp)
}

fn cost(dp: &mut Datapath, prog: Program, frame: &[u8], ctx: Ctx, verdict: i32) -> f64 {
    let once = run(dp, prog, frame, ctx);
    assert_eq!(once.verdict, verdict, "{}: the intended path", prog.name());
    let mut ctx_in = [0u8; 192];
    ctx_in[36..40].copy_from_slice(&ctx.ingress_ifindex.to_ne_bytes());
    let p = dp.program_mut(prog).expect("program");
    let mut best = f64::MAX;
    for _ in 0..3 {
        let res = p
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ctx_in: Some(&ctx_in),
                repeat: REPEAT,
                ..TestRunOptions::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(res.return_value as i32, verdict);
        best = best.min(res.duration.as_nanos() as f64);
    }
    best
}

fn main() {
    if !needs!().root().ready() {
        return;
    }
    let (_p1, mut plain) = node("sgcost-plain", false);
    let (_p2, mut sg) = node("sgcost-1k", true);
    let kernel = Ctx::default();
    let from_src = Ctx {
        ingress_ifindex: SRC_IF,
        ..Ctx::default()
    };
    let admitted = Ip4::tcp(SRC, 40000, DST, 8005).frame(POD_MAC, GW_MAC);
    let denied = Ip4::tcp(SRC, 40001, DST, 9999).frame(POD_MAC, GW_MAC);
    let from_pod = Ip4::tcp(SRC, 40002, DST, 8005).frame(GW_MAC, POD_MAC);

    let mut rows = Vec::new();
    for (what, frame, prog, ctx, plain_verdict, sg_verdict) in [
        (
            "to_pod (the gate alone), admitted",
            &admitted,
            Program::ToPod,
            kernel,
            CP_PASS,
            CP_PASS,
        ),
        (
            "to_pod, not admitted by any rule (full rule walk)",
            &denied,
            Program::ToPod,
            kernel,
            CP_PASS,
            TC_ACT_SHOT,
        ),
        (
            "from_pod same node (egress check + gate + deliver), admitted",
            &from_pod,
            Program::FromPod,
            from_src,
            TC_ACT_REDIRECT,
            TC_ACT_REDIRECT,
        ),
    ] {
        let a = cost(&mut plain, prog, frame, ctx, plain_verdict);
        let b = cost(&mut sg, prog, frame, ctx, sg_verdict);
        rows.push((what, a, b));
    }
    println!("| path | no SecurityGroups, ns | 1k SG rules, ns |");
    println!("|---|---|---|");
    for (what, a, b) in rows {
        println!("| {what} | {a:.0} | {b:.0} |");
    }
}

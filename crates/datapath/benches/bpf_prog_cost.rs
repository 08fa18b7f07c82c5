//! Per-program cost on the hot paths, measured with BPF_PROG_TEST_RUN
//! (`repeat`, the kernel's own per-run average): a secondary signal next to
//! the datapath benchmark (`cozyplane-bench`), which measures what users
//! see. This is a measurement (a bench target), not a test of speed: it
//! asserts only that every measured frame takes the path it is meant to
//! measure (a number for the wrong path would be meaningless). Run it as
//! root with
//!
//! ```text
//! cargo bench -p cozyplane-datapath --bench bpf_prog_cost
//! ```
//!
//! Each program runs on a frame it sees unchanged on every repetition
//! (a masquerade SNAT would rewrite its own input, so only the uplink
//! programs' pass-through of underlay traffic is measured there).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

// The tests' shared support (it allows dead code itself: each user takes a subset).
#[path = "../tests/bpf_support/mod.rs"]
mod bpf_support;

use std::net::Ipv4Addr;

use aya::programs::{TestRun, TestRunOptions};
use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, Endpoint, EpKey, Params, Port, Remote, OVERLAY_MAC, VNI_DEFAULT,
    VTEP_F_NODE,
};
use cozyplane_datapath::{Datapath, Object, Program};

const REPEAT: u32 = 200_000;
const POD_IF: u32 = 10;
const POD2_IF: u32 = 11;
const VXLAN_IF: u32 = 5;
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
/// A pod no cp_remotes entry covers: reached through cp_learned only.
const NEW_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 50);
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];
/// A VPC (net = VNI 100): two pods here, one on NODE2.
const VPC: u32 = 100;
const VPC1_IF: u32 = 20;
const VPC2_IF: u32 = 21;
const VPC1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
const VPC2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 6);
const VPC_REMOTE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);

/// A node as the agent programs it, masquerade on (as in the benchmark).
fn node(object: Object, test: &str) -> (PinDir, Datapath) {
    let pins = PinDir::new(test);
    let mut dp = Datapath::load_object(object, pins.path()).expect("load");
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        masq_ip: NODE.octets(),
        masq_port_min: 20000,
        masq_port_max: 29999,
        ..Params::default()
    })
    .unwrap();
    // loopback (ifindex 1, where test runs happen) stands for a pod veth too
    for (ifindex, ip, mac) in [
        (POD_IF, POD, POD_MAC),
        (POD2_IF, POD2, POD2_MAC),
        (1, Ipv4Addr::new(10, 244, 1, 50), POD_MAC),
    ] {
        add_local_pod(&mut dp, ifindex, ip, mac);
    }
    let cidr = lpm_key(0, "10.244.2.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
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
    // the VPC, as the attach path and the compiler write it
    dp.vnis.insert(&VPC, &VPC).unwrap();
    for (ifindex, ip, mac) in [(VPC1_IF, VPC1, POD_MAC), (VPC2_IF, VPC2, POD2_MAC)] {
        let port = Port { net: VPC, flags: 0 };
        dp.ports.insert(&ifindex, &port).unwrap();
        let ep = Endpoint {
            ifindex,
            mac,
            flags: 0,
        };
        dp.locals.insert(&EpKey::new(VPC, ip), &ep).unwrap();
    }
    let remote = lpm_key(VPC, VPC_REMOTE.into(), 32).unwrap();
    dp.remotes.insert(&remote, &Remote::new(NODE2)).unwrap();
    (pins, dp)
}

/// Average ns per run of `prog` on `frame`, after checking its verdict.
fn cost(dp: &mut Datapath, prog: Program, frame: &[u8], ctx: Ctx, verdict: i32) -> f64 {
    let once = run(dp, prog, frame, ctx);
    assert_eq!(once.verdict, verdict, "{}: the intended path", prog.name());
    let ctx_in = ctx_bytes(&ctx);
    let p = dp.program_mut(prog).expect("program");
    let mut best = f64::MAX;
    // best of 3: the machine is shared, the minimum is the program's cost
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

const SINGLE_RUNS: u32 = 20_000;

/// The least duration of `SINGLE_RUNS` runs of `from_uplink` on `frame`,
/// one repetition each (the input is fresh every time), after checking
/// each one redirects.
fn least_of_single_runs(dp: &mut Datapath, frame: &[u8], ctx: Ctx) -> f64 {
    let ctx_in = ctx_bytes(&ctx);
    let p = dp.program_mut(Program::FromUplink).expect("program");
    let mut least = f64::MAX;
    for _ in 0..SINGLE_RUNS {
        let res = p
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ctx_in: Some(&ctx_in),
                repeat: 1,
                ..TestRunOptions::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(res.return_value as i32, TC_ACT_REDIRECT, "translated");
        least = least.min(res.duration.as_nanos() as f64);
    }
    least
}

fn ctx_bytes(ctx: &Ctx) -> [u8; 192] {
    let mut b = [0u8; 192];
    b[8..12].copy_from_slice(&ctx.mark.to_ne_bytes());
    b[36..40].copy_from_slice(&ctx.ingress_ifindex.to_ne_bytes());
    b[40..44].copy_from_slice(&ctx.ifindex.to_ne_bytes());
    for (i, w) in ctx.cb.iter().enumerate() {
        b[48 + 4 * i..52 + 4 * i].copy_from_slice(&w.to_ne_bytes());
    }
    b
}

fn main() {
    hot_path_cost_per_program();
    network_policy_cost();
    nodeport_cost();
}

/// The per-packet load balancer on a NodePort flow to a local pod, the flow
/// established (what every packet after the first pays): TCP against SCTP,
/// whose two changed port bytes are carried into its CRC32c (bpf/nat.h
/// cp_crc32c_delta: straight-line, whatever the packet's length), short and
/// long. A translation rewrites its own input, and a repeated test run
/// reuses the rewritten packet, so each figure is the least of 20 000 runs
/// of one repetition on a fresh copy (the kernel's own timing of the run).
fn nodeport_cost() {
    use cozyplane_datapath::abi::{Backend, SvcKey, BACKEND_F_LOCAL, SVC_SCOPE_EXTERNAL};
    use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
    use std::net::IpAddr;

    if !needs!().root().ready() {
        return;
    }
    const UPLINK_IF: u32 = 2;
    let (_p, mut dp) = node(Object::Production, "cost-nodeport");
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    let mut d = SvcDesired::new();
    for proto in [PROTO_TCP, PROTO_SCTP] {
        d.insert(
            SvcKey::new(0, IpAddr::V4(NODE), 30080, proto, SVC_SCOPE_EXTERNAL),
            DesiredFrontend {
                addr: Backend::new(0, IpAddr::V4(NODE), 30080, proto, 0),
                backends: vec![Backend::new(
                    0,
                    IpAddr::V4(POD),
                    8080,
                    proto,
                    BACKEND_F_LOCAL,
                )],
                local_count: 1,
                maglev: vec![0; 251],
                ..DesiredFrontend::default()
            },
        );
    }
    assert!(dp.svc.sync(&d).unwrap().converged());
    let client = Ipv4Addr::new(198, 19, 0, 2);
    let uplink = Ctx {
        ingress_ifindex: UPLINK_IF,
        ..Ctx::default()
    };
    let mut rows = Vec::new();
    for (what, proto, len) in [
        ("TCP, 64 B payload", PROTO_TCP, 64),
        ("SCTP, 64 B payload", PROTO_SCTP, 64),
        ("TCP, 1400 B payload", PROTO_TCP, 1400),
        ("SCTP, 1400 B payload", PROTO_SCTP, 1400),
    ] {
        let pkt = Ip4 {
            proto,
            payload: vec![0x5a; len],
            ..Ip4::tcp(client, 40000, NODE, 30080)
        };
        let frame = pkt.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        rows.push((what, least_of_single_runs(&mut dp, &frame, uplink)));
    }
    println!();
    println!("| from_uplink, NodePort to a local pod, flow established | ns per run (least of {SINGLE_RUNS} single runs) |");
    println!("|---|---|");
    for (what, ns) in rows {
        println!("| {what} | {ns:.0} |");
    }
}

/// NetworkPolicy's gate cost (`bpf/netpol.h`): the same-node delivery with
/// no policy (tracked all the same), with both pods isolated by 100
/// policies' worth of rules and the flow established (the common case: the
/// ct answers), and a packet the rules refuse (every lookup, every time).
fn network_policy_cost() {
    use cozyplane_datapath::abi::{
        np_cidr_key, np_ep_key, NpEp, NpMatch, NpRule, NP_EGRESS, NP_F_ISOLATED_IN,
        NP_F_ISOLATED_OUT, NP_INGRESS, NP_PEER_CIDR,
    };
    use cozyplane_datapath::netpol::NpDesired;

    if !needs!().root().ready() {
        return;
    }
    let frame = Ip4::tcp(POD, 40000, POD2, 80).frame(GW_MAC, POD_MAC);
    let denied = Ip4::tcp(POD, 40000, POD2, 81).frame(GW_MAC, POD_MAC);
    let from_pod = Ctx {
        ingress_ifindex: POD_IF,
        ..Ctx::default()
    };
    let (_p0, mut open) = node(Object::Production, "cost-np-open");
    let open_ns = cost(
        &mut open,
        Program::FromPod,
        &frame,
        from_pod,
        TC_ACT_REDIRECT,
    );

    let (_p1, mut dp) = node(Object::Production, "cost-np");
    let mut d = NpDesired::default();
    let both = NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT;
    d.eps
        .insert(np_ep_key(POD.into()), NpEp { id: 1, flags: both });
    d.eps
        .insert(np_ep_key(POD2.into()), NpEp { id: 2, flags: both });
    // 100 policies' worth: each subject admits 100 peer identities on a
    // port range, and a CIDR class
    for peer in 1..=100u32 {
        for (start, bits) in cozyplane_datapath::abi::port_range_prefixes(80, 80 + peer as u16) {
            let m = NpMatch::Ports {
                proto: 6,
                start,
                bits,
            };
            d.rules
                .insert(NpRule::key(2, NP_INGRESS, peer, m).into(), 1);
            d.rules
                .insert(NpRule::key(1, NP_EGRESS, peer + 1, m).into(), 1);
        }
    }
    for subject in [1, 2] {
        let k = np_cidr_key(subject, NP_INGRESS, "192.0.2.0".parse().unwrap(), 24).unwrap();
        d.cidrs.insert(k.into(), 1);
        d.rules.insert(
            NpRule::key(subject, NP_INGRESS, NP_PEER_CIDR | 1, NpMatch::Proto(6)).into(),
            1,
        );
    }
    // POD2 admits POD (identity 1) on 80 only
    d.rules
        .retain(|k, _| !(k.data.subject == 2 && k.data.peer == 1));
    d.rules.insert(
        NpRule::key(
            2,
            NP_INGRESS,
            1,
            NpMatch::Ports {
                proto: 6,
                start: 80,
                bits: 16,
            },
        )
        .into(),
        1,
    );
    dp.np.sync(&d).unwrap();
    let established = cost(&mut dp, Program::FromPod, &frame, from_pod, TC_ACT_REDIRECT);
    let refused = cost(&mut dp, Program::FromPod, &denied, from_pod, TC_ACT_SHOT);
    println!();
    println!("| NetworkPolicy, from_pod same node (gate + deliver) | ns per run (best of 3 × {REPEAT}) |");
    println!("|---|---|");
    println!("| no policy (the flow tracked all the same) | {open_ns:.0} |");
    println!("| both pods isolated (100 peers' rules each), flow established | {established:.0} |");
    println!("| refused by the destination's rules (every lookup, every run) | {refused:.0} |");
}

fn hot_path_cost_per_program() {
    if !needs!().root().ready() {
        return;
    }
    let (_p1, mut prod) = node(Object::Production, "cost-prod");
    let (_p2, mut test) = node(Object::TestHooks, "cost-test");
    let from_pod = Ctx {
        ingress_ifindex: POD_IF,
        ..Ctx::default()
    };
    let mut vxlan_out = Ip4::udp(NODE, 40000, NODE2, 4789);
    vxlan_out.payload = vec![0u8; 64];
    let mut vxlan_in = Ip4::udp(NODE2, 40000, NODE, 4789);
    vxlan_in.payload = vec![0u8; 64];

    let rows = [
        (
            "from_pod, cross node (encap)",
            cost(
                &mut prod,
                Program::FromPod,
                &Ip4::tcp(POD, 40000, REMOTE_POD, 80).frame(GW_MAC, POD_MAC),
                from_pod,
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_pod, same node (gate + deliver)",
            cost(
                &mut prod,
                Program::FromPod,
                &Ip4::tcp(POD, 40000, POD2, 80).frame(GW_MAC, POD_MAC),
                from_pod,
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_pod, VPC cross node (encap, metered)",
            cost(
                &mut prod,
                Program::FromPod,
                &Ip4::tcp(VPC1, 40000, VPC_REMOTE, 80).frame(GW_MAC, POD_MAC),
                Ctx {
                    ingress_ifindex: VPC1_IF,
                    ..Ctx::default()
                },
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_pod, VPC same node (gate + deliver, metered)",
            cost(
                &mut prod,
                Program::FromPod,
                &Ip4::tcp(VPC1, 40000, VPC2, 80).frame(GW_MAC, POD_MAC),
                Ctx {
                    ingress_ifindex: VPC1_IF,
                    ..Ctx::default()
                },
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_overlay, VPC to a local pod (source check, metered; test build)",
            cost(
                &mut test,
                Program::FromOverlay,
                &Ip4::tcp(VPC_REMOTE, 80, VPC2, 40000).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
                Ctx {
                    cb: [VPC, u32::from(NODE2), 0, 0, 0],
                    ..Ctx::default()
                },
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_overlay, to a local pod (test build)",
            cost(
                &mut test,
                Program::FromOverlay,
                &Ip4::tcp(REMOTE_POD, 80, POD2, 40000).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
                Ctx {
                    cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
                    ..Ctx::default()
                },
                TC_ACT_REDIRECT,
            ),
        ),
        (
            "from_overlay, unknown source (learned, entry fresh: no write)",
            cost(
                &mut test,
                Program::FromOverlay,
                &Ip4::tcp(NEW_POD, 80, POD2, 40000).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
                Ctx {
                    cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
                    ..Ctx::default()
                },
                TC_ACT_REDIRECT,
            ),
        ),
        (
            // the row above left NEW_POD in cp_learned of the test build
            "from_pod, to a learned address (test build)",
            cost(
                &mut test,
                Program::FromPod,
                &Ip4::tcp(POD, 40000, NEW_POD, 80).frame(GW_MAC, POD_MAC),
                from_pod,
                TC_ACT_REDIRECT,
            ),
        ),
        (
            // net 0 bound outside: since the ClusterIP fallback, a tail call
            // into lb_from_pod, whose lookups miss, then CP_PASS
            "from_pod, to an outside address (passes)",
            cost(
                &mut prod,
                Program::FromPod,
                &Ip4::tcp(POD, 40000, Ipv4Addr::new(93, 184, 216, 34), 443).frame(GW_MAC, POD_MAC),
                from_pod,
                CP_PASS,
            ),
        ),
        (
            "to_pod, kernel-routed, admitted",
            cost(
                &mut prod,
                Program::ToPod,
                &Ip4::tcp(NODE, 80, Ipv4Addr::new(10, 244, 1, 50), 40000).frame(POD_MAC, GW_MAC),
                Ctx::default(),
                CP_PASS,
            ),
        ),
        (
            "to_uplink, VXLAN underlay packet",
            cost(
                &mut prod,
                Program::ToUplink,
                &vxlan_out.frame([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]),
                Ctx::default(),
                CP_PASS,
            ),
        ),
        (
            "from_uplink, VXLAN underlay packet",
            cost(
                &mut prod,
                Program::FromUplink,
                &vxlan_in.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
                Ctx::default(),
                CP_PASS,
            ),
        ),
        (
            // the per-packet load balancer's lookups miss: the node's own
            "from_uplink, IPv4 UDP to the node (not a Service)",
            cost(
                &mut prod,
                Program::FromUplink,
                &Ip4::udp(Ipv4Addr::new(10, 250, 0, 9), 40000, NODE, 5353)
                    .frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
                Ctx::default(),
                CP_PASS,
            ),
        ),
        (
            "from_uplink, IPv6 UDP to the node (not a Service)",
            cost(
                &mut prod,
                Program::FromUplink,
                &ip6_frame(
                    "fd00:250::9".parse().unwrap(),
                    "fd00:250::1".parse().unwrap(),
                    PROTO_UDP,
                    &udp6(40000, 5353),
                ),
                Ctx::default(),
                CP_PASS,
            ),
        ),
        (
            "from_uplink, IPv6 neighbour solicitation",
            cost(
                &mut prod,
                Program::FromUplink,
                &ip6_frame(
                    "fd00:250::9".parse().unwrap(),
                    "fd00:250::1".parse().unwrap(),
                    PROTO_ICMPV6,
                    &icmp6(135),
                ),
                Ctx::default(),
                CP_PASS,
            ),
        ),
    ];
    println!("| program, path | ns per run (best of 3 × {REPEAT}) |");
    println!("|---|---|");
    for (what, ns) in rows {
        println!("| {what} | {ns:.0} |");
    }
}

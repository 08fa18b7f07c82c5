//! BPF_PROG_TEST_RUN tests of the per-packet Service load balancer
//! (`bpf/lb.h`): NodePort / LoadBalancer traffic from the wire in
//! `from_uplink` and from other nodes in `from_overlay`, the replies in
//! `from_pod` and `from_overlay`, on crafted frames with every checksum
//! recomputed in Rust. The frontends are programmed by the real sync
//! (`SvcMaps::sync`). Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, Backend, DropReason, LbVal, MasqKey, Params, Remote, SvcKey,
    BACKEND_F_LOCAL, LB_F_CLOSING, LB_F_REPLIED, LB_F_SNAT, SVC_F_AFFINITY, SVC_SCOPE_EXTERNAL,
    SVC_SCOPE_INTERNAL, VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const POD2_IF: u32 = 11;
const UPLINK_IF: u32 = 2;
const VXLAN_IF: u32 = 5;
const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const NODE2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 10, 1);
const NODE_PORT: u16 = 30080;
const TARGET: u16 = 8080;
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const SNAT_MIN: u16 = 61000;

/// A node (NODE) with two local pods, a remote pod CIDR on NODE2, both
/// nodes' addresses known, the overlay and the uplink configured.
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        uplink_ifindex: UPLINK_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    add_local_pod(&mut dp, POD_IF, POD, POD_MAC);
    add_local_pod(&mut dp, POD2_IF, POD2, POD2_MAC);
    let cidr = lpm_key(0, "10.244.2.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
    for n in [NODE, NODE2] {
        dp.node_remotes
            .insert(&Addr128::from_v4(n), &Remote::new(n))
            .unwrap();
    }
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    dp.vteps.insert(&vtep_key(NODE2), &VTEP_F_NODE).unwrap();
    (pins, dp)
}

/// A wire-scope frontend `addr:port` over `backends` (`local` of them this
/// node's, listed first), with a Maglev-shaped table of 251 slots.
fn wire(addr: Ipv4Addr, port: u16, proto: u8, backends: &[(Ipv4Addr, bool)]) -> SvcDesired {
    let mut d = SvcDesired::new();
    d.insert(
        SvcKey::new(0, IpAddr::V4(addr), port, proto, SVC_SCOPE_EXTERNAL),
        frontend(addr, port, proto, backends),
    );
    d
}

fn frontend(
    addr: Ipv4Addr,
    port: u16,
    proto: u8,
    backends: &[(Ipv4Addr, bool)],
) -> DesiredFrontend {
    let n = backends.len() as u32;
    DesiredFrontend {
        addr: Backend::new(0, IpAddr::V4(addr), port, proto, 0),
        backends: backends
            .iter()
            .map(|&(ip, local)| {
                let flags = if local { BACKEND_F_LOCAL } else { 0 };
                Backend::new(0, IpAddr::V4(ip), TARGET, proto, flags)
            })
            .collect(),
        local_count: backends.iter().filter(|b| b.1).count() as u32,
        maglev: if n == 0 {
            Vec::new()
        } else {
            (0..251).map(|i| (i * 7 + i / 3) % n).collect()
        },
        ..DesiredFrontend::default()
    }
}

fn program(dp: &mut Datapath, d: &SvcDesired) {
    let r = dp.svc.sync(d).unwrap();
    assert!(r.converged(), "{r:?}");
}

fn from_uplink(dp: &mut Datapath, pkt: &Ip4) -> Run {
    from_uplink_frame(dp, &pkt.frame(UPLINK_MAC, ROUTER_MAC))
}

fn from_uplink_frame(dp: &mut Datapath, frame: &[u8]) -> Run {
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

fn from_pod(dp: &mut Datapath, ifindex: u32, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromPod,
        &pkt.frame(GW_MAC, POD_MAC),
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
}

/// A pod's "port unreachable" (ICMP 3/3) from `src` to `dst` quoting
/// `quote`, as it leaves the pod behind host veth `ifindex`.
fn port_unreachable_from_pod(
    dp: &mut Datapath,
    ifindex: u32,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    quote: &[u8],
    pod_mac: [u8; 6],
) -> Run {
    let err = with_icmp_header(icmp_error(src, dst, quote, GW_MAC, pod_mac), 3, 3, 0);
    run(
        dp,
        Program::FromPod,
        &err,
        Ctx {
            ingress_ifindex: ifindex,
            ..Ctx::default()
        },
    )
}

/// A packet decapsulated from NODE2 on net 0 (the test build reads the VNI
/// from `cb[0]` and the sender from `cb[1]`).
fn from_overlay(dp: &mut Datapath, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromOverlay,
        &pkt.frame(
            cozyplane_datapath::abi::OVERLAY_MAC,
            [2, 0xcf, 198, 18, 0, 12],
        ),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

fn assert_csums(p: &Parsed, what: &str) {
    assert!(p.ip_csum_ok, "{what}: IPv4 header checksum");
    assert!(p.l4_csum_ok, "{what}: L4 checksum");
}

#[test]
fn nodeport_to_a_local_pod_keeps_the_client_and_the_reply_leaves_from_the_nodeport() {
    if !needs!().root().ready() {
        return;
    }
    for proto in [PROTO_TCP, PROTO_UDP] {
        let (_pins, mut dp) = node(&format!("lb-local-{proto}"));
        program(&mut dp, &wire(NODE, NODE_PORT, proto, &[(POD, true)]));
        let req = Ip4 {
            proto,
            ..Ip4::tcp(CLIENT, 40000, NODE, NODE_PORT)
        };
        let r = from_uplink(&mut dp, &req);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the pod");
        let p = parse(&r.data);
        assert_eq!(
            (p.src, p.sport),
            (CLIENT, 40000),
            "the client's source is kept"
        );
        assert_eq!((p.dst, p.dport), (POD, TARGET), "DNAT to the backend");
        assert_eq!(p.dst_mac, POD_MAC);
        assert_csums(&p, "request");
        assert_eq!(p.payload, req.payload);
        let d = dp.test_deliver().unwrap().expect("delivery recorded");
        assert_eq!(
            (d.ifindex, d.peer),
            (POD_IF, 1),
            "redirect_peer into the pod"
        );

        // The pod's reply leaves from the NodePort, out of the uplink.
        let reply = Ip4 {
            proto,
            ..Ip4::tcp(POD, TARGET, CLIENT, 40000)
        };
        let r = from_pod(&mut dp, POD_IF, &reply);
        assert_eq!(r.verdict, TC_ACT_REDIRECT);
        let q = parse(&r.data);
        assert_eq!(
            (q.src, q.sport),
            (NODE, NODE_PORT),
            "source back to the frontend"
        );
        assert_eq!((q.dst, q.dport), (CLIENT, 40000));
        assert_csums(&q, "reply");
        let d = dp.test_deliver().unwrap().unwrap();
        assert_eq!(
            (d.ifindex, d.peer),
            (UPLINK_IF, 2),
            "bpf_redirect_neigh out of the uplink the request came in on"
        );
    }
}

#[test]
fn nodeport_to_a_remote_pod_is_snated_to_the_node_and_reversed_on_return() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-remote");
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_TCP, &[(REMOTE_POD, false)]),
    );
    let req = Ip4::tcp(CLIENT, 40001, NODE, NODE_PORT);
    let r = from_uplink(&mut dp, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
    let p = parse(&r.data);
    assert_eq!((p.dst, p.dport), (REMOTE_POD, TARGET));
    assert_eq!(
        p.src, NODE,
        "SNAT to this node, so the reply comes back here"
    );
    assert!(p.sport >= SNAT_MIN, "SNAT port {} in range", p.sport);
    assert_csums(&p, "request");
    let enc = dp.test_encap().unwrap().expect("encapsulated");
    assert_eq!(enc.remote, NODE2.octets());
    let snat_port = p.sport;

    // The same flow keeps its backend and port.
    let again = parse(&from_uplink(&mut dp, &req).data);
    assert_eq!((again.dst, again.sport), (REMOTE_POD, snat_port));

    // The backend's reply arrives through the overlay, for the SNAT address.
    let reply = Ip4::tcp(REMOTE_POD, TARGET, NODE, snat_port);
    let r = from_overlay(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (NODE, NODE_PORT));
    assert_eq!(
        (q.dst, q.dport),
        (CLIENT, 40001),
        "destination back to the client"
    );
    assert_csums(&q, "reply");
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!((d.ifindex, d.peer), (UPLINK_IF, 2));

    // A reply-shaped packet for a SNAT port nobody holds is the node's own.
    let stray = Ip4::tcp(
        REMOTE_POD,
        TARGET,
        NODE,
        snat_port.wrapping_add(1).max(SNAT_MIN),
    );
    let r = from_overlay(&mut dp, &stray);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse(&r.data).dst, NODE, "untouched");
}

#[test]
fn a_nodeport_request_from_another_node_is_snated_even_to_a_local_pod() {
    if !needs!().root().ready() {
        return;
    }
    // A pod on NODE2 connects to NODE:30080; the request comes through the
    // overlay. Its reply must come back to NODE to be reversed, so the
    // source becomes NODE even though the backend is local.
    let (_pins, mut dp) = node("lb-overlay");
    program(&mut dp, &wire(NODE, NODE_PORT, PROTO_TCP, &[(POD, true)]));
    let req = Ip4::tcp(REMOTE_POD, 45000, NODE, NODE_PORT);
    let r = from_overlay(&mut dp, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let p = parse(&r.data);
    assert_eq!((p.dst, p.dport), (POD, TARGET));
    assert_eq!(p.src, NODE);
    assert_csums(&p, "request");

    // The pod answers NODE:<snat>: from_pod sees a packet for this node.
    let reply = Ip4::tcp(POD, TARGET, NODE, p.sport);
    let r = from_pod(&mut dp, POD_IF, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "to the client's node");
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (NODE, NODE_PORT));
    assert_eq!((q.dst, q.dport), (REMOTE_POD, 45000));
    assert_csums(&q, "reply");
    let enc = dp.test_encap().unwrap().unwrap();
    assert_eq!(
        enc.remote,
        NODE2.octets(),
        "encapsulated to the client's node"
    );
}

#[test]
fn load_balancer_ips_spread_by_maglev_and_two_nodes_agree() {
    if !needs!().root().ready() {
        return;
    }
    let backends = [(REMOTE_POD, false), (Ipv4Addr::new(10, 244, 2, 8), false)];
    let (_p1, mut a) = node("lb-maglev-a");
    let (_p2, mut b) = node("lb-maglev-b");
    program(&mut a, &wire(LB_IP, 80, PROTO_TCP, &backends));
    program(&mut b, &wire(LB_IP, 80, PROTO_TCP, &backends));
    let mut seen = BTreeSet::new();
    for sport in 42000..42064u16 {
        let req = Ip4::tcp(CLIENT, sport, LB_IP, 80);
        let pa = parse(&from_uplink(&mut a, &req).data);
        let pb = parse(&from_uplink(&mut b, &req).data);
        assert_eq!(
            pa.dst, pb.dst,
            "both nodes pick the same backend for {sport}"
        );
        seen.insert(pa.dst);
    }
    assert_eq!(seen.len(), 2, "both backends get flows: {seen:?}");
}

#[test]
fn client_ip_affinity_keeps_one_backend_across_flows() {
    if !needs!().root().ready() {
        return;
    }
    let backends = [(REMOTE_POD, false), (Ipv4Addr::new(10, 244, 2, 8), false)];
    let (_pins, mut dp) = node("lb-affinity");
    let mut d = wire(LB_IP, 80, PROTO_TCP, &backends);
    for f in d.values_mut() {
        f.flags = SVC_F_AFFINITY;
        f.affinity_s = 300;
    }
    program(&mut dp, &d);
    let picked: BTreeSet<Ipv4Addr> = (43000..43032u16)
        .map(|sport| parse(&from_uplink(&mut dp, &Ip4::tcp(CLIENT, sport, LB_IP, 80)).data).dst)
        .collect();
    assert_eq!(picked.len(), 1, "one backend for one client: {picked:?}");
}

#[test]
fn a_flow_keeps_its_backend_until_the_backend_goes() {
    if !needs!().root().ready() {
        return;
    }
    let other = Ipv4Addr::new(10, 244, 2, 8);
    let (_pins, mut dp) = node("lb-keep");
    program(
        &mut dp,
        &wire(LB_IP, 80, PROTO_TCP, &[(REMOTE_POD, false), (other, false)]),
    );
    // flows on each backend
    let flows: Vec<(Ip4, Ipv4Addr)> = (44000..44032u16)
        .map(|sport| {
            let req = Ip4::tcp(CLIENT, sport, LB_IP, 80);
            let dst = parse(&from_uplink(&mut dp, &req).data).dst;
            (req, dst)
        })
        .collect();
    assert!(flows.iter().any(|f| f.1 == other) && flows.iter().any(|f| f.1 == REMOTE_POD));

    // A third backend joins: Maglev moves some new flows to it, but every
    // established flow keeps its backend.
    let third = Ipv4Addr::new(10, 244, 2, 9);
    program(
        &mut dp,
        &wire(
            LB_IP,
            80,
            PROTO_TCP,
            &[(REMOTE_POD, false), (other, false), (third, false)],
        ),
    );
    for (req, dst) in &flows {
        assert_eq!(parse(&from_uplink(&mut dp, req).data).dst, *dst);
    }

    // `other` goes: its flows move to a remaining backend, the rest stay.
    program(
        &mut dp,
        &wire(LB_IP, 80, PROTO_TCP, &[(REMOTE_POD, false), (third, false)]),
    );
    for (req, dst) in &flows {
        let now = parse(&from_uplink(&mut dp, req).data).dst;
        if *dst == other {
            assert!(now == REMOTE_POD || now == third, "re-picked: {now}");
        } else {
            assert_eq!(now, *dst, "kept");
        }
    }
}

#[test]
fn no_backend_drops_and_counts_and_other_traffic_is_untouched() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-misc");
    let mut d = wire(NODE, NODE_PORT, PROTO_TCP, &[]);
    // a ClusterIP (inside scope only) is never translated from the wire
    d.insert(
        SvcKey::new(
            0,
            "10.96.0.10".parse().unwrap(),
            80,
            PROTO_TCP,
            SVC_SCOPE_INTERNAL,
        ),
        frontend(Ipv4Addr::new(10, 96, 0, 10), 80, PROTO_TCP, &[(POD, true)]),
    );
    program(&mut dp, &d);

    let before = dp.drop_count(DropReason::LbNoBackend).unwrap();
    let r = from_uplink(&mut dp, &Ip4::tcp(CLIENT, 40000, NODE, NODE_PORT));
    assert_eq!(r.verdict, TC_ACT_SHOT, "no backend: dropped");
    assert_eq!(dp.drop_count(DropReason::LbNoBackend).unwrap(), before + 1);

    for pkt in [
        Ip4::tcp(CLIENT, 40000, NODE, 22),  // the node's own port
        Ip4::udp(NODE2, 50000, NODE, 4789), // the underlay
        Ip4::tcp(CLIENT, 40000, "10.96.0.10".parse().unwrap(), 80), // a ClusterIP
        Ip4::udp(CLIENT, 40000, NODE, NODE_PORT), // the other protocol
    ] {
        let frame = pkt.frame(UPLINK_MAC, ROUTER_MAC);
        let r = from_uplink(&mut dp, &pkt);
        assert_eq!(r.verdict, CP_PASS, "{pkt:?} passes");
        assert_eq!(r.data, frame, "{pkt:?} untouched");
    }
    assert_eq!(
        dp.svc.lb_fwd.entries().unwrap().len(),
        0,
        "no flow state for traffic that is not a Service's"
    );
}

#[test]
fn load_balancer_source_ranges_admit_new_flows_from_listed_sources_only() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-ranges");
    let mut d = wire(LB_IP, 80, PROTO_TCP, &[(POD, true)]);
    for f in d.values_mut() {
        f.source_ranges = vec![("198.19.0.0".parse().unwrap(), 24)];
    }
    program(&mut dp, &d);
    let outsider = Ipv4Addr::new(203, 0, 113, 5);

    let admitted = Ip4::tcp(CLIENT, 46000, LB_IP, 80);
    let r = from_uplink(&mut dp, &admitted);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "a listed source is served");
    assert_eq!(parse(&r.data).dst, POD);

    let before = dp.drop_count(DropReason::LbSourceRange).unwrap();
    let r = from_uplink(&mut dp, &Ip4::tcp(outsider, 46000, LB_IP, 80));
    assert_eq!(r.verdict, TC_ACT_SHOT, "an unlisted source is dropped");
    assert_eq!(
        dp.drop_count(DropReason::LbSourceRange).unwrap(),
        before + 1
    );

    // The ranges change to exclude CLIENT: its established flow goes on (as
    // with kube-proxy's conntrack), a new flow of it is dropped, and the
    // outsider's range now admits it.
    for f in d.values_mut() {
        f.source_ranges = vec![("203.0.113.0".parse().unwrap(), 24)];
    }
    program(&mut dp, &d);
    assert_eq!(parse(&from_uplink(&mut dp, &admitted).data).dst, POD);
    let r = from_uplink(&mut dp, &Ip4::tcp(CLIENT, 46001, LB_IP, 80));
    assert_eq!(r.verdict, TC_ACT_SHOT);
    let r = from_uplink(&mut dp, &Ip4::tcp(outsider, 46001, LB_IP, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);

    // Without ranges, everyone.
    for f in d.values_mut() {
        f.source_ranges.clear();
    }
    program(&mut dp, &d);
    assert!(dp.svc.lb_src.entries().unwrap().is_empty());
    let r = from_uplink(&mut dp, &Ip4::tcp(CLIENT, 46002, LB_IP, 80));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
}

/// CLOCK_MONOTONIC now, the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u64::try_from(ts.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap()
}

#[test]
fn client_ip_affinity_holds_for_its_timeout_and_then_re_picks() {
    if !needs!().root().ready() {
        return;
    }
    let other = Ipv4Addr::new(10, 244, 2, 8);
    let backends = [(REMOTE_POD, false), (other, false)];
    // A node without affinity tells which backend Maglev gives each flow.
    let (_p1, mut plain) = node("lb-aff-plain");
    program(&mut plain, &wire(LB_IP, 80, PROTO_TCP, &backends));
    let maglev = |dp: &mut Datapath, sport: u16| {
        parse(&from_uplink(dp, &Ip4::tcp(CLIENT, sport, LB_IP, 80)).data).dst
    };

    let (_p2, mut dp) = node("lb-aff-timeout");
    let mut d = wire(LB_IP, 80, PROTO_TCP, &backends);
    for f in d.values_mut() {
        f.flags = SVC_F_AFFINITY;
        f.affinity_s = 2;
    }
    program(&mut dp, &d);
    // The first flow pins the client to its Maglev backend.
    let pinned = maglev(&mut dp, 47000);
    assert_eq!(pinned, maglev(&mut plain, 47000));
    // Flows Maglev would send elsewhere follow the pin while it holds.
    let elsewhere: Vec<u16> = (47001..47200)
        .filter(|&s| maglev(&mut plain, s) != pinned)
        .take(3)
        .collect();
    assert_eq!(elsewhere.len(), 3, "Maglev uses both backends");
    assert_eq!(maglev(&mut dp, elsewhere[0]), pinned, "the pin holds");

    // The pin's last use is now older than the timeout: the next new flow is
    // picked afresh (its Maglev backend) and pins that one.
    let pins = dp.svc.affinity.entries().unwrap();
    assert_eq!(pins.len(), 1, "one pin for one client");
    let (k, mut v) = pins[0];
    v.last_ns = monotonic_ns() - 3_000_000_000;
    dp.svc.affinity.insert(&k, &v).unwrap();
    let repicked = maglev(&mut dp, elsewhere[1]);
    assert_ne!(repicked, pinned, "an expired pin is not followed");
    assert_eq!(maglev(&mut dp, elsewhere[2]), repicked, "the new pin holds");
    let now_pinned = dp.svc.affinity.entries().unwrap()[0].1.backend_id;
    assert_ne!(now_pinned, v.backend_id, "the pin moved");
}

#[test]
fn a_flow_of_a_deleted_service_is_never_sent_to_a_backend_that_reuses_its_id() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-stale");
    program(&mut dp, &wire(LB_IP, 80, PROTO_TCP, &[(REMOTE_POD, false)]));
    let flow = Ip4::tcp(CLIENT, 48000, LB_IP, 80);
    assert_eq!(parse(&from_uplink(&mut dp, &flow).data).dst, REMOTE_POD);
    let old_id = dp.svc.lb_fwd.entries().unwrap()[0].1.backend_id;

    // The Service goes, then another one (another address, a source range that
    // leaves CLIENT out) gets a backend under the freed id.
    program(&mut dp, &SvcDesired::new());
    let other = Ipv4Addr::new(10, 244, 2, 99);
    let mut d = wire(
        Ipv4Addr::new(198, 19, 10, 2),
        80,
        PROTO_TCP,
        &[(other, false)],
    );
    for f in d.values_mut() {
        f.source_ranges = vec![("203.0.113.0".parse().unwrap(), 24)];
    }
    program(&mut dp, &d);
    let reused = dp.svc.backends.entries().unwrap();
    assert_eq!(reused.len(), 1);
    assert_eq!(reused[0].0, old_id, "the freed id is reused");

    // The old flow's next packet is no longer a Service's: untouched, not sent
    // to the backend now behind the id.
    let frame = flow.frame(UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink(&mut dp, &flow);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, frame, "not translated to {other}");

    // And while its Service lives, a flow whose backend id now names another
    // backend is picked afresh under the Service's current rules.
    program(&mut dp, &wire(LB_IP, 80, PROTO_TCP, &[(REMOTE_POD, false)]));
    let flow2 = Ip4::tcp(CLIENT, 48001, LB_IP, 80);
    assert_eq!(parse(&from_uplink(&mut dp, &flow2).data).dst, REMOTE_POD);
    let third = Ipv4Addr::new(10, 244, 2, 100);
    program(&mut dp, &SvcDesired::new());
    program(&mut dp, &wire(LB_IP, 80, PROTO_TCP, &[(third, false)]));
    assert_eq!(
        parse(&from_uplink(&mut dp, &flow2).data).dst,
        third,
        "re-picked from the Service's own backends"
    );
}

#[test]
fn an_affinity_pin_never_follows_a_reused_id_to_another_services_backend() {
    if !needs!().root().ready() {
        return;
    }
    let (a, b, c) = (
        REMOTE_POD,
        Ipv4Addr::new(10, 244, 2, 8),
        Ipv4Addr::new(10, 244, 2, 9),
    );
    let other_lb = Ipv4Addr::new(198, 19, 10, 2);
    let sticky = |backends: &[(Ipv4Addr, bool)]| {
        let mut d = wire(LB_IP, 80, PROTO_TCP, backends);
        for f in d.values_mut() {
            f.flags = SVC_F_AFFINITY;
            f.affinity_s = 300;
        }
        d
    };
    let (_pins, mut dp) = node("lb-aff-reuse");
    program(&mut dp, &sticky(&[(a, false)]));
    assert_eq!(
        parse(&from_uplink(&mut dp, &Ip4::tcp(CLIENT, 49000, LB_IP, 80)).data).dst,
        a
    );
    let pinned = dp.svc.affinity.entries().unwrap()[0].1.backend_id;

    // a leaves LB_IP (b replaces it); then another Service's backend c gets a's id.
    program(&mut dp, &sticky(&[(b, false)]));
    let mut d = sticky(&[(b, false)]);
    d.extend(wire(other_lb, 80, PROTO_TCP, &[(c, false)]));
    program(&mut dp, &d);
    let ids: Vec<(u32, Backend)> = dp.svc.backends.entries().unwrap();
    assert!(
        ids.iter()
            .any(|(id, be)| *id == pinned && be.addr == Addr128::from_v4(c)),
        "c reuses the pinned id {pinned}: {ids:?}"
    );

    // The client's pin (still fresh) names that id: the new flow goes to LB_IP's
    // own backend b, never to the other Service's c.
    let dst = parse(&from_uplink(&mut dp, &Ip4::tcp(CLIENT, 49001, LB_IP, 80)).data).dst;
    assert_eq!(
        dst, b,
        "a pin counts only while its Service still has the backend"
    );
}

/// This node's SNAT port range cut to `n` ports from SNAT_MIN (the
/// masquerade's range, which the per-packet LB shares).
fn snat_ports(dp: &mut Datapath, n: u16) {
    let mut p = dp.params().unwrap();
    p.masq_port_min = SNAT_MIN;
    p.masq_port_max = SNAT_MIN + n - 1;
    dp.set_params(&p).unwrap();
}

/// The reverse entry holding SNAT port `port` to REMOTE_POD.
fn snat_entry(dp: &Datapath, port: u16) -> Option<(MasqKey, LbVal)> {
    dp.svc
        .lb_rev
        .entries()
        .unwrap()
        .into_iter()
        .find(|(k, _)| u16::from_be_bytes(k.dport) == port)
}

fn now_s() -> u32 {
    u32::try_from(monotonic_ns() / 1_000_000_000).unwrap()
}

/// SNAT ports expire: a flood of flows that never get a reply holds them
/// for 60 s only, after which new flows take them over; a replied flow holds
/// its port for 6 h, a closing one for 10 s. Before, a port was held until
/// the LRU evicted its entry, which never happened once claims failed:
/// ~4.5k flows to one backend locked the NodePort for good.
#[test]
fn snat_ports_expire_and_a_flood_cannot_lock_a_nodeport_for_good() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-expire");
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_TCP, &[(REMOTE_POD, false)]),
    );
    // A SYN flood from 6000 (spoofable) sources: the port range (4536)
    // runs out, and the rest is dropped and counted.
    let syn = |src: u32, sport: u16| Ip4 {
        tcp_flags: 0x02,
        ..Ip4::tcp(Ipv4Addr::from(src), sport, NODE, NODE_PORT)
    };
    let mut admitted = 0;
    for i in 0..6000u32 {
        let r = from_uplink(
            &mut dp,
            &syn(u32::from(CLIENT) + i / 1000, 20000 + (i % 1000) as u16),
        );
        if r.verdict == TC_ACT_REDIRECT {
            admitted += 1;
        }
    }
    assert!(admitted > 3000 && admitted <= 4536, "{admitted}");
    let t = now_s();
    let entries = dp.svc.lb_rev.entries().unwrap();
    assert_eq!(entries.len(), admitted);
    for (_, v) in &entries {
        assert!(
            v.expires_s >= t + 59 && v.expires_s <= t + 61,
            "unreplied: 60 s, {v:?}"
        );
        assert_eq!(v.flags, LB_F_SNAT);
    }
    let legit = Ip4::tcp(Ipv4Addr::new(203, 0, 113, 9), 45000, NODE, NODE_PORT);
    assert_eq!(
        from_uplink(&mut dp, &legit).verdict,
        TC_ACT_SHOT,
        "while the flood holds the ports"
    );
    assert!(dp.drop_count(DropReason::LbNat).unwrap() > 0);

    // 60 s later (the entries aged here): a new flow takes an expired port.
    for (k, mut v) in entries {
        v.expires_s = t - 1;
        dp.svc.lb_rev.insert(&k, &v).unwrap();
    }
    let r = from_uplink(&mut dp, &legit);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "an expired port is taken over");
    let p = parse(&r.data);
    let (_, owner) = snat_entry(&dp, p.sport).unwrap();
    assert_eq!(
        owner.client,
        Addr128::from_v4(Ipv4Addr::new(203, 0, 113, 9))
    );
    assert_eq!(u16::from_be_bytes(owner.client_port), 45000);
    assert_csums(&p, "request on a taken-over port");

    // Its lifetimes: 6 h once the backend replied, 10 s after a FIN.
    let reply = Ip4::tcp(REMOTE_POD, TARGET, NODE, p.sport);
    let q = parse(&from_overlay(&mut dp, &reply).data);
    assert_eq!((q.dst, q.dport), (Ipv4Addr::new(203, 0, 113, 9), 45000));
    let (_, v) = snat_entry(&dp, p.sport).unwrap();
    assert_eq!(v.flags, LB_F_SNAT | LB_F_REPLIED);
    assert!(v.expires_s >= now_s() + 21_599, "{v:?}");
    let fin = Ip4 {
        tcp_flags: 0x11,
        ..legit.clone()
    };
    assert_eq!(from_uplink(&mut dp, &fin).verdict, TC_ACT_REDIRECT);
    let (_, v) = snat_entry(&dp, p.sport).unwrap();
    assert_eq!(v.flags, LB_F_SNAT | LB_F_REPLIED | LB_F_CLOSING);
    assert!(v.expires_s <= now_s() + 10, "{v:?}");
}

/// A flow whose expired port another flow took over is a new flow on its
/// next packet, never sent with the port the other flow now owns; an entry
/// without an expiry (an older agent's) is never taken over.
#[test]
fn a_flow_whose_port_was_taken_over_is_a_new_flow() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-takeover");
    snat_ports(&mut dp, 1);
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_TCP, &[(REMOTE_POD, false)]),
    );
    let a = Ip4::tcp(CLIENT, 40001, NODE, NODE_PORT);
    let b = Ip4::tcp(Ipv4Addr::new(203, 0, 113, 9), 40002, NODE, NODE_PORT);
    assert_eq!(from_uplink(&mut dp, &a).verdict, TC_ACT_REDIRECT);
    assert_eq!(
        from_uplink(&mut dp, &b).verdict,
        TC_ACT_SHOT,
        "one port, taken"
    );

    // An older agent's entry (no expiry): kept.
    let (k, mut v) = snat_entry(&dp, SNAT_MIN).unwrap();
    v.expires_s = 0;
    dp.svc.lb_rev.insert(&k, &v).unwrap();
    assert_eq!(from_uplink(&mut dp, &b).verdict, TC_ACT_SHOT);

    // Expired: b takes the port over.
    v.expires_s = now_s() - 1;
    dp.svc.lb_rev.insert(&k, &v).unwrap();
    let r = from_uplink(&mut dp, &b);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(parse(&r.data).sport, SNAT_MIN);
    // a's next packet finds its port owned by b: a new flow, and with no
    // free port it is dropped rather than sent as b.
    let before = dp.drop_count(DropReason::LbNat).unwrap();
    assert_eq!(from_uplink(&mut dp, &a).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::LbNat).unwrap(), before + 1);
    let (_, owner) = snat_entry(&dp, SNAT_MIN).unwrap();
    assert_eq!(u16::from_be_bytes(owner.client_port), 40002, "still b's");
    // b's reply goes to b
    let q = parse(&from_overlay(&mut dp, &Ip4::tcp(REMOTE_POD, TARGET, NODE, SNAT_MIN)).data);
    assert_eq!((q.dst, q.dport), (Ipv4Addr::new(203, 0, 113, 9), 40002));
}

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// An inside-scope frontend (a ClusterIP) `addr:port` over `backends`.
fn inside(addr: Ipv4Addr, port: u16, proto: u8, backends: &[(Ipv4Addr, bool)]) -> SvcDesired {
    let mut fe = frontend(addr, port, proto, backends);
    fe.maglev = Vec::new();
    let mut d = SvcDesired::new();
    d.insert(
        SvcKey::new(0, IpAddr::V4(addr), port, proto, SVC_SCOPE_INTERNAL),
        fe,
    );
    d
}

/// A pod's packet to a ClusterIP that no socket hook translated (a KubeVirt
/// guest's: its sockets live in the guest) is translated in from_pod (a
/// tail call into lb_from_pod), keeps the pod's source, and the backend's
/// reply enters the pod with the Service as its source; other pods' packets
/// and other outside traffic are untouched.
#[test]
fn a_cluster_ip_no_socket_hook_saw_is_translated_per_packet_and_its_replies_reversed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-inside");
    program(&mut dp, &inside(VIP, 80, PROTO_TCP, &[(POD2, true)]));

    let req = Ip4::tcp(POD, 40000, VIP, 80);
    let r = from_pod(&mut dp, POD_IF, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "to the backend pod");
    let p = parse(&r.data);
    assert_eq!((p.src, p.sport), (POD, 40000), "the pod's own source");
    assert_eq!((p.dst, p.dport), (POD2, TARGET));
    assert_csums(&p, "request");
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD2_IF);

    let reply = Ip4::tcp(POD2, TARGET, POD, 40000);
    let r = from_pod(&mut dp, POD2_IF, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the client pod");
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (VIP, 80), "the Service as the source");
    assert_eq!((q.dst, q.dport), (POD, 40000));
    assert_csums(&q, "reply");
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD_IF);

    // the backend's "port unreachable" about the translated request enters
    // the client as an error about its own request to the Service, from it
    let sent_req = Ip4::tcp(POD, 40000, POD2, TARGET);
    let r = port_unreachable_from_pod(&mut dp, POD2_IF, POD2, POD, &quote(&sent_req), POD2_MAC);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the client pod");
    let f = &r.data;
    let p = parse(f);
    assert_eq!((p.src, p.dst), (VIP, POD), "outer: from the Service");
    assert!(p.ip_csum_ok);
    assert_eq!(csum(&f[ICMP..]), 0, "ICMP checksum");
    assert_eq!(csum(&f[QIP..QL4]), 0, "quoted IPv4 checksum");
    assert_eq!(
        &f[QIP + 12..QIP + 20],
        &quote(&req)[12..20],
        "quoted: POD -> VIP"
    );
    assert_eq!(
        &f[QL4..QL4 + 4],
        &quote(&req)[20..24],
        "quoted ports: 40000 -> 80"
    );
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD_IF);

    // POD2 never sent such a flow: what it receives is not looked at
    let plain = Ip4::tcp(POD, 40001, POD2, TARGET);
    let q = parse(&from_pod(&mut dp, POD_IF, &plain).data);
    assert_eq!((q.src, q.dst), (POD, POD2));
    // a pod-to-pod packet between the same two, not a Service reply: as sent
    let other = Ip4::tcp(POD2, 9999, POD, 40000);
    let q = parse(&from_pod(&mut dp, POD2_IF, &other).data);
    assert_eq!((q.src, q.sport), (POD2, 9999));
    // other outside traffic passes untouched
    let out = Ip4::tcp(POD, 40002, Ipv4Addr::new(93, 184, 216, 34), 443);
    let r = from_pod(&mut dp, POD_IF, &out);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(parse(&r.data).dst, Ipv4Addr::new(93, 184, 216, 34));
}

/// Hairpin: a pod whose per-packet ClusterIP flow picks the pod itself gets
/// its request back from the node's address (SNAT, as kube-proxy
/// masquerades it), so its answer leaves the pod for the node; there it is
/// reversed (the Service as the source, the pod as the destination) and
/// sent back in out of the pod's host veth (bpf_redirect_neigh), where
/// to_pod's gate judges it; the same reply arriving from afar is dropped.
/// Another client of the same Service keeps its own source.
#[test]
fn a_pod_that_is_its_own_cluster_ip_backend_gets_its_answer_from_the_service() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-hairpin");
    program(&mut dp, &inside(VIP, 80, PROTO_TCP, &[(POD, true)]));
    let req = Ip4::tcp(POD, 40000, VIP, 80);
    let r = from_pod(&mut dp, POD_IF, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "back into the pod");
    let p = parse(&r.data);
    assert_eq!((p.dst, p.dport), (POD, TARGET));
    assert_eq!(
        p.src, NODE,
        "from the node, so that the answer leaves the pod"
    );
    assert!(p.sport >= SNAT_MIN, "SNAT port {}", p.sport);
    assert_csums(&p, "request");
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD_IF);
    let snat = p.sport;

    // the same flow again: the same port
    let again = parse(&from_pod(&mut dp, POD_IF, &req).data);
    assert_eq!((again.src, again.sport), (NODE, snat));

    let reply = Ip4::tcp(POD, TARGET, NODE, snat);
    let r = from_pod(&mut dp, POD_IF, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "back towards the pod");
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (VIP, 80), "the Service as the source");
    assert_eq!((q.dst, q.dport), (POD, 40000), "the client's own port");
    assert_csums(&q, "reply");
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!(
        (d.ifindex, d.peer),
        (POD_IF, 2),
        "bpf_redirect_neigh out of the pod's host veth (to_pod's gate)"
    );

    // the reply forged from the wire or another node: never let in
    let r = from_uplink(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_SHOT, "from the uplink");
    let r = from_overlay(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_SHOT, "from the overlay");

    // another client of the same backend: its own source, as before
    let p = parse(&from_pod(&mut dp, POD2_IF, &Ip4::tcp(POD2, 40001, VIP, 80)).data);
    assert_eq!((p.src, p.sport), (POD2, 40001));
    assert_eq!(p.dst, POD);
}

/// The same with the backend on another node: the request goes through the
/// overlay, and the reply arriving through it is reversed at the gate.
#[test]
fn a_cluster_ip_flow_to_a_remote_backend_is_reversed_when_the_reply_comes_back() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-inside-remote");
    program(&mut dp, &inside(VIP, 53, PROTO_UDP, &[(REMOTE_POD, false)]));
    let req = Ip4::udp(POD, 40000, VIP, 53);
    let r = from_pod(&mut dp, POD_IF, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
    let p = parse(&r.data);
    assert_eq!((p.src, p.dst, p.dport), (POD, REMOTE_POD, TARGET));
    assert_eq!(dp.test_encap().unwrap().unwrap().remote, NODE2.octets());

    let reply = Ip4::udp(REMOTE_POD, TARGET, POD, 40000);
    let r = from_overlay(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (VIP, 53));
    assert_eq!((q.dst, q.dport), (POD, 40000));
    assert_csums(&q, "reply");
}

const ROUTER: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

/// The IPv4 packet (no Ethernet header) in a frame, as an ICMP error quotes it.
fn quoted(frame: &[u8]) -> Vec<u8> {
    frame[14..14 + 28].to_vec()
}

/// Path MTU through a NodePort: a router's "fragmentation needed" about a
/// reply the node sent for the frontend reaches the backend as an error
/// about its own reply - the remote backend's through the overlay, with the
/// SNAT address and port it answered; the local backend's into the pod,
/// with the client it answered. The TCP flow's MTU survives every rewrite
/// and every checksum holds.
#[test]
fn a_path_mtu_error_about_a_reply_reaches_the_backend_as_about_its_own() {
    if !needs!().root().ready() {
        return;
    }
    // remote backend, SNATed
    let (_pins, mut dp) = node("lb-icmp-remote");
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_TCP, &[(REMOTE_POD, false)]),
    );
    let req = Ip4::tcp(CLIENT, 40001, NODE, NODE_PORT);
    let snat = parse(&from_uplink(&mut dp, &req).data).sport;
    let r = from_overlay(&mut dp, &Ip4::tcp(REMOTE_POD, TARGET, NODE, snat));
    let sent_reply = r.data;
    assert_eq!(
        parse(&sent_reply).src,
        NODE,
        "the reply left as the NodePort"
    );
    let err = icmp_error(ROUTER, NODE, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink_frame(&mut dp, &err);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
    assert_icmp_error(
        &r.data,
        ROUTER,
        REMOTE_POD,
        &Ip4::tcp(REMOTE_POD, TARGET, NODE, snat),
    );
    assert_eq!(r.data.len(), err.len());
    assert_eq!(dp.test_encap().unwrap().unwrap().remote, NODE2.octets());

    // local backend, the client kept
    let (_pins, mut dp) = node("lb-icmp-local");
    program(&mut dp, &wire(NODE, NODE_PORT, PROTO_TCP, &[(POD, true)]));
    let req = Ip4::tcp(CLIENT, 40002, NODE, NODE_PORT);
    assert_eq!(from_uplink(&mut dp, &req).verdict, TC_ACT_REDIRECT);
    let sent_reply = from_pod(&mut dp, POD_IF, &Ip4::tcp(POD, TARGET, CLIENT, 40002)).data;
    let err = icmp_error(ROUTER, NODE, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink_frame(&mut dp, &err);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the pod");
    assert_icmp_error(&r.data, ROUTER, POD, &Ip4::tcp(POD, TARGET, CLIENT, 40002));
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!((d.ifindex, d.peer), (POD_IF, 1));

    // the same error for a LoadBalancer IP's flow: addressed to that IP
    program(&mut dp, &wire(LB_IP, 443, PROTO_TCP, &[(POD, true)]));
    let req = Ip4::tcp(CLIENT, 40003, LB_IP, 443);
    assert_eq!(from_uplink(&mut dp, &req).verdict, TC_ACT_REDIRECT);
    let sent_reply = from_pod(&mut dp, POD_IF, &Ip4::tcp(POD, TARGET, CLIENT, 40003)).data;
    assert_eq!(parse(&sent_reply).src, LB_IP);
    let err = icmp_error(ROUTER, LB_IP, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink_frame(&mut dp, &err);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_icmp_error(&r.data, ROUTER, POD, &Ip4::tcp(POD, TARGET, CLIENT, 40003));
}

/// The remote backend's "port unreachable" (ICMP 3/3) about the translated
/// request `sent_req` (a frame), arriving through the overlay.
fn unreachable_from_remote_backend(dp: &mut Datapath, sent_req: &[u8]) -> Run {
    let err = with_icmp_header(
        icmp_error(
            REMOTE_POD,
            NODE,
            &quoted(sent_req),
            cozyplane_datapath::abi::OVERLAY_MAC,
            [2; 6],
        ),
        3,
        3,
        0,
    );
    run(
        dp,
        Program::FromOverlay,
        &err,
        Ctx {
            cb: [VNI_DEFAULT, u32::from(NODE2), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

/// A backend's "port unreachable" for a UDP NodePort reaches the client as
/// the frontend's: from the remote backend through the overlay (SNATed: the
/// client's address and port restored), and from a local backend that saw
/// the client itself; the outer source is the frontend, as kube-proxy's
/// conntrack makes it. An error from a hop before the backend keeps its
/// own source.
#[test]
fn a_backends_port_unreachable_reaches_the_client_as_the_frontends() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-icmp-unreach");
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_UDP, &[(REMOTE_POD, false)]),
    );
    let req = Ip4::udp(CLIENT, 40011, NODE, NODE_PORT);
    let sent_req = from_uplink(&mut dp, &req).data;
    let snat = parse(&sent_req).sport;
    let r = unreachable_from_remote_backend(&mut dp, &sent_req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "out to the client");
    let f = &r.data;
    assert_eq!((f[ICMP], f[ICMP + 1]), (3, 3));
    let p = parse(f);
    assert_eq!((p.src, p.dst), (NODE, CLIENT), "outer: frontend -> client");
    assert!(p.ip_csum_ok);
    assert_eq!(csum(&f[ICMP..]), 0, "ICMP checksum");
    assert_eq!(csum(&f[QIP..QL4]), 0, "quoted IPv4 checksum");
    assert_eq!(
        &f[QIP + 12..QIP + 20],
        &quote(&req)[12..20],
        "quoted: the client's request"
    );
    assert_eq!(&f[QL4..QL4 + 4], &quote(&req)[20..24], "quoted ports");
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!(
        (d.ifindex, d.peer),
        (UPLINK_IF, 2),
        "out of the request's uplink"
    );
    assert_ne!(snat, 40011, "the request was SNATed");

    // a hop before the backend (an external backend's router, say) sends
    // the error itself: its own source stays
    let req = Ip4::udp(CLIENT, 40013, NODE, NODE_PORT);
    let sent_req = from_uplink(&mut dp, &req).data;
    let err = icmp_error(ROUTER, NODE, &quoted(&sent_req), UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink_frame(&mut dp, &err);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_icmp_error(&r.data, ROUTER, CLIENT, &req);

    // a local backend that saw the client: the error leaves from_pod
    program(&mut dp, &wire(NODE, NODE_PORT, PROTO_UDP, &[(POD, true)]));
    let req = Ip4::udp(CLIENT, 40012, NODE, NODE_PORT);
    let sent_req = from_uplink(&mut dp, &req).data;
    assert_eq!(parse(&sent_req).src, CLIENT);
    let r = port_unreachable_from_pod(&mut dp, POD_IF, POD, CLIENT, &quoted(&sent_req), POD_MAC);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(parse(&r.data).src, NODE, "outer source: the frontend");
    assert_eq!(&r.data[QIP + 12..QIP + 20], &quote(&req)[12..20]);
    assert_eq!(&r.data[QL4..QL4 + 4], &quote(&req)[20..24]);
    assert_eq!(csum(&r.data[ICMP..]), 0);
    assert_eq!(csum(&r.data[QIP..QL4]), 0);
    let d = dp.test_deliver().unwrap().unwrap();
    assert_eq!((d.ifindex, d.peer), (UPLINK_IF, 2));
}

/// What is not an error about a flow of ours passes untouched: no flow, an
/// error addressed elsewhere than the quote's source, a quote of another
/// protocol, a truncated quote, an echo reply.
#[test]
fn icmp_that_is_not_about_a_translated_flow_passes_untouched() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-icmp-other");
    program(&mut dp, &wire(NODE, NODE_PORT, PROTO_TCP, &[(POD, true)]));
    let req = Ip4::tcp(CLIENT, 40021, NODE, NODE_PORT);
    assert_eq!(from_uplink(&mut dp, &req).verdict, TC_ACT_REDIRECT);
    let sent_reply = from_pod(&mut dp, POD_IF, &Ip4::tcp(POD, TARGET, CLIENT, 40021)).data;
    let untouched = |dp: &mut Datapath, f: Vec<u8>, what: &str| {
        let r = from_uplink_frame(dp, &f);
        assert_eq!(r.verdict, CP_PASS, "{what}");
        assert_eq!(r.data, f, "{what}: untouched");
    };
    // no flow: another client port
    let other = Ip4::tcp(NODE, NODE_PORT, CLIENT, 40999);
    untouched(
        &mut dp,
        icmp_error(ROUTER, NODE, &quote(&other), UPLINK_MAC, ROUTER_MAC),
        "no flow",
    );
    // addressed to another node address than the quoted source
    untouched(
        &mut dp,
        icmp_error(ROUTER, NODE2, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC),
        "addressed elsewhere",
    );
    // truncated quote (the IP header only)
    untouched(
        &mut dp,
        icmp_error(
            ROUTER,
            NODE,
            &quoted(&sent_reply)[..20],
            UPLINK_MAC,
            ROUTER_MAC,
        ),
        "truncated",
    );
    // an echo reply is no error
    let echo = Ip4::icmp_echo(ROUTER, NODE, 7, true).frame(UPLINK_MAC, ROUTER_MAC);
    untouched(&mut dp, echo, "echo reply");
    // and the real one is translated
    let err = icmp_error(ROUTER, NODE, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC);
    assert_eq!(from_uplink_frame(&mut dp, &err).verdict, TC_ACT_REDIRECT);
}

/// An SCTP packet of `len` payload bytes from `src:sport` to `dst:dport`.
fn sctp4(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, len: usize) -> Ip4 {
    Ip4 {
        proto: PROTO_SCTP,
        payload: (0..len).map(|i| (i * 31 + 7) as u8).collect(),
        ..Ip4::tcp(src, sport, dst, dport)
    }
}

/// SCTP per packet (bpf/nat.h cp_sctp_port, cp_sctp_crc): the ports are
/// rewritten and the CRC32c, which covers them (and no address), is updated
/// for them; every packet's CRC is checked against a full computation in
/// Rust, short and long (the update shifts the change across the rest of
/// the packet). To a local pod only the destination changes; to a remote
/// one the source too (SNAT), and both are reversed on the reply.
#[test]
fn sctp_nodeport_flows_are_translated_both_ways_with_their_crc32c_updated() {
    if !needs!().root().ready() {
        return;
    }
    for len in [23, 1400] {
        let (_pins, mut dp) = node(&format!("lb-sctp-{len}"));
        let mut d = wire(NODE, NODE_PORT, PROTO_SCTP, &[(POD, true)]);
        d.extend(wire(LB_IP, 7000, PROTO_SCTP, &[(REMOTE_POD, false)]));
        program(&mut dp, &d);

        // to a local pod, and its reply
        let req = sctp4(CLIENT, 40000, NODE, NODE_PORT, len);
        let r = from_uplink(&mut dp, &req);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the pod");
        let p = parse(&r.data);
        assert_eq!((p.src, p.sport), (CLIENT, 40000));
        assert_eq!((p.dst, p.dport), (POD, TARGET));
        assert_csums(&p, "request to a local pod");
        assert_eq!(
            &r.data[34 + 4..],
            &req.frame(UPLINK_MAC, ROUTER_MAC)[34 + 4..]
                .iter()
                .enumerate()
                .map(|(i, b)| if (4..8).contains(&i) {
                    r.data[34 + 4 + i]
                } else {
                    *b
                })
                .collect::<Vec<_>>()[..],
            "only the ports and the CRC change"
        );
        let reply = sctp4(POD, TARGET, CLIENT, 40000, len);
        let r = from_pod(&mut dp, POD_IF, &reply);
        assert_eq!(r.verdict, TC_ACT_REDIRECT);
        let q = parse(&r.data);
        assert_eq!((q.src, q.sport), (NODE, NODE_PORT), "from the NodePort");
        assert_eq!((q.dst, q.dport), (CLIENT, 40000));
        assert_csums(&q, "reply from a local pod");

        // to a remote pod: SNAT, both ports, and the reply reversed
        let req = sctp4(CLIENT, 40001, LB_IP, 7000, len);
        let r = from_uplink(&mut dp, &req);
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
        let p = parse(&r.data);
        assert_eq!((p.dst, p.dport), (REMOTE_POD, TARGET));
        assert_eq!(p.src, NODE);
        assert!(p.sport >= SNAT_MIN, "SNAT port {}", p.sport);
        assert_csums(&p, "SNATed request");
        let reply = sctp4(REMOTE_POD, TARGET, NODE, p.sport, len);
        let r = from_overlay(&mut dp, &reply);
        assert_eq!(r.verdict, TC_ACT_REDIRECT);
        let q = parse(&r.data);
        assert_eq!((q.src, q.sport), (LB_IP, 7000));
        assert_eq!((q.dst, q.dport), (CLIENT, 40001));
        assert_csums(&q, "reply through the overlay");
    }
}

/// A CRC of 0 is what a local SCTP stack sends when it leaves the CRC to
/// the device (CHECKSUM_PARTIAL): it stays 0, for the device to compute
/// over the rewritten ports. A packet whose IPv4 length leaves no whole
/// SCTP common header, or claims more than the frame holds, is not
/// translated at all.
#[test]
fn an_sctp_crc_left_to_the_device_stays_so_and_a_short_sctp_header_is_not_translated() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-sctp-odd");
    program(&mut dp, &wire(NODE, NODE_PORT, PROTO_SCTP, &[(POD, true)]));

    let mut f = sctp4(CLIENT, 40000, NODE, NODE_PORT, 64).frame(UPLINK_MAC, ROUTER_MAC);
    f[34 + 8..34 + 12].fill(0);
    let r = from_uplink_frame(&mut dp, &f);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let p = parse(&r.data);
    assert_eq!((p.dst, p.dport), (POD, TARGET));
    assert_eq!(
        &r.data[34 + 8..34 + 12],
        &[0, 0, 0, 0],
        "the CRC is the device's"
    );

    for l4_len in [8u16, 4000] {
        let mut f = sctp4(CLIENT, 40002, NODE, NODE_PORT, 64).frame(UPLINK_MAC, ROUTER_MAC);
        f[16..18].copy_from_slice(&(20 + l4_len).to_be_bytes());
        fix_ip4_csum(&mut f);
        let r = from_uplink_frame(&mut dp, &f);
        let p = parse(&r.data);
        assert_eq!(
            (p.dst, p.dport),
            (NODE, NODE_PORT),
            "an IPv4 length of {l4_len} SCTP bytes: untranslated"
        );
    }
}

/// A pod's own SCTP flow to a ClusterIP (no socket hook sees SCTP: this
/// kernel has none, and a guest's stack is its own) is translated per
/// packet, and the backend's reply enters the pod from the Service, its CRC
/// updated by the destination gate.
#[test]
fn a_pods_sctp_cluster_ip_flow_is_translated_per_packet_and_its_reply_reversed() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-sctp-inside");
    program(&mut dp, &inside(VIP, 80, PROTO_SCTP, &[(POD2, true)]));
    let req = sctp4(POD, 40000, VIP, 80, 200);
    let r = from_pod(&mut dp, POD_IF, &req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "to the backend pod");
    let p = parse(&r.data);
    assert_eq!((p.src, p.sport), (POD, 40000));
    assert_eq!((p.dst, p.dport), (POD2, TARGET));
    assert_csums(&p, "request");

    let reply = sctp4(POD2, TARGET, POD, 40000, 200);
    let r = from_pod(&mut dp, POD2_IF, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the client pod");
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (VIP, 80), "the Service as the source");
    assert_eq!((q.dst, q.dport), (POD, 40000));
    assert_csums(&q, "reply");
    assert_eq!(dp.test_deliver().unwrap().unwrap().ifindex, POD_IF);

    // skb->cb may arrive with words from elsewhere: a forged "CRC pending"
    // mark never makes the gate touch a packet it did not translate (here
    // one whose IPv4 length leaves no SCTP header: no tuple at all), and a
    // translation's CRC is right whatever cb held.
    let forged = Ctx {
        ingress_ifindex: POD2_IF,
        cb: [0, 0, (34 << 16) | 100, 0x1234_5678, 0x5343_5450],
        ..Ctx::default()
    };
    let mut short = sctp4(POD2, TARGET, POD, 40000, 200).frame(GW_MAC, POD2_MAC);
    short[16..18].copy_from_slice(&(20u16 + 8).to_be_bytes());
    fix_ip4_csum(&mut short);
    let r = run(&mut dp, Program::FromPod, &short, forged);
    assert_eq!(&r.data[34..], &short[34..], "untouched");
    let r = run(
        &mut dp,
        Program::FromPod,
        &reply.frame(GW_MAC, POD2_MAC),
        forged,
    );
    let q = parse(&r.data);
    assert_eq!((q.src, q.sport), (VIP, 80));
    assert_csums(&q, "reply with a forged cb");
}

/// ICMP errors about SCTP flows are translated as about TCP's: the quote's
/// eight bytes are SCTP's ports and verification tag (no CRC), so only the
/// ports and addresses change. A router's "fragmentation needed" about a
/// reply of a remote, SNATed backend reaches it as about its own reply (SCTP
/// finds its association by the tag and learns the path MTU), and a
/// backend's "protocol/port unreachable" about the translated request
/// reaches the client as the frontend's.
#[test]
fn icmp_errors_about_sctp_flows_are_translated_both_ways() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("lb-sctp-icmp");
    program(
        &mut dp,
        &wire(NODE, NODE_PORT, PROTO_SCTP, &[(REMOTE_POD, false)]),
    );
    let req = sctp4(CLIENT, 40021, NODE, NODE_PORT, 100);
    let sent_req = from_uplink(&mut dp, &req).data;
    let snat = parse(&sent_req).sport;
    let sent_reply = from_overlay(&mut dp, &sctp4(REMOTE_POD, TARGET, NODE, snat, 100)).data;
    assert_eq!(
        parse(&sent_reply).src,
        NODE,
        "the reply left as the NodePort"
    );

    // path MTU about the reply, back to the backend
    let err = icmp_error(ROUTER, NODE, &quoted(&sent_reply), UPLINK_MAC, ROUTER_MAC);
    let r = from_uplink_frame(&mut dp, &err);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "into the overlay");
    assert_icmp_error(
        &r.data,
        ROUTER,
        REMOTE_POD,
        &sctp4(REMOTE_POD, TARGET, NODE, snat, 100),
    );
    assert_eq!(
        &r.data[QL4 + 4..QL4 + 8],
        &sent_reply[34 + 4..34 + 8],
        "the verification tag, by which SCTP finds its association, as sent"
    );

    // the backend's unreachable about the request, out to the client
    let r = unreachable_from_remote_backend(&mut dp, &sent_req);
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "out to the client");
    let f = &r.data;
    let p = parse(f);
    assert_eq!((p.src, p.dst), (NODE, CLIENT), "outer: frontend -> client");
    assert_eq!(csum(&f[ICMP..]), 0, "ICMP checksum");
    assert_eq!(csum(&f[QIP..QL4]), 0, "quoted IPv4 checksum");
    assert_eq!(
        &f[QIP + 12..QIP + 20],
        &quote(&req)[12..20],
        "quoted addresses"
    );
    assert_eq!(
        &f[QL4..QL4 + 4],
        &quote(&req)[20..24],
        "quoted ports: the client's"
    );
}

//! BPF_PROG_TEST_RUN tests of the uplink masquerade (to_uplink SNAT,
//! from_uplink reverse): addresses, ports and checksums recomputed in Rust.
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, Addr128, DropReason, MasqKey, MasqVal, Params, NAT_S_CLOSING, NAT_S_REPLIED,
};
use cozyplane_datapath::{Datapath, Program};

const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(93, 184, 216, 34);
const MASQ: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 10);
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];
const PORT_MIN: u16 = 20000;
const PORT_MAX: u16 = 20009;

fn node(test: &str, port_min: u16, port_max: u16) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        masq_ip: MASQ.octets(),
        masq_port_min: port_min,
        masq_port_max: port_max,
        ..Params::default()
    })
    .unwrap();
    let pods = lpm_key(0, "10.244.0.0".parse().unwrap(), 16).unwrap();
    dp.masq_srcs.insert(&pods, &1).unwrap();
    let services = lpm_key(0, "10.96.0.0".parse().unwrap(), 12).unwrap();
    dp.internal.insert(&services, &1).unwrap();
    (pins, dp)
}

fn egress(dp: &mut Datapath, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::ToUplink,
        &pkt.frame(ROUTER_MAC, UPLINK_MAC),
        Ctx::default(),
    )
}

fn ingress(dp: &mut Datapath, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromUplink,
        &pkt.frame(UPLINK_MAC, ROUTER_MAC),
        Ctx::default(),
    )
}

/// SNAT `out`, check it, build the peer's reply, reverse it, check that.
fn round_trip(dp: &mut Datapath, out: Ip4, reply_of: impl Fn(u16) -> Ip4) {
    let r = egress(dp, &out);
    assert_eq!(r.verdict, CP_PASS, "SNAT hands the packet on");
    let p = parse(&r.data);
    assert_eq!(p.src, MASQ, "source is the masquerade address");
    assert_eq!(p.dst, out.dst);
    assert!(
        (PORT_MIN..=PORT_MAX).contains(&p.sport),
        "port {} in range",
        p.sport
    );
    assert!(p.ip_csum_ok, "IPv4 header checksum after SNAT");
    assert!(p.l4_csum_ok, "L4 checksum after SNAT");
    assert_eq!(p.payload, out.payload);
    let nat_port = p.sport;

    // the same flow keeps its port (retransmits, later segments)
    let again = parse(&egress(dp, &out).data);
    assert_eq!(again.sport, nat_port);

    let reply = reply_of(nat_port);
    let r = ingress(dp, &reply);
    assert_eq!(r.verdict, CP_PASS, "reverse hands the packet to the kernel");
    let q = parse(&r.data);
    assert_eq!(q.src, reply.src);
    assert_eq!(q.dst, POD, "destination restored to the pod");
    if out.proto == PROTO_ICMP {
        assert_eq!(q.sport, out.sport, "echo id restored");
    } else {
        assert_eq!(q.dport, out.sport, "port restored");
        assert_eq!(q.sport, reply.sport);
    }
    assert!(q.ip_csum_ok, "IPv4 header checksum after reverse");
    assert!(q.l4_csum_ok, "L4 checksum after reverse");
    assert_eq!(q.payload, reply.payload);
}

#[test]
fn tcp_is_masqueraded_and_reversed_with_valid_checksums() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-tcp", PORT_MIN, PORT_MAX);
    round_trip(&mut dp, Ip4::tcp(POD, 40000, PEER, 443), |p| {
        Ip4::tcp(PEER, 443, MASQ, p)
    });
    let fwd = dp.masq_fwd.entries().unwrap();
    let rev = dp.masq_rev.entries().unwrap();
    assert_eq!((fwd.len(), rev.len()), (1, 1));
    assert_eq!(fwd[0].0.src, Addr128::from_v4(POD));
    assert_eq!(
        fwd[0].0.sport,
        40000u16.to_be_bytes(),
        "ports in network order"
    );
    assert_eq!(rev[0].1.addr, Addr128::from_v4(POD));
    assert_eq!(rev[0].0.dport, fwd[0].1.port);
}

#[test]
fn udp_is_masqueraded_and_reversed_with_valid_checksums() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-udp", PORT_MIN, PORT_MAX);
    round_trip(&mut dp, Ip4::udp(POD, 5353, PEER, 53), |p| {
        Ip4::udp(PEER, 53, MASQ, p)
    });
}

#[test]
fn udp_without_checksum_keeps_it_zero() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-udp0", PORT_MIN, PORT_MAX);
    let mut out = Ip4::udp(POD, 5353, PEER, 53);
    out.udp_no_csum = true;
    let p = parse(&egress(&mut dp, &out).data);
    assert_eq!(p.src, MASQ);
    assert_eq!(
        p.l4_csum, 0,
        "a zero UDP checksum means none and stays zero"
    );
    assert!(p.ip_csum_ok);
}

#[test]
fn icmp_echo_is_masqueraded_by_identifier() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-icmp", PORT_MIN, PORT_MAX);
    round_trip(&mut dp, Ip4::icmp_echo(POD, PEER, 777, false), |id| {
        Ip4::icmp_echo(PEER, MASQ, id, true)
    });
}

#[test]
fn internal_destinations_and_node_sources_are_left_alone() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-skip", PORT_MIN, PORT_MAX);
    let to_service = Ip4::tcp(POD, 40000, Ipv4Addr::new(10, 96, 0, 10), 53);
    let r = egress(&mut dp, &to_service);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, to_service.frame(ROUTER_MAC, UPLINK_MAC));

    let from_node = Ip4::tcp(Ipv4Addr::new(192, 168, 100, 10), 40000, PEER, 443);
    let r = egress(&mut dp, &from_node);
    assert_eq!(r.data, from_node.frame(ROUTER_MAC, UPLINK_MAC));

    // a reply to the node's own connection (no ct entry) is not touched
    let own_reply = Ip4::tcp(PEER, 443, MASQ, 20005);
    let r = ingress(&mut dp, &own_reply);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, own_reply.frame(UPLINK_MAC, ROUTER_MAC));
    assert!(dp.masq_fwd.entries().unwrap().is_empty());
}

#[test]
fn exhausted_port_range_drops_and_counts() {
    if !needs!().root().ready() {
        return;
    }
    // one port: two flows to the same peer cannot both have it
    let (_pins, mut dp) = node("masq-full", PORT_MIN, PORT_MIN);
    let first = egress(&mut dp, &Ip4::tcp(POD, 40000, PEER, 443));
    assert_eq!(parse(&first.data).sport, PORT_MIN);
    let second = egress(&mut dp, &Ip4::tcp(POD, 40001, PEER, 443));
    assert_eq!(second.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::MasqNoPort).unwrap(), 1);
    // the same port towards another peer is a different reply tuple: fine
    let other = egress(
        &mut dp,
        &Ip4::tcp(POD, 40001, Ipv4Addr::new(1, 1, 1, 1), 443),
    );
    assert_eq!(other.verdict, CP_PASS);
    assert_eq!(parse(&other.data).sport, PORT_MIN);
}

#[test]
fn masquerade_is_off_without_an_address_and_bad_ranges_are_refused() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-off", PORT_MIN, PORT_MAX);
    let bad = Params {
        masq_ip: MASQ.octets(),
        masq_port_min: 30000,
        masq_port_max: 20000,
        ..Params::default()
    };
    assert!(dp.set_params(&bad).is_err());
    assert_eq!(
        dp.params().unwrap().masq_port_min,
        PORT_MIN,
        "refused change left no trace"
    );

    dp.set_params(&Params::default()).unwrap();
    let out = Ip4::tcp(POD, 40000, PEER, 443);
    let r = egress(&mut dp, &out);
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(r.data, out.frame(ROUTER_MAC, UPLINK_MAC));
}

fn now_s() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u32::try_from(ts.tv_sec).unwrap()
}

/// The reverse entry of masquerade port `port`.
fn rev_entry(dp: &Datapath, port: u16) -> (MasqKey, MasqVal) {
    dp.masq_rev
        .entries()
        .unwrap()
        .into_iter()
        .find(|(k, _)| u16::from_be_bytes(k.dport) == port)
        .expect("a reverse entry")
}

/// Ports expire: a flow renews its port with every packet (60 s unreplied,
/// 6 h once the peer replied, 10 s after a FIN), and a new flow takes over
/// a port whose entry expired; the flow that lost it is a new flow, never
/// sent as the new owner; an older agent's entry (no expiry) is kept.
/// Before, a port stayed taken until the LRU evicted its entry: with the
/// range used up once, the masquerade to that peer failed for good.
#[test]
fn ports_expire_and_a_new_flow_takes_over_an_expired_one() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("masq-expire", PORT_MIN, PORT_MIN);
    let a = Ip4 {
        tcp_flags: 0x02,
        ..Ip4::tcp(POD, 40000, PEER, 443)
    };
    let b = Ip4::tcp(Ipv4Addr::new(10, 244, 1, 3), 40001, PEER, 443);
    assert_eq!(egress(&mut dp, &a).verdict, CP_PASS);
    let (k, v) = rev_entry(&dp, PORT_MIN);
    let t = now_s();
    assert_eq!(v.state, 0);
    assert!(v.expires_s >= t + 59 && v.expires_s <= t + 61, "{v:?}");
    // the peer replies: 6 h
    let r = ingress(&mut dp, &Ip4::tcp(PEER, 443, MASQ, PORT_MIN));
    assert_eq!(parse(&r.data).dst, POD);
    let (_, v) = rev_entry(&dp, PORT_MIN);
    assert_eq!(v.state, NAT_S_REPLIED);
    assert!(v.expires_s >= now_s() + 21_599, "{v:?}");
    assert_eq!(
        egress(&mut dp, &b).verdict,
        TC_ACT_SHOT,
        "the one port is a's"
    );

    // an older agent's entry (no expiry) is never taken over
    let mut old = v;
    old.expires_s = 0;
    dp.masq_rev.insert(&k, &old).unwrap();
    assert_eq!(egress(&mut dp, &b).verdict, TC_ACT_SHOT);
    // expired: b takes the port over, and the peer's replies go to b
    old.expires_s = now_s() - 1;
    dp.masq_rev.insert(&k, &old).unwrap();
    let r = egress(&mut dp, &b);
    assert_eq!(r.verdict, CP_PASS, "an expired port is taken over");
    assert_eq!(parse(&r.data).sport, PORT_MIN);
    let q = parse(&ingress(&mut dp, &Ip4::tcp(PEER, 443, MASQ, PORT_MIN)).data);
    assert_eq!((q.dst, q.dport), (Ipv4Addr::new(10, 244, 1, 3), 40001));
    // a's next packet: its port is b's now, so a is a new flow, and with
    // no free port it is dropped rather than sent as b
    let before = dp.drop_count(DropReason::MasqNoPort).unwrap();
    assert_eq!(egress(&mut dp, &a).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::MasqNoPort).unwrap(), before + 1);
    // b closes: 10 s
    let fin = Ip4 {
        tcp_flags: 0x11,
        ..b.clone()
    };
    assert_eq!(egress(&mut dp, &fin).verdict, CP_PASS);
    let (_, v) = rev_entry(&dp, PORT_MIN);
    assert_eq!(v.state, NAT_S_REPLIED | NAT_S_CLOSING);
    assert!(v.expires_s <= now_s() + 10, "{v:?}");
}

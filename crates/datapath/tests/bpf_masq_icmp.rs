//! BPF_PROG_TEST_RUN tests of ICMP errors about masqueraded flows: an error
//! from a router quoting the translated packet is translated back to the
//! pod by `from_uplink` (outer destination, quoted source address and port
//! or echo id), with every checksum verified in Rust over the real bytes.
//! Needs root (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;

use bpf_support::*;
use cozyplane_datapath::abi::{lpm_key, Params};
use cozyplane_datapath::{Datapath, Program};

const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(93, 184, 216, 34);
const MASQ: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 10);
const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
const UPLINK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];
const PORT_MIN: u16 = 20000;
const PORT_MAX: u16 = 20009;
const NEXT_HOP_MTU: u16 = 1400;

/// Frame offset of an ICMP error's outer IPv4 header (ICMP, QIP and QL4
/// are the shared support's).
const OUTER_IP: usize = 14;
/// L4 offset of the translated (quoted) packet's own frame.
const PKT_L4: usize = 34;

fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        masq_ip: MASQ.octets(),
        masq_port_min: PORT_MIN,
        masq_port_max: PORT_MAX,
        ..Params::default()
    })
    .unwrap();
    let pods = lpm_key(0, "10.244.0.0".parse().unwrap(), 16).unwrap();
    dp.masq_srcs.insert(&pods, &1).unwrap();
    (pins, dp)
}

/// Run a pod packet through the SNAT; returns the translated frame.
fn translate(dp: &mut Datapath, pkt: &Ip4) -> Vec<u8> {
    let r = run(
        dp,
        Program::ToUplink,
        &pkt.frame(ROUTER_MAC, UPLINK_MAC),
        Ctx::default(),
    );
    assert_eq!(r.verdict, CP_PASS, "SNAT hands the packet on");
    let p = parse(&r.data);
    assert_eq!(p.src, MASQ, "the flow is masqueraded");
    r.data
}

/// The router's ICMP error to the node quoting `quote` (an IPv4 packet
/// without its Ethernet header), with valid outer IP and ICMP checksums.
/// For "fragmentation needed" the next-hop MTU sits in bytes 6..8.
fn icmp_error(icmp_type: u8, code: u8, quote: &[u8]) -> Vec<u8> {
    let f = bpf_support::icmp_error(ROUTER, MASQ, quote, UPLINK_MAC, ROUTER_MAC);
    let mtu = if icmp_type == 3 && code == 4 {
        NEXT_HOP_MTU
    } else {
        0
    };
    with_icmp_header(f, icmp_type, code, mtu)
}

fn ingress(dp: &mut Datapath, frame: &[u8]) -> Run {
    run(dp, Program::FromUplink, frame, Ctx::default())
}

fn ip_at(f: &[u8], off: usize) -> Ipv4Addr {
    Ipv4Addr::new(f[off], f[off + 1], f[off + 2], f[off + 3])
}

fn be16_at(f: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([f[off], f[off + 1]])
}

/// Check a translated ICMP error against the one sent: the pod's address
/// and `port` (at quoted L4 offset `port_at`) restored, every checksum
/// valid, and every other byte - MTU, quoted L4 checksum, payload - as sent.
fn assert_translated(sent: &[u8], got: &Run, port_at: usize, port: u16) {
    assert_eq!(
        got.verdict, CP_PASS,
        "a translated error goes on like a reply"
    );
    let f = &got.data;
    assert_eq!(f.len(), sent.len(), "length unchanged");
    assert_eq!(ip_at(f, OUTER_IP + 12), ROUTER, "outer source kept");
    assert_eq!(ip_at(f, OUTER_IP + 16), POD, "outer destination is the pod");
    assert_eq!(csum(&f[OUTER_IP..ICMP]), 0, "outer IPv4 checksum valid");
    assert_eq!(csum(&f[ICMP..]), 0, "ICMP checksum valid over the message");
    assert_eq!(ip_at(f, QIP + 12), POD, "quoted source is the pod");
    assert_eq!(ip_at(f, QIP + 16), PEER, "quoted destination kept");
    assert_eq!(csum(&f[QIP..QL4]), 0, "quoted IPv4 checksum valid");
    assert_eq!(be16_at(f, QL4 + port_at), port, "quoted port/id restored");
    assert_eq!(
        be16_at(f, ICMP + 6),
        be16_at(sent, ICMP + 6),
        "MTU untouched"
    );

    // everything not named above is byte-identical
    let changed = [
        OUTER_IP + 10..OUTER_IP + 12, // outer IP checksum
        OUTER_IP + 16..OUTER_IP + 20, // outer destination
        ICMP + 2..ICMP + 4,           // ICMP checksum
        QIP + 10..QIP + 12,           // quoted IP checksum
        QIP + 12..QIP + 16,           // quoted source
        QL4 + port_at..QL4 + port_at + 2,
    ];
    for (i, (a, b)) in sent.iter().zip(f.iter()).enumerate() {
        if !changed.iter().any(|r| r.contains(&i)) {
            assert_eq!(a, b, "byte {i} changed");
        }
    }
}

/// Both error kinds for one translated flow, quoting `quote_len` bytes
/// of the translated IPv4 packet (at least header + 8).
fn check_errors_for(
    dp: &mut Datapath,
    translated: &[u8],
    quote_len: usize,
    port_at: usize,
    port: u16,
) {
    let quote = &translated[OUTER_IP..OUTER_IP + quote_len];
    for (t, c) in [(3u8, 4u8), (11, 0), (3, 3)] {
        let sent = icmp_error(t, c, quote);
        let got = ingress(dp, &sent);
        assert_translated(&sent, &got, port_at, port);
        if t == 3 && c == 4 {
            assert_eq!(be16_at(&got.data, ICMP + 6), NEXT_HOP_MTU);
        }
    }
}

#[test]
fn icmp_errors_about_a_udp_flow_reach_the_pod() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("micmp-udp");
    let out = Ip4::udp(POD, 5353, PEER, 53);
    let t = translate(&mut dp, &out);
    let whole = t.len() - OUTER_IP;
    // the minimal quote (RFC 792) and the whole packet (what Linux sends)
    check_errors_for(&mut dp, &t, 28, 0, 5353);
    check_errors_for(&mut dp, &t, whole, 0, 5353);
    // the quoted UDP checksum is left as the translated packet had it
    let sent = icmp_error(3, 4, &t[OUTER_IP..]);
    let got = ingress(&mut dp, &sent);
    assert_eq!(be16_at(&got.data, QL4 + 6), be16_at(&t, PKT_L4 + 6));
    // the flow itself still works: state untouched by the error
    assert_eq!(dp.masq_rev.entries().unwrap().len(), 1);
}

#[test]
fn icmp_errors_about_a_tcp_flow_reach_the_pod() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("micmp-tcp");
    let out = Ip4::tcp(POD, 40000, PEER, 443);
    let t = translate(&mut dp, &out);
    check_errors_for(&mut dp, &t, 28, 0, 40000);
    check_errors_for(&mut dp, &t, t.len() - OUTER_IP, 0, 40000);
}

#[test]
fn icmp_error_about_an_echo_request_restores_the_id() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("micmp-echo");
    let out = Ip4::icmp_echo(POD, PEER, 777, false);
    let t = translate(&mut dp, &out);
    assert_ne!(be16_at(&t, PKT_L4 + 4), 777, "the id was translated");
    check_errors_for(&mut dp, &t, 28, 4, 777);
}

/// Expect `frame` to leave from_uplink byte-identical and not dropped.
fn assert_untouched(dp: &mut Datapath, frame: &[u8], what: &str) {
    let r = ingress(dp, frame);
    assert_eq!(r.verdict, CP_PASS, "{what}: passed on, not dropped");
    assert_eq!(r.data, frame, "{what}: byte-identical");
}

#[test]
fn icmp_errors_without_state_or_malformed_pass_untouched() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("micmp-skip");
    let t = translate(&mut dp, &Ip4::udp(POD, 5353, PEER, 53));
    let nat_port = be16_at(&t, PKT_L4);

    // no state: same shape, another in-range port never allocated
    let mut other = t[OUTER_IP..OUTER_IP + 28].to_vec();
    let unused = if nat_port == PORT_MIN {
        PORT_MAX
    } else {
        PORT_MIN
    };
    other[20..22].copy_from_slice(&unused.to_be_bytes());
    assert_untouched(&mut dp, &icmp_error(3, 4, &other), "no state");

    // truncated: the quote stops inside the L4 ports
    let short = &t[OUTER_IP..OUTER_IP + 22];
    assert_untouched(&mut dp, &icmp_error(3, 4, short), "truncated quote");
    let header_only = &t[OUTER_IP..OUTER_IP + 20];
    assert_untouched(&mut dp, &icmp_error(11, 0, header_only), "header only");

    // quoted header with options (ihl 6, one NOP word): ports not at +20
    let mut opts = t[OUTER_IP..OUTER_IP + 20].to_vec();
    opts[0] = 0x46;
    opts.extend_from_slice(&[1, 1, 1, 1]);
    opts.extend_from_slice(&t[PKT_L4..PKT_L4 + 8]);
    opts[10..12].copy_from_slice(&[0, 0]);
    let c = csum(&opts[..24]);
    opts[10..12].copy_from_slice(&c.to_be_bytes());
    assert_untouched(&mut dp, &icmp_error(3, 4, &opts), "quoted options");

    // the flow's state is intact: a real quote is still translated
    let sent = icmp_error(3, 4, &t[OUTER_IP..OUTER_IP + 28]);
    assert_translated(&sent, &ingress(&mut dp, &sent), 0, 5353);
}

#[test]
fn icmp_errors_about_the_nodes_own_flows_pass_untouched() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("micmp-own");
    // a pod flow exists, so the table is not empty
    translate(&mut dp, &Ip4::udp(POD, 5353, PEER, 53));

    // the node's own traceroute probe (port outside the range), never SNATed
    let probe = Ip4::udp(MASQ, 33434, PEER, 33435).frame(ROUTER_MAC, UPLINK_MAC);
    assert_untouched(&mut dp, &icmp_error(11, 0, &probe[OUTER_IP..]), "own probe");
    // the node's own TCP connection on an in-range port
    let own = Ip4::tcp(MASQ, PORT_MIN + 3, PEER, 443).frame(ROUTER_MAC, UPLINK_MAC);
    assert_untouched(
        &mut dp,
        &icmp_error(3, 4, &own[OUTER_IP..OUTER_IP + 28]),
        "own tcp",
    );
    // the node's own ping
    let ping = Ip4::icmp_echo(MASQ, PEER, PORT_MIN + 1, false).frame(ROUTER_MAC, UPLINK_MAC);
    assert_untouched(
        &mut dp,
        &icmp_error(3, 1, &ping[OUTER_IP..OUTER_IP + 28]),
        "own ping",
    );
}

//! BPF_PROG_TEST_RUN tests of the overlay sender check and remote learning
//! (`bpf/learn.h`): from_overlay accepts only known tunnel endpoints and
//! records where unknown inner sources live; from_pod and to_overlay fall
//! back to those entries on a `cp_remotes` miss, never over an
//! authoritative entry and never after expiry. Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;

use bpf_support::*;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, DropReason, EpKey, Learned, Params, Remote, LEARN_TTL_NS,
    OVERLAY_MAC, VNI_DEFAULT, VTEP_F_NODE,
};
use cozyplane_datapath::{Datapath, Program};

const POD_IF: u32 = 10;
const POD2_IF: u32 = 11;
const VXLAN_IF: u32 = 5;
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const POD2_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03];
/// A pod the agent already knows (cp_remotes /32 on NODE2).
const KNOWN_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
/// A brand-new pod on NODE3 whose claim this node has not seen yet.
const NEW_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 50);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const NODE2: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const NODE3: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 3);
/// Reaches UDP 4789 but is no node of the cluster.
const STRANGER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 66);

/// This node (NODE) with two local pods, KNOWN_POD on NODE2, and NODE2 and
/// NODE3 as the known tunnel endpoints.
fn node(test: &str) -> (PinDir, Datapath) {
    let (pins, mut dp) = load_test(test);
    dp.set_params(&Params {
        vxlan_ifindex: VXLAN_IF,
        node_ip: NODE.octets(),
        ..Params::default()
    })
    .unwrap();
    for (ifindex, ip, mac) in [(POD_IF, POD, POD_MAC), (POD2_IF, POD2, POD2_MAC)] {
        add_local_pod(&mut dp, ifindex, ip, mac);
    }
    let known = lpm_key(0, KNOWN_POD.into(), 32).unwrap();
    dp.remotes.insert(&known, &Remote::new(NODE2)).unwrap();
    for n in [NODE, NODE2, NODE3] {
        dp.node_remotes
            .insert(&Addr128::from_v4(n), &Remote::new(n))
            .unwrap();
    }
    for n in [NODE2, NODE3] {
        dp.vteps.insert(&vtep_key(n), &VTEP_F_NODE).unwrap();
    }
    dp.vnis.insert(&VNI_DEFAULT, &0).unwrap();
    // The pod CIDR: only addresses in it are ever learned on net 0.
    let pods = lpm_key(0, Ipv4Addr::new(10, 244, 0, 0).into(), 16).unwrap();
    dp.masq_srcs.insert(&pods, &1).unwrap();
    (pins, dp)
}

/// `pkt` decapsulated with outer source `sender` (cb[1], host order).
fn from_overlay(dp: &mut Datapath, sender: Ipv4Addr, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromOverlay,
        &pkt.frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
        Ctx {
            cb: [VNI_DEFAULT, u32::from(sender), 0, 0, 0],
            ..Ctx::default()
        },
    )
}

fn from_pod(dp: &mut Datapath, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::FromPod,
        &pkt.frame(GW_MAC, POD_MAC),
        Ctx {
            ingress_ifindex: POD_IF,
            ..Ctx::default()
        },
    )
}

fn to_overlay(dp: &mut Datapath, pkt: &Ip4) -> Run {
    run(
        dp,
        Program::ToOverlay,
        &pkt.frame([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
        Ctx::default(),
    )
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

fn learned(dp: &Datapath, ip: Ipv4Addr) -> Option<Learned> {
    dp.learned.get(&EpKey::new(0, ip)).unwrap()
}

/// The remote of the last encapsulation and how many there were so far.
fn last_encap(dp: &Datapath) -> Option<(Ipv4Addr, u32)> {
    dp.test_encap()
        .unwrap()
        .map(|e| (Ipv4Addr::from(e.remote), e.count))
}

#[test]
fn unknown_sender_is_dropped_with_unknown_vtep() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("vtep");
    let pkt = Ip4::udp(NEW_POD, 5353, POD2, 53);
    let r = from_overlay(&mut dp, STRANGER, &pkt);
    assert_eq!(r.verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 1);
    assert_eq!(dp.test_deliver().unwrap(), None, "never delivered");
    assert_eq!(learned(&dp, NEW_POD), None, "nothing learned from it");
    // this node's own address is no sender either
    assert_eq!(from_overlay(&mut dp, NODE, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 2);

    // the same packet from a cluster node is delivered
    assert_eq!(from_overlay(&mut dp, NODE3, &pkt).verdict, TC_ACT_REDIRECT);
    // ... until that node leaves the cluster (the agent prunes its VTEP)
    assert!(dp.vteps.remove(&vtep_key(NODE3)).unwrap());
    assert_eq!(from_overlay(&mut dp, NODE3, &pkt).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::UnknownVtep).unwrap(), 3);
    assert_eq!(dp.test_deliver().unwrap().map(|d| d.count), Some(1));
}

#[test]
fn unknown_inner_source_from_a_known_sender_is_learned() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("learn");
    let before = monotonic_ns();
    let r = from_overlay(&mut dp, NODE3, &Ip4::udp(NEW_POD, 5353, POD2, 53));
    let after = monotonic_ns();
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "delivered as before");
    let l = learned(&dp, NEW_POD).expect("learned");
    assert_eq!(l.tunnel_ip(), NODE3, "behind the packet's outer source");
    assert_eq!(l.pad, 0);
    assert!(
        (before + LEARN_TTL_NS..=after + LEARN_TTL_NS).contains(&l.expires_ns),
        "expires {} ns from now",
        LEARN_TTL_NS
    );
    assert_eq!(dp.learned.entries().unwrap().len(), 1, "only the source");

    // more packets from the same place: the fresh entry is not rewritten
    from_overlay(&mut dp, NODE3, &Ip4::tcp(NEW_POD, 40000, POD, 80));
    assert_eq!(learned(&dp, NEW_POD), Some(l));

    // the address now comes from another node (a VM migrated): follow it
    from_overlay(&mut dp, NODE2, &Ip4::udp(NEW_POD, 5353, POD2, 53));
    assert_eq!(learned(&dp, NEW_POD).map(|l| l.tunnel_ip()), Some(NODE2));

    // on another network the same address is another endpoint
    dp.vnis.insert(&100, &100).unwrap();
    let r = run(
        &mut dp,
        Program::FromOverlay,
        &Ip4::udp(NEW_POD, 5353, POD2, 53).frame(OVERLAY_MAC, [2, 0, 0, 0, 0, 9]),
        Ctx {
            cb: [100, u32::from(NODE3), 0, 0, 0],
            ..Ctx::default()
        },
    );
    // ... and a VPC (net != 0) never learns: its sources are Ports known in
    // advance, and an unknown one is dropped (bpf/vpc.h, tests in bpf_vpc.rs)
    assert_eq!(r.verdict, TC_ACT_SHOT, "no such Port on net 100");
    assert_eq!(dp.drop_count(DropReason::VpcSource).unwrap(), 1);
    assert_eq!(dp.learned.get(&EpKey::new(100, NEW_POD)).unwrap(), None);
    assert_eq!(learned(&dp, NEW_POD).map(|l| l.tunnel_ip()), Some(NODE2));
}

#[test]
fn authoritative_and_local_sources_are_never_learned() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("nolearn");
    // a pod cp_remotes places on NODE2, arriving from NODE3
    let r = from_overlay(&mut dp, NODE3, &Ip4::udp(KNOWN_POD, 5353, POD2, 53));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    // a node's own address, and one of this node's pods
    from_overlay(&mut dp, NODE3, &Ip4::udp(NODE2, 5353, POD2, 53));
    from_overlay(&mut dp, NODE3, &Ip4::udp(POD, 5353, POD2, 53));
    assert_eq!(dp.learned.entries().unwrap(), vec![], "nothing learned");
    // and the authoritative entry is untouched
    let k = lpm_key(0, KNOWN_POD.into(), 32).unwrap();
    assert_eq!(dp.remotes.lookup(&k).unwrap(), Some(Remote::new(NODE2)));
    // a covering prefix is authoritative too
    let cidr = lpm_key(0, "10.244.3.0".parse().unwrap(), 24).unwrap();
    dp.remotes.insert(&cidr, &Remote::new(NODE2)).unwrap();
    from_overlay(&mut dp, NODE3, &Ip4::udp(NEW_POD, 5353, POD2, 53));
    assert_eq!(learned(&dp, NEW_POD), None);
}

#[test]
fn an_outside_source_is_never_learned() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("outside");
    // A (compromised or misrouting) node sends a packet whose inner source is
    // an internet address: delivered or not, it must not make this node send
    // its own pods' traffic for that address into the overlay.
    let outside = Ipv4Addr::new(8, 8, 8, 8);
    from_overlay(&mut dp, NODE2, &Ip4::udp(outside, 53, POD, 5353));
    assert_eq!(
        learned(&dp, outside),
        None,
        "an outside address was learned"
    );
    assert_eq!(dp.learned.entries().unwrap(), vec![]);
    // so a pod's packet to it still leaves through this node (masquerade)
    let r = from_pod(&mut dp, &Ip4::udp(POD, 5353, outside, 53));
    assert_eq!(
        r.verdict, CP_PASS,
        "must pass to the kernel, not the overlay"
    );
    // while a pod address from the same sender is learned
    from_overlay(&mut dp, NODE2, &Ip4::udp(NEW_POD, 5353, POD, 53));
    assert!(learned(&dp, NEW_POD).is_some());
}

#[test]
fn replies_to_a_learned_address_go_to_the_learned_tunnel() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("reply");
    let reply = Ip4::udp(POD, 53, NEW_POD, 5353);
    let node_reply = Ip4::udp(NODE, 53, NEW_POD, 5353);
    // the defect: before anything is known the reply cannot be placed
    assert_eq!(from_pod(&mut dp, &reply).verdict, CP_PASS);
    assert_eq!(to_overlay(&mut dp, &node_reply).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoRemote).unwrap(), 1);
    assert_eq!(last_encap(&dp), None);

    // the new pod's first packet arrives from NODE3
    from_overlay(&mut dp, NODE3, &Ip4::udp(NEW_POD, 5353, POD, 53));

    // pod -> new pod: from_pod encapsulates to NODE3
    let r = from_pod(&mut dp, &reply);
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(&r.data[..6], &OVERLAY_MAC);
    assert_eq!(last_encap(&dp), Some((NODE3, 1)));
    let enc = dp.test_encap().unwrap().expect("encapsulated");
    assert_eq!(
        (enc.vni, enc.ifindex, enc.key_remote),
        (VNI_DEFAULT, VXLAN_IF, u32::from(NODE3))
    );
    // node -> new pod (routed into the overlay): to_overlay encapsulates
    let r = to_overlay(&mut dp, &node_reply);
    assert_eq!(r.verdict, CP_PASS, "the overlay device transmits it");
    assert_eq!(last_encap(&dp), Some((NODE3, 2)));
    assert_eq!(dp.drop_count(DropReason::NoRemote).unwrap(), 1);

    // node addresses stay with node_remotes, never a learned entry
    dp.learned
        .insert(
            &EpKey::new(0, NODE2),
            &Learned {
                tunnel_ip: NODE3.octets(),
                pad: 0,
                expires_ns: u64::MAX,
            },
        )
        .unwrap();
    from_pod(&mut dp, &Ip4::tcp(POD, 40000, NODE2, 10250));
    assert_eq!(last_encap(&dp), Some((NODE2, 3)));
}

#[test]
fn an_expired_learned_entry_is_ignored_and_relearned() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("expiry");
    let key = EpKey::new(0, NEW_POD);
    let now = monotonic_ns();
    dp.learned
        .insert(
            &key,
            &Learned {
                tunnel_ip: NODE3.octets(),
                pad: 0,
                expires_ns: now - 1,
            },
        )
        .unwrap();
    let reply = Ip4::udp(POD, 53, NEW_POD, 5353);
    assert_eq!(
        from_pod(&mut dp, &reply).verdict,
        CP_PASS,
        "not encapsulated"
    );
    let node_reply = Ip4::udp(NODE, 53, NEW_POD, 5353);
    assert_eq!(to_overlay(&mut dp, &node_reply).verdict, TC_ACT_SHOT);
    assert_eq!(dp.drop_count(DropReason::NoRemote).unwrap(), 1);
    assert_eq!(last_encap(&dp), None);

    // the same entry, still valid, is used: expiry is the only difference
    dp.learned
        .insert(
            &key,
            &Learned {
                tunnel_ip: NODE3.octets(),
                pad: 0,
                expires_ns: now + 60 * LEARN_TTL_NS,
            },
        )
        .unwrap();
    assert_eq!(from_pod(&mut dp, &reply).verdict, TC_ACT_REDIRECT);
    assert_eq!(last_encap(&dp), Some((NODE3, 1)));

    // expired again; a new packet from the pod learns it afresh
    dp.learned
        .insert(
            &key,
            &Learned {
                tunnel_ip: NODE3.octets(),
                pad: 0,
                expires_ns: 1,
            },
        )
        .unwrap();
    from_overlay(&mut dp, NODE3, &Ip4::udp(NEW_POD, 5353, POD, 53));
    let l = learned(&dp, NEW_POD).expect("relearned");
    assert!(l.expires_ns > monotonic_ns(), "valid again");
    assert_eq!(from_pod(&mut dp, &reply).verdict, TC_ACT_REDIRECT);
    assert_eq!(last_encap(&dp), Some((NODE3, 2)));
}

#[test]
fn an_authoritative_remote_beats_a_learned_one() {
    if !needs!().root().ready() {
        return;
    }
    let (_pins, mut dp) = node("authority");
    from_overlay(&mut dp, NODE3, &Ip4::udp(NEW_POD, 5353, POD, 53));
    assert_eq!(learned(&dp, NEW_POD).map(|l| l.tunnel_ip()), Some(NODE3));

    // the agent's entry arrives and places the pod on NODE2
    let k = lpm_key(0, NEW_POD.into(), 32).unwrap();
    dp.remotes.insert(&k, &Remote::new(NODE2)).unwrap();
    let r = from_pod(&mut dp, &Ip4::udp(POD, 53, NEW_POD, 5353));
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(last_encap(&dp), Some((NODE2, 1)));
    let r = to_overlay(&mut dp, &Ip4::udp(NODE, 53, NEW_POD, 5353));
    assert_eq!(r.verdict, CP_PASS);
    assert_eq!(last_encap(&dp), Some((NODE2, 2)));

    // and packets from elsewhere no longer touch the learned entry
    let l = learned(&dp, NEW_POD);
    from_overlay(&mut dp, NODE2, &Ip4::udp(NEW_POD, 5353, POD, 53));
    assert_eq!(
        learned(&dp, NEW_POD),
        l,
        "learning stops once authoritative"
    );
}

//! Batched map operations on the real kernel (`src/batch.rs`): what the
//! service sync reads and writes through them is what element-wise access
//! sees. Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;

use aya::maps::MapData;
use bpf_support::*;
use cozyplane_datapath::abi::Backend;
use cozyplane_datapath::batch;
use cozyplane_datapath::service::SvcTables;
use cozyplane_datapath::Datapath;

fn backend(i: u32) -> Backend {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i));
    Backend::new(0, ip, 8080, PROTO_TCP, 0)
}

#[test]
fn batched_reads_and_writes_match_element_wise_ones() {
    if !needs!().root().ready() {
        return;
    }
    let pins = PinDir::new("batch");
    let mut dp = Datapath::load(pins.path()).expect("load");
    // More than one lookup chunk (4096), so the batch token is followed.
    let want: Vec<(u32, Backend)> = (1..=9000).map(|i| (i, backend(i))).collect();
    dp.svc.backends.insert_batch(&want).expect("update batch");

    // The batch path itself works here (no silent fallback).
    let map = MapData::from_pin(pins.path().join("cp_backends")).unwrap();
    let raw: Vec<(u32, Backend)> = batch::lookup_all(map.fd().as_fd()).expect("lookup batch");
    let by_batch: BTreeMap<u32, Backend> = raw.into_iter().collect();
    let one_by_one: BTreeMap<u32, Backend> = dp
        .svc
        .backends
        .entries_one_by_one()
        .unwrap()
        .into_iter()
        .collect();
    let entries: BTreeMap<u32, Backend> = dp.svc.backends.entries().unwrap().into_iter().collect();
    let want: BTreeMap<u32, Backend> = want.into_iter().collect();
    assert_eq!(by_batch.len(), 9000);
    assert_eq!(by_batch, want);
    assert_eq!(one_by_one, want);
    assert_eq!(entries, want);

    // Overwrites in place, in order: the last value of a key wins.
    dp.svc
        .backends
        .insert_batch(&[(5, backend(50_005)), (5, backend(60_005))])
        .unwrap();
    assert_eq!(dp.svc.backends.get(&5).unwrap(), Some(backend(60_005)));

    // Slots: one range written with one batch reads back element-wise.
    let ids: Vec<u32> = (0..3000).map(|i| i * 7 + 1).collect();
    dp.svc.set_slots(1000, &ids).expect("slot batch");
    for (i, id) in (1000u32..).zip(&ids) {
        assert_eq!(dp.svc.slot(i).unwrap(), *id);
    }
    // Past the end of the array: the kernel refuses, nothing is claimed written.
    let end = cozyplane_datapath::abi::MAX_SVC_SLOTS - 2;
    let (written, _) = dp.svc.set_slots(end, &[1, 2, 3, 4]).unwrap_err();
    assert_eq!(written, 2);
    assert_eq!(dp.svc.slot(end + 1).unwrap(), 2);
}

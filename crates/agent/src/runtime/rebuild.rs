//! Rebuilding the per-pod datapath state from what the kernel holds, at
//! every start (docs/lessons.md #22).
//!
//! The veths with a [`super::record::Record`] are the truth: their `ports`,
//! `locals` and (VPC pods) `cp_netns` entries are re-put (a replaced, empty
//! map gets refilled) and their programs re-attached (the tc filters'
//! programs replaced in place, so no unfiltered window; a veth an older
//! agent attached with tcx links gets its filters, then loses the links). Then the stale entries are pruned, each
//! against a kernel witness: a `ports`, `locals`, `bridges` or `cp_netns`
//! entry is removed only if its ifindex is no live pod veth at all, and a
//! link pin only if its veth is gone. A live veth that lacks the record is never pruned: it may be a pod
//! of an older agent version, or an ADD in flight that will write its
//! record.
//!
//! Before all that, before the node's bring-up attaches the overlay
//! programs, [`seed_vnis`] makes sure `cp_vnis` knows the networks of the
//! local VPC pods.

use std::collections::BTreeSet;

use cozyplane_datapath::detach_tcx;

use super::kernel::SharedDatapath;
use super::plumber::NetlinkPlumber;
use crate::cni_handler::{Failure, Failures, StepError};
use crate::desired::NET_DEFAULT;

/// What a rebuild did.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// Pod veths whose state was re-put and whose programs were re-attached.
    pub restored: usize,
    /// Veths whose deletion a previous agent had begun, now deleted.
    pub finished_deletions: usize,
    /// Live pod veths without a record, left alone.
    pub unrecorded: usize,
    /// Stale `ports` entries removed.
    pub pruned_ports: usize,
    /// Stale `locals` entries removed.
    pub pruned_locals: usize,
    /// Stale `bridges` entries removed (with their bridged flows).
    pub pruned_bridges: usize,
    /// Stale `cp_netns` entries removed.
    pub pruned_netns: usize,
    /// VPC pods whose record lacks their network namespace cookie (plumbed
    /// by an agent before `cp_netns`): their sockets are treated as net 0's
    /// by socket-LB until they are re-created.
    pub netns_unknown: usize,
    /// Link pins of vanished veths removed.
    pub pruned_links: usize,
    /// What failed (the rest went on).
    pub failures: Failures,
}

/// Writes the VNI of every network a connected VPC pod of this node is on
/// into `cp_vnis` where it is missing; returns how many were written.
///
/// Why, and why before the node's bring-up: `from_overlay` refuses a VNI
/// that is not in `cp_vnis` (`unknown_vni`), and only the sync, after the
/// API watches have listed, writes the VPCs' VNIs. A restarted agent finds
/// the map pinned and full, but one whose `cp_vnis` pin was replaced (an
/// upgrade) would refuse the cross-node traffic of every local VPC pod from
/// the moment the bring-up attaches the overlay programs until that first
/// sync. The records name the networks (a VPC's VNI is its network id);
/// the sync owns every entry and prunes what the API no longer wants.
pub async fn seed_vnis(plumber: &NetlinkPlumber, dp: &SharedDatapath) -> Result<usize, StepError> {
    let (recorded, _) = plumber.scan().await?;
    let nets: BTreeSet<u32> = recorded
        .iter()
        .filter(|p| p.net != NET_DEFAULT && !p.severed)
        .map(|p| p.net)
        .collect();
    let mut guard = dp.lock();
    let mut seeded = 0;
    for net in nets {
        if guard.vnis.get(&net)?.is_none() {
            guard.vnis.insert(&net, &net)?;
            seeded += 1;
        }
    }
    Ok(seeded)
}

/// See the module docs.
pub async fn rebuild(
    plumber: &NetlinkPlumber,
    dp: &SharedDatapath,
) -> Result<RebuildReport, StepError> {
    let finished = plumber.finish_deletions().await?;
    let (recorded, unrecorded) = plumber.scan().await?;
    let mut report = RebuildReport {
        unrecorded: unrecorded.len(),
        finished_deletions: finished,
        ..RebuildReport::default()
    };
    let live: BTreeSet<u32> = recorded
        .iter()
        .map(|p| p.host_ifindex)
        .chain(unrecorded.iter().map(|l| l.index))
        .collect();
    let live_names: BTreeSet<String> = recorded
        .iter()
        .map(|p| p.host_ifname.clone())
        .chain(unrecorded.iter().map(|l| l.name.clone()))
        .collect();

    for p in &recorded {
        let ep = p.endpoint();
        // Entries before programs: from_pod drops traffic of unknown veths.
        let outcome = dp.put_endpoint(&ep).and_then(|()| {
            // the bridge of a connected VPC pod (its map is pinned, but
            // an incompatible-map upgrade starts it empty)
            if p.net != 0 && !p.severed {
                for (fabric, vpc) in crate::cni_handler::bridge_pairs(&p.fabric, &p.addresses) {
                    dp.lock().put_bridge(fabric, p.net, vpc, p.host_ifindex)?;
                }
            }
            // its namespace's network for socket-LB (severed pods too:
            // still no net-0 pod); the map is pinned, but an
            // incompatible-map upgrade starts it empty
            if let (true, Some(cookie)) = (p.net != NET_DEFAULT, p.netns_cookie) {
                dp.lock().svc.put_netns(cookie, p.net, p.host_ifindex)?;
            }
            Ok(())
        });
        let outcome = match outcome {
            Ok(()) => dp.attach_veth(&p.host_ifname, p.host_ifindex).await,
            Err(e) => Err(e),
        };
        if p.net != NET_DEFAULT && p.netns_cookie.is_none() {
            tracing::warn!(veth = %p.host_ifname, net = p.net, "a VPC pod's record has no network namespace cookie: socket-LB treats its sockets as net 0's until it is re-created");
            report.netns_unknown += 1;
        }
        match outcome {
            Ok(()) => report.restored += 1,
            Err(e) => report.failures.push(Failure::new(&p.host_ifname, e)),
        }
    }

    {
        let mut guard = dp.lock();
        let ports = guard.ports.entries()?;
        for (ifindex, _) in ports.iter().filter(|(i, _)| !live.contains(i)) {
            match guard.ports.remove(ifindex) {
                Ok(_) => report.pruned_ports += 1,
                Err(e) => report
                    .failures
                    .push(Failure::new(format!("ports[{ifindex}]"), e)),
            }
        }
        let locals = guard.locals.entries()?;
        for (key, ep) in locals.iter().filter(|(_, e)| !live.contains(&e.ifindex)) {
            match guard.locals.remove(key) {
                Ok(_) => report.pruned_locals += 1,
                Err(e) => report.failures.push(Failure::new(
                    format!("locals[{}] (ifindex {})", key.addr.to_ip(), ep.ifindex),
                    e,
                )),
            }
        }
        // A bridge left by a VPC pod whose veth is gone would refuse, as
        // misdelivered, all traffic to the next pod given its fabric
        // address (to_pod checks the bridge first).
        let bridges = guard.bridges.entries()?;
        for (key, b) in bridges.iter().filter(|(_, b)| !live.contains(&b.ifindex)) {
            let fabric = key.addr.to_ip();
            match guard.delete_bridge(fabric, Some(b.ifindex)) {
                Ok(_) => report.pruned_bridges += 1,
                Err(e) => report.failures.push(Failure::new(
                    format!("bridges[{fabric}] (ifindex {})", b.ifindex),
                    e,
                )),
            }
        }
        // A namespace entry of a gone pod only holds a slot (cookies are
        // never reused), but a full map would refuse the next VPC ADD.
        let netns = guard.svc.netns.entries()?;
        for (cookie, v) in netns.iter().filter(|(_, v)| !live.contains(&v.ifindex)) {
            match guard.svc.delete_netns(*cookie, Some(v.ifindex)) {
                Ok(_) => report.pruned_netns += 1,
                Err(e) => report.failures.push(Failure::new(
                    format!("netns[{cookie}] (ifindex {})", v.ifindex),
                    e,
                )),
            }
        }
    }

    // Link pins of pod veths that are gone ("<veth>-in" / "<veth>-out").
    let entries = match std::fs::read_dir(dp.links_dir()) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(source) => {
            return Err(StepError::Io {
                op: "list the link pins in",
                path: dp.links_dir().to_path_buf(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(veth) = name
            .strip_suffix("-in")
            .or_else(|| name.strip_suffix("-out"))
        else {
            continue;
        };
        if !veth.starts_with(cozyplane_datapath::netlink::HOST_VETH_PREFIX)
            || live_names.contains(veth)
        {
            continue;
        }
        match detach_tcx(&entry.path()) {
            Ok(_) => report.pruned_links += 1,
            Err(e) => report.failures.push(Failure::new(name, e)),
        }
    }
    Ok(report)
}

//! [`Plumber`] over the datapath crate's netlink `plumb` / `unplumb`, with
//! the rebuild [`Record`] as the host veth's alias.
//!
//! The agent works in its own network namespace (the node's); pods live in
//! the namespaces the runtime passes as `CNI_NETNS`.
//!
//! # DEL does not wait for the kernel to delete the veth
//! Deleting a veth costs 20–30 ms of kernel time under RTNL, one at a
//! time (docs/netlink.md), which alone would break the DEL latency target,
//! and every netlink request of the next ADD or DEL would queue behind it.
//! By the time `unplumb` runs, the handler has removed the `ports`/`locals`
//! entries, so the veth carries no traffic of ours (its `from_pod` filter
//! drops what the dying pod still sends: fail closed). `unplumb` therefore
//! marks the veth doomed in one request — alias [`DELETING`] (so a
//! restarted agent finishes the deletion instead of restoring the pod) and
//! link group [`DOOMED_GROUP`] — removes the node's routes (and a VPC pod's
//! bridge neighbour) to the pod's addresses, so an address DEL releases is
//! free in the kernel too, and returns. A reaper task deletes the doomed
//! veths later, all in one request (`delete link group`, which the kernel
//! unregisters as one batch: 10 veths in 18 ms, against 224 ms one by
//! one), once no plumbing operation has started for [`QUIET`], or at the
//! latest [`MAX_DELAY`] after the first of them was doomed. A name stays
//! reserved until its veth is gone: `plumb` and `unplumb` of a doomed name
//! delete that veth first, and `scan` reaps every doomed veth first.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use async_trait::async_trait;
use cozyplane_datapath::netlink::{
    configure_pair, create_pair, discard_pair, host_veth_name, plumb_bridge, unplumb,
    unplumb_bridge, LinkInfo, MacAddr, Netns, NetnsHandle, NlHandle, Pair, PairRequest,
    PlumbRequest, HOST_VETH_PREFIX,
};
use cozyplane_errors::Chain;

use super::record::{Record, DELETING};
use crate::cni_handler::{PairSpec, PlumbSpec, Plumbed, Plumber, StepError};

/// The link group of doomed pod veths (see the module docs): any value but
/// 0, the group every link starts in; this one spells "cp" and is unlikely
/// to be anyone else's.
pub const DOOMED_GROUP: u32 = 0x6370_00de;
/// How long no plumbing operation must have started before the reaper
/// deletes the doomed veths (its request holds RTNL for ~20 ms, which an
/// ADD arriving meanwhile would wait for).
pub const QUIET: Duration = Duration::from_millis(50);
/// The longest a doomed veth waits for a quiet moment.
pub const MAX_DELAY: Duration = Duration::from_millis(500);

/// See the module docs.
pub struct NetlinkPlumber {
    host: NetnsHandle,
    reaper: Arc<Reaper>,
}

/// The doomed veths and what the reaper task needs.
struct Reaper {
    nl: NlHandle,
    /// Doomed host veth name → ifindex, not yet deleted. Held while a
    /// veth is doomed and while the reaper deletes, so the two never
    /// interleave.
    pending: tokio::sync::Mutex<HashMap<String, u32>>,
    wake: Notify,
    /// When the last plumbing operation started.
    last_busy: Mutex<Instant>,
    started: AtomicBool,
}

impl Reaper {
    fn busy(&self) {
        *self.last_busy.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn since_busy(&self) -> Duration {
        self.last_busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Deletes every doomed veth now, in one request (the pending lock held).
    async fn reap(&self, pending: &mut HashMap<String, u32>) {
        if pending.is_empty() {
            return;
        }
        match self.nl.delete_group(DOOMED_GROUP).await {
            Ok(_) => pending.clear(),
            Err(e) => {
                tracing::warn!(error = %Chain(&e), veths = pending.len(), "deleting the doomed veths as a group failed; deleting them one by one");
                for (name, index) in pending.drain() {
                    if let Err(e) = self.nl.delete_link(index).await {
                        tracing::warn!(link = %name, error = %Chain(&e), "background veth deletion failed");
                    }
                }
            }
        }
    }

    /// The task: after a veth is doomed, waits for a quiet moment (at most
    /// [`MAX_DELAY`]), then reaps.
    async fn run(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            let first = Instant::now();
            loop {
                let since = self.since_busy();
                let waited = first.elapsed();
                if since >= QUIET || waited >= MAX_DELAY {
                    break;
                }
                tokio::time::sleep((QUIET - since).min(MAX_DELAY - waited)).await;
            }
            let mut pending = self.pending.lock().await;
            self.reap(&mut pending).await;
        }
    }
}

impl NetlinkPlumber {
    /// Plumbs from the namespace behind `host`.
    pub fn new(host: NetnsHandle) -> Self {
        let reaper = Arc::new(Reaper {
            nl: host.nl.clone(),
            pending: tokio::sync::Mutex::new(HashMap::new()),
            wake: Notify::new(),
            last_busy: Mutex::new(Instant::now()),
            started: AtomicBool::new(false),
        });
        Self { host, reaper }
    }

    /// Deletes the doomed veth called `name`, if there is one, now.
    async fn settle(&self, name: &str) {
        let mut pending = self.reaper.pending.lock().await;
        if let Some(index) = pending.remove(name) {
            if let Err(e) = self.host.nl.delete_link(index).await {
                tracing::warn!(link = %name, error = %Chain(&e), "deleting a doomed veth failed");
            }
        }
    }

    /// [`Plumber::plumb`]'s work. A refusal before the kernel was asked
    /// hands the pair back; `configure_pair` deletes it on its own failures.
    async fn plumb_pair(
        &self,
        spec: &PlumbSpec,
        pair: Pair,
    ) -> Result<Plumbed, (StepError, Option<Pair>)> {
        let host_ifname = host_veth_name(&spec.container_id, &spec.ifname);
        let (mut ipv4, mut ipv6) = (None, None);
        for a in &spec.addresses {
            match a {
                IpAddr::V4(v4) if ipv4.is_none() => ipv4 = Some(*v4),
                IpAddr::V6(v6) if ipv6.is_none() => ipv6 = Some(*v6),
                other => {
                    let error =
                        StepError::Invalid(format!("more than one address of {other}'s family"));
                    return Err((error, Some(pair)));
                }
            }
        }
        // The record names the pod MAC, and is written before the MAC is
        // set: fix it up front, derived from the address like the kernel's
        // own IPv4-in-MAC conventions (0a:58:…), so it is stable across a
        // re-plumb of the same pod.
        let pod_mac = pod_mac_for(&spec.addresses);
        // A VPC pod's namespace cookie, recorded with it: the ADD keys its
        // `cp_netns` entry by it, the DEL and a rebuild find it here.
        let netns_cookie = if spec.net != 0 {
            let cookie = async { Netns::open(&spec.netns)?.cookie_async().await };
            match cookie.await {
                Ok(cookie) => Some(cookie),
                Err(e) => return Err((StepError::from(e), Some(pair))),
            }
        } else {
            None
        };
        let record = Record {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            pod_mac,
            addresses: spec.addresses.clone(),
            net: spec.net,
            fabric: spec.fabric.clone(),
            severed: false,
            netns_cookie,
        };
        let alias = record.encode();
        let req = PlumbRequest {
            pod_netns: Path::new(&spec.netns),
            ifname: &spec.ifname,
            host_ifname: &host_ifname,
            mtu: spec.mtu,
            ipv4,
            ipv6,
            pod_mac: Some(cozyplane_datapath::netlink::MacAddr(pod_mac)),
            alias: &alias,
            // A VPC pod's VPC addresses are never host routes (twin VPCs
            // share them); its fabric ones come with the bridge
            // (`plumb_bridge`).
            host_routes: (spec.net != 0).then_some(&[][..]),
        };
        let done = configure_pair(pair, &req)
            .await
            .map_err(|e| (StepError::from(e), None))?;
        Ok(Plumbed {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            host_ifname,
            host_ifindex: done.host_ifindex,
            pod_mac: done.pod_mac.0,
            addresses: spec.addresses.clone(),
            net: spec.net,
            fabric: spec.fabric.clone(),
            severed: false,
            netns_cookie,
        })
    }

    /// Deletes every doomed veth now.
    pub async fn settle_all(&self) {
        let mut pending = self.reaper.pending.lock().await;
        self.reaper.reap(&mut pending).await;
    }

    /// Deletes pod veths a previous agent had doomed: its group at once,
    /// then any marked only by their alias (an agent before groups).
    pub async fn finish_deletions(&self) -> Result<usize, StepError> {
        let links = self.host.nl.list_links().await.map_err(StepError::from)?;
        let doomed: Vec<&LinkInfo> = links
            .iter()
            .filter(|l| is_pod_veth(l) && l.alias.as_deref() == Some(DELETING))
            .collect();
        if doomed.is_empty() {
            return Ok(0);
        }
        self.host
            .nl
            .delete_group(DOOMED_GROUP)
            .await
            .map_err(StepError::from)?;
        for link in &doomed {
            // gone with the group, or else doomed by an older agent
            self.host
                .nl
                .delete_link(link.index)
                .await
                .map_err(StepError::from)?;
        }
        Ok(doomed.len())
    }

    /// Every pod veth of ours on this node: the ones with a record, and the
    /// names of those without (a plumb killed before its alias was written,
    /// or a record this version cannot read).
    pub async fn scan(&self) -> Result<(Vec<Plumbed>, Vec<LinkInfo>), StepError> {
        self.settle_all().await;
        let links = self.host.nl.list_links().await.map_err(StepError::from)?;
        let mut recorded = Vec::new();
        let mut unrecorded = Vec::new();
        for link in links {
            if !is_pod_veth(&link) || link.alias.as_deref() == Some(DELETING) {
                continue;
            }
            match link.alias.as_deref().and_then(Record::decode) {
                Some(r) if host_veth_name(&r.container_id, &r.ifname) == link.name => {
                    recorded.push(to_plumbed(&link, r));
                }
                _ => unrecorded.push(link),
            }
        }
        Ok((recorded, unrecorded))
    }
}

fn is_pod_veth(link: &LinkInfo) -> bool {
    link.name.starts_with(HOST_VETH_PREFIX) && link.kind.as_deref() == Some("veth")
}

fn to_plumbed(link: &LinkInfo, r: Record) -> Plumbed {
    Plumbed {
        container_id: r.container_id,
        ifname: r.ifname,
        host_ifname: link.name.clone(),
        host_ifindex: link.index,
        pod_mac: r.pod_mac,
        addresses: r.addresses,
        net: r.net,
        fabric: r.fabric,
        severed: r.severed,
        netns_cookie: r.netns_cookie,
    }
}

#[async_trait]
impl Plumber for NetlinkPlumber {
    type Pair = Pair;

    async fn prepare(&self, spec: &PairSpec) -> Result<Pair, StepError> {
        self.reaper.busy();
        let host_ifname = host_veth_name(&spec.container_id, &spec.ifname);
        self.settle(&host_ifname).await;
        let req = PairRequest {
            pod_netns: Path::new(&spec.netns),
            ifname: &spec.ifname,
            host_ifname: &host_ifname,
            mtu: spec.mtu,
        };
        create_pair(&self.host, &req).await.map_err(StepError::from)
    }

    async fn plumb(&self, spec: &PlumbSpec, pair: Pair) -> Result<Plumbed, StepError> {
        self.reaper.busy();
        match self.plumb_pair(spec, pair).await {
            Ok(done) => Ok(done),
            Err((error, None)) => Err(error),
            // Refused before the kernel was asked: the pair goes here.
            Err((error, Some(pair))) => {
                if let Err(e) = discard_pair(pair).await {
                    tracing::warn!(container = %spec.container_id, error = %Chain(&e), "cannot delete a veth pair whose plumbing was refused");
                }
                Err(error)
            }
        }
    }

    async fn unplumb(&self, container_id: &str, ifname: &str) -> Result<bool, StepError> {
        self.reaper.busy();
        let name = host_veth_name(container_id, ifname);
        self.settle(&name).await;
        let nl = &self.host.nl;
        let Some(link) = nl.link_by_name(&name).await.map_err(StepError::from)? else {
            return Ok(false);
        };
        if !is_pod_veth(&link) {
            // Refuses with a clear error; never deletes a foreign link.
            return unplumb(nl, &name).await.map_err(StepError::from);
        }
        {
            let mut pending = self.reaper.pending.lock().await;
            nl.set_alias_and_group(link.index, DELETING, DOOMED_GROUP)
                .await
                .map_err(StepError::from)?;
            pending.insert(name.clone(), link.index);
        }
        // The node's routes to the pod go now, not with the veth: DEL
        // releases the addresses when this returns, and the next pod given
        // one of them must be able to route it (a route through the dying
        // veth would fail its ADD with EEXIST).
        if let Some(r) = link.alias.as_deref().and_then(Record::decode) {
            let routed = if r.net == 0 { r.addresses } else { r.fabric };
            for a in routed {
                unplumb_bridge(nl, link.index, a)
                    .await
                    .map_err(StepError::from)?;
            }
        }
        if !self.reaper.started.swap(true, Ordering::SeqCst) {
            tokio::spawn(self.reaper.clone().run());
        }
        self.reaper.wake.notify_one();
        Ok(true)
    }

    async fn inspect(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Plumbed>, StepError> {
        self.reaper.busy();
        let name = host_veth_name(container_id, ifname);
        self.settle(&name).await;
        let Some(link) = self
            .host
            .nl
            .link_by_name(&name)
            .await
            .map_err(StepError::from)?
        else {
            return Ok(None);
        };
        if !is_pod_veth(&link) {
            return Ok(None);
        }
        match link.alias.as_deref().and_then(Record::decode) {
            Some(r) if r.container_id == container_id && r.ifname == ifname => {
                Ok(Some(to_plumbed(&link, r)))
            }
            // A name collision with another attachment's veth: not ours.
            Some(_) => Ok(None),
            // Our name but no record yet (a plumb killed right after
            // creating the pair): ours, holding no known address.
            None => Ok(Some(Plumbed {
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                host_ifname: link.name.clone(),
                host_ifindex: link.index,
                pod_mac: [0; 6],
                addresses: Vec::new(),
                net: 0,
                fabric: Vec::new(),
                severed: false,
                netns_cookie: None,
            })),
        }
    }

    async fn list(&self) -> Result<Vec<Plumbed>, StepError> {
        Ok(self.scan().await?.0)
    }

    async fn remove_unrecorded(&self) -> Result<usize, StepError> {
        let (_, unrecorded) = self.scan().await?;
        let mut n = 0;
        // Only veths with no alias at all: a plumb writes the alias right
        // after creating the pair, so no alias means it was killed in
        // between. An alias this version cannot read may be a newer agent's
        // record: it stays.
        for link in unrecorded.iter().filter(|l| l.alias.is_none()) {
            tracing::info!(link = %link.name, "deleting a pod veth left without a record");
            if self
                .host
                .nl
                .delete_link(link.index)
                .await
                .map_err(StepError::from)?
            {
                n += 1;
            }
        }
        Ok(n)
    }

    async fn plumb_bridge(
        &self,
        host_ifindex: u32,
        fabric: IpAddr,
        pod_mac: [u8; 6],
    ) -> Result<(), StepError> {
        plumb_bridge(&self.host.nl, host_ifindex, fabric, MacAddr(pod_mac))
            .await
            .map_err(StepError::from)
    }

    async fn unplumb_bridge(&self, host_ifindex: u32, fabric: IpAddr) -> Result<(), StepError> {
        unplumb_bridge(&self.host.nl, host_ifindex, fabric)
            .await
            .map(|_| ())
            .map_err(StepError::from)
    }
}

impl NetlinkPlumber {
    /// The attachment recorded on host veth `ifindex`, or `None` if it is no
    /// recorded pod veth. Reads only.
    pub async fn recorded(&self, ifindex: u32) -> Result<Option<Plumbed>, StepError> {
        let nl = &self.host.nl;
        let Some(link) = nl.link_by_index(ifindex).await.map_err(StepError::from)? else {
            return Ok(None);
        };
        if !is_pod_veth(&link) {
            return Ok(None);
        }
        Ok(link
            .alias
            .as_deref()
            .and_then(Record::decode)
            .map(|r| to_plumbed(&link, r)))
    }

    /// Marks the VPC attachment on host veth `ifindex` severed in its
    /// record, so a restarted agent restores it quarantined. Returns the
    /// attachment (as it was), or `None` if `ifindex` is no recorded pod
    /// veth.
    pub async fn mark_severed(&self, ifindex: u32) -> Result<Option<Plumbed>, StepError> {
        let nl = &self.host.nl;
        let Some(link) = nl.link_by_index(ifindex).await.map_err(StepError::from)? else {
            return Ok(None);
        };
        if !is_pod_veth(&link) {
            return Ok(None);
        }
        let Some(record) = link.alias.as_deref().and_then(Record::decode) else {
            return Ok(None);
        };
        if record.net != 0 && !record.severed {
            let marked = Record {
                severed: true,
                ..record.clone()
            };
            nl.set_alias(ifindex, &marked.encode())
                .await
                .map_err(StepError::from)?;
        }
        Ok(Some(to_plumbed(&link, record)))
    }
}

/// A locally administered unicast MAC from the pod's first address (IPv4
/// preferred): `0a:58` + the IPv4 octets, or `0a:59` + the last four bytes
/// of the IPv6 address.
pub fn pod_mac_for(addresses: &[IpAddr]) -> [u8; 6] {
    let v4 = addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(v4.octets()),
        IpAddr::V6(_) => None,
    });
    let (tag, tail) = match (v4, addresses.first()) {
        (Some(o), _) => (0x58, o),
        (None, Some(IpAddr::V6(v6))) => {
            let o = v6.octets();
            (0x59, [o[12], o[13], o[14], o[15]])
        }
        _ => (0x5a, [0; 4]),
    };
    [0x0a, tag, tail[0], tail[1], tail[2], tail[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_macs_are_local_unicast_and_follow_the_address() {
        let m = pod_mac_for(&["10.244.1.2".parse().unwrap()]);
        assert_eq!(m, [0x0a, 0x58, 10, 244, 1, 2]);
        assert_eq!(m[0] & 0x01, 0, "unicast");
        assert_eq!(m[0] & 0x02, 0x02, "locally administered");
        let m6 = pod_mac_for(&["fd00::1:2".parse().unwrap()]);
        assert_eq!(m6, [0x0a, 0x59, 0, 1, 0, 2]);
        assert_ne!(
            pod_mac_for(&["10.244.1.2".parse().unwrap()]),
            pod_mac_for(&["10.244.1.3".parse().unwrap()])
        );
    }
}

//! [`Plumber`] over the datapath crate's netlink `plumb` / `unplumb`, with
//! the rebuild [`Record`] as the host veth's alias.
//!
//! The agent works in its own network namespace (the node's); pods live in
//! the namespaces the runtime passes as `CNI_NETNS`.
//!
//! # DEL does not wait for the kernel to delete the veth
//! Deleting a veth costs 20–30 ms of kernel time and concurrent deletes
//! queue behind one lock (docs/netlink.md), which alone would break the
//! DEL latency target. By the time `unplumb` runs, the handler has already
//! detached the programs and removed the `ports`/`locals` entries, so the
//! veth carries no traffic of ours. `unplumb` therefore overwrites the
//! alias with [`DELETING`] (so a restarted agent finishes the deletion
//! instead of restoring the pod), removes the node's routes (and a VPC
//! pod's bridge neighbour) to the pod's addresses, so an address DEL
//! releases is free in the kernel too, and deletes the link in a
//! background task. The name stays reserved until the kernel is done: `plumb`,
//! `inspect` and `list` first wait for a pending deletion of the names
//! they touch.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use async_trait::async_trait;
use cozyplane_datapath::netlink::{
    host_veth_name, plumb, plumb_bridge, unplumb, unplumb_bridge, LinkInfo, MacAddr, Netns,
    NetnsHandle, PlumbRequest, HOST_VETH_PREFIX,
};
use cozyplane_errors::Chain;

use super::record::{Record, DELETING};
use crate::cni_handler::{PlumbSpec, Plumbed, Plumber, StepError};

/// See the module docs.
pub struct NetlinkPlumber {
    host: NetnsHandle,
    /// Host veth name → "deleted" flag of its pending background deletion.
    pending: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl NetlinkPlumber {
    /// Plumbs from the namespace behind `host`.
    pub fn new(host: NetnsHandle) -> Self {
        Self {
            host,
            pending: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a background deletion of `name`, if any, is over.
    async fn settle(&self, name: &str) {
        let rx = self.pending().get(name).cloned();
        if let Some(mut rx) = rx {
            // An error means the task is gone: nothing left to wait for.
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Waits for every background deletion.
    pub async fn settle_all(&self) {
        let all: Vec<watch::Receiver<bool>> = self.pending().values().cloned().collect();
        for mut rx in all {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Deletes pod veths a previous agent had begun deleting.
    pub async fn finish_deletions(&self) -> Result<usize, StepError> {
        let links = self.host.nl.list_links().await.map_err(StepError::from)?;
        let mut n = 0;
        for link in links.iter().filter(|l| is_pod_veth(l)) {
            if link.alias.as_deref() == Some(DELETING) {
                self.host
                    .nl
                    .delete_link(link.index)
                    .await
                    .map_err(StepError::from)?;
                n += 1;
            }
        }
        Ok(n)
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
    async fn plumb(&self, spec: &PlumbSpec) -> Result<Plumbed, StepError> {
        let host_ifname = host_veth_name(&spec.container_id, &spec.ifname);
        self.settle(&host_ifname).await;
        let (mut ipv4, mut ipv6) = (None, None);
        for a in &spec.addresses {
            match a {
                IpAddr::V4(v4) if ipv4.is_none() => ipv4 = Some(*v4),
                IpAddr::V6(v6) if ipv6.is_none() => ipv6 = Some(*v6),
                other => {
                    return Err(StepError::Invalid(format!(
                        "more than one address of {other}'s family"
                    )))
                }
            }
        }
        // The pod MAC is only known after creation, yet the record must be
        // written right after it: fix the MAC up front, derived from the
        // address like the kernel's own IPv4-in-MAC conventions (0a:58:…),
        // so it is stable across a re-plumb of the same pod.
        let pod_mac = pod_mac_for(&spec.addresses);
        // A VPC pod's namespace cookie, recorded with it: the ADD keys its
        // `cp_netns` entry by it, the DEL and a rebuild find it here.
        let netns_cookie = if spec.net != 0 {
            let ns = Netns::open(&spec.netns).map_err(StepError::from)?;
            Some(ns.cookie_async().await.map_err(StepError::from)?)
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
        let done = plumb(&self.host, &req).await.map_err(StepError::from)?;
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

    async fn unplumb(&self, container_id: &str, ifname: &str) -> Result<bool, StepError> {
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
        nl.set_alias(link.index, DELETING)
            .await
            .map_err(StepError::from)?;
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
        let (tx, rx) = watch::channel(false);
        self.pending().insert(name.clone(), rx);
        let nl = nl.clone();
        let index = link.index;
        let pending_name = name.clone();
        let pending = self.pending.clone();
        tokio::spawn(async move {
            if let Err(e) = nl.delete_link(index).await {
                tracing::warn!(link = %pending_name, error = %Chain(&e), "background veth deletion failed");
            }
            // Flag first, then forget: a waiter holding a clone sees the
            // flag, a later one finds no entry. A newer deletion of the same
            // name (another channel) is left in place.
            let _ = tx.send(true);
            let mut map = pending.lock().unwrap_or_else(|p| p.into_inner());
            if map
                .get(&pending_name)
                .is_some_and(|rx| rx.same_channel(&tx.subscribe()))
            {
                map.remove(&pending_name);
            }
        });
        Ok(true)
    }

    async fn inspect(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Plumbed>, StepError> {
        let name = host_veth_name(container_id, ifname);
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

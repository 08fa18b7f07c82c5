//! The datapath as the agent's core sees it: [`DatapathWriter`] for the CNI
//! handler and [`KernelMap`] views of the overlay maps for the sync.
//!
//! This is the conversion seam [`crate::desired`] promises: plain Rust
//! values in, `#[repr(C)]` map ABI out, nowhere else.
//!
//! All map and tcx operations go through one mutex around [`Datapath`]:
//! they are a few syscalls each, and attach/pin sequences must not run
//! concurrently (docs/lessons.md #27). The pod veths' tc filters are
//! netlink requests on cloned program fds and need no lock: each
//! attachment's steps are serialized by the CNI handler's per-attachment
//! lock.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use cozyplane_datapath::abi::{
    lpm_key, vtep_key, Addr128, Endpoint, EpKey, LpmKey, Port, Remote, VTEP_F_NODE,
};
use cozyplane_datapath::netlink::NlHandle;
use cozyplane_datapath::{
    attach_pod_programs, check_pod_programs, Datapath, DatapathError, PodPrograms,
};

use crate::cni_handler::{DatapathWriter, StepError};
use crate::desired::{LocalEndpoint, RemoteKey, TunnelEndpoint, VtepOwner};
use crate::sync::KernelMap;

/// The loaded datapath, shared by the CNI handler, the sync and metrics.
#[derive(Clone)]
pub struct SharedDatapath {
    inner: Arc<Mutex<Datapath>>,
    links_dir: PathBuf,
    nl: NlHandle,
    pod_programs: Arc<PodPrograms>,
}

impl SharedDatapath {
    /// Wraps `dp`; tcx links are pinned under `links_dir`, pod programs are
    /// attached through `nl` (a netlink handle in the node's namespace).
    pub fn new(mut dp: Datapath, links_dir: PathBuf, nl: NlHandle) -> Result<Self, DatapathError> {
        let pod_programs = Arc::new(dp.pod_programs()?);
        Ok(Self {
            inner: Arc::new(Mutex::new(dp)),
            links_dir,
            nl,
            pod_programs,
        })
    }

    /// Locks the datapath. A panic while holding the lock cannot leave a
    /// map half-written (each write is one syscall), so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Datapath> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where tcx links are pinned.
    pub fn links_dir(&self) -> &Path {
        &self.links_dir
    }

    /// The tcx link pins a pod veth had under agents before pod programs
    /// became tc filters: (`from_pod` ingress, `to_pod` egress). A rebuild
    /// removes them once the filters are in place.
    pub fn veth_link_pins(&self, host_ifname: &str) -> (PathBuf, PathBuf) {
        (
            self.links_dir.join(format!("{host_ifname}-in")),
            self.links_dir.join(format!("{host_ifname}-out")),
        )
    }

    /// Attaches `from_pod` / `to_pod` to a pod veth as tc filters, or
    /// replaces the programs of the filters already there (atomically, so a
    /// restarted agent never leaves a pod unfiltered); then removes the
    /// veth's tcx link pins, if an older agent left any (until then both ran:
    /// tcx first, and the filters only saw what it passed on).
    ///
    /// Why tc filters and not tcx links: each tcx attach waits for an RCU
    /// grace period under RTNL (~14 ms here, two per pod), which was most of
    /// a CNI ADD (docs/datapath.md, "Attachment").
    pub async fn attach_veth(&self, host_ifname: &str, ifindex: u32) -> Result<(), DatapathError> {
        attach_pod_programs(&self.nl, ifindex, &self.pod_programs).await?;
        self.remove_tcx_pins(host_ifname)
    }

    /// Releases what a pod veth's programs hold outside the veth: the tcx
    /// link pins an older agent left for it, if any. The tc filters stay
    /// until the veth is deleted (it takes them along): the callers (DEL,
    /// rollback, reset) have removed or are removing the veth's `ports`
    /// entry, so `from_pod` drops whatever a dying pod still sends (fail
    /// closed), where a veth without its filters would hand it to the node
    /// unfiltered until the deletion. Idempotent.
    pub fn detach_veth(&self, host_ifname: &str) -> Result<(), DatapathError> {
        self.remove_tcx_pins(host_ifname)
    }

    /// What is wrong with a pod veth's programs (`None`: both filters run
    /// this datapath's programs).
    pub async fn check_veth(&self, ifindex: u32) -> Result<Option<String>, DatapathError> {
        check_pod_programs(&self.nl, ifindex, &self.pod_programs).await
    }

    /// Removing a pin drops the last reference to its link; the kernel
    /// detaches it asynchronously (or the veth's deletion does).
    fn remove_tcx_pins(&self, host_ifname: &str) -> Result<(), DatapathError> {
        let (pin_in, pin_out) = self.veth_link_pins(host_ifname);
        for pin in [pin_in, pin_out] {
            match std::fs::remove_file(&pin) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(DatapathError::link(pin, "removing the pin", e)),
            }
        }
        Ok(())
    }

    /// `ports[ifindex]` and `locals[{net, addr}]` for one endpoint.
    pub fn put_endpoint(&self, ep: &LocalEndpoint) -> Result<(), DatapathError> {
        let mut dp = self.lock();
        dp.ports.insert(
            &ep.host_ifindex,
            &Port {
                net: ep.net,
                flags: if ep.severed {
                    cozyplane_datapath::abi::PORT_F_QUARANTINE
                } else {
                    0
                },
            },
        )?;
        for (net, addr) in ep.keys() {
            dp.locals.insert(
                &EpKey::new(net, addr),
                &Endpoint {
                    ifindex: ep.host_ifindex,
                    mac: ep.pod_mac,
                    flags: 0,
                },
            )?;
        }
        Ok(())
    }

    /// A view of `cp_peer_routes` for the sync.
    pub fn peer_routes(&self) -> PeerRoutesMap<'_> {
        PeerRoutesMap(self)
    }

    /// A view of `cp_vnis` for the sync.
    pub fn vnis(&self) -> VnisMap<'_> {
        VnisMap(self)
    }

    /// A view of `cp_remotes` for the sync.
    pub fn remotes(&self) -> RemotesMap<'_> {
        RemotesMap(self)
    }

    /// A view of `cp_node_remotes` for the sync.
    pub fn node_remotes(&self) -> NodeRemotesMap<'_> {
        NodeRemotesMap(self)
    }

    /// A view of `cp_vteps` for the sync.
    pub fn vteps(&self) -> VtepsMap<'_> {
        VtepsMap(self)
    }
}

#[async_trait]
impl DatapathWriter for SharedDatapath {
    async fn put_port(&self, ifindex: u32, net: u32) -> Result<(), StepError> {
        self.lock()
            .ports
            .insert(&ifindex, &Port { net, flags: 0 })
            .map_err(StepError::from)
    }

    async fn delete_port(&self, ifindex: u32) -> Result<(), StepError> {
        self.lock()
            .ports
            .remove(&ifindex)
            .map(|_| ())
            .map_err(StepError::from)
    }

    async fn quarantine_port(&self, ifindex: u32) -> Result<(), StepError> {
        self.lock()
            .set_port_quarantine(ifindex, true)
            .map(|_| ())
            .map_err(StepError::from)
    }

    async fn put_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Result<(), StepError> {
        self.lock()
            .locals
            .insert(
                &EpKey::new(net, addr),
                &Endpoint {
                    ifindex,
                    mac,
                    flags: 0,
                },
            )
            .map_err(StepError::from)
    }

    async fn delete_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: Option<u32>,
    ) -> Result<(), StepError> {
        let key = EpKey::new(net, addr);
        let mut dp = self.lock();
        if let Some(want) = ifindex {
            match dp.locals.get(&key).map_err(StepError::from)? {
                Some(have) if have.ifindex != want => return Ok(()),
                None => return Ok(()),
                Some(_) => {}
            }
        }
        dp.locals.remove(&key).map(|_| ()).map_err(StepError::from)
    }

    async fn put_netns(&self, cookie: u64, net: u32, ifindex: u32) -> Result<(), StepError> {
        self.lock()
            .svc
            .put_netns(cookie, net, ifindex)
            .map_err(StepError::from)
    }

    async fn delete_netns(&self, cookie: u64, ifindex: Option<u32>) -> Result<(), StepError> {
        self.lock()
            .svc
            .delete_netns(cookie, ifindex)
            .map(|_| ())
            .map_err(StepError::from)
    }

    async fn put_bridge(
        &self,
        fabric: IpAddr,
        net: u32,
        vpc: IpAddr,
        ifindex: u32,
    ) -> Result<(), StepError> {
        self.lock()
            .put_bridge(fabric, net, vpc, ifindex)
            .map_err(StepError::from)
    }

    async fn delete_bridge(&self, fabric: IpAddr, ifindex: Option<u32>) -> Result<(), StepError> {
        self.lock()
            .delete_bridge(fabric, ifindex)
            .map(|_| ())
            .map_err(StepError::from)
    }

    async fn attach(&self, host_ifname: &str, ifindex: u32) -> Result<(), StepError> {
        self.attach_veth(host_ifname, ifindex)
            .await
            .map_err(StepError::from)
    }

    async fn detach(&self, host_ifname: &str, _ifindex: u32) -> Result<(), StepError> {
        self.detach_veth(host_ifname).map_err(StepError::from)
    }

    async fn check(&self, ep: &LocalEndpoint) -> Result<(), StepError> {
        self.check_entries(ep)?;
        match self.check_veth(ep.host_ifindex).await? {
            None => Ok(()),
            Some(wrong) => Err(StepError::Mismatch(wrong)),
        }
    }
}

impl SharedDatapath {
    /// CHECK's map half: the endpoint's `ports` and `locals` entries.
    fn check_entries(&self, ep: &LocalEndpoint) -> Result<(), StepError> {
        let dp = self.lock();
        match dp.ports.get(&ep.host_ifindex).map_err(StepError::from)? {
            Some(p) if p.net == ep.net => {}
            other => {
                return Err(StepError::Mismatch(format!(
                    "ports[{}] is {other:?}, want net {}",
                    ep.host_ifindex, ep.net
                )))
            }
        }
        for (net, addr) in ep.keys() {
            let have = dp
                .locals
                .get(&EpKey::new(net, addr))
                .map_err(StepError::from)?;
            match have {
                Some(e) if e.ifindex == ep.host_ifindex && e.mac == ep.pod_mac => {}
                other => {
                    return Err(StepError::Mismatch(format!(
                        "locals[net {net} {addr}] is {other:?}, want ifindex {} mac {:?}",
                        ep.host_ifindex, ep.pod_mac
                    )))
                }
            }
        }
        Ok(())
    }
}

/// `RemoteKey` ↔ scoped LPM key.
fn remote_key_to_lpm(k: &RemoteKey) -> Result<LpmKey, DatapathError> {
    lpm_key(k.net, k.addr, k.prefix_len)
        .ok_or_else(|| DatapathError::InvalidValue(format!("prefix length of {k} is too long")))
}

fn lpm_to_remote_key(k: &LpmKey) -> Option<RemoteKey> {
    let data = k.data();
    let addr = data.addr.to_ip();
    let bits = k
        .prefix_len()
        .checked_sub(cozyplane_datapath::abi::LPM_NET_BITS)?;
    let prefix_len = match addr {
        IpAddr::V4(_) => bits.checked_sub(96)?,
        IpAddr::V6(_) => bits,
    };
    Some(RemoteKey {
        net: data.net,
        addr,
        prefix_len: u8::try_from(prefix_len).ok()?,
    })
}

/// `cp_remotes` entries of every network (net 0 and the VPCs').
pub struct RemotesMap<'a>(&'a SharedDatapath);

impl KernelMap<RemoteKey, TunnelEndpoint> for RemotesMap<'_> {
    type Error = DatapathError;

    fn iter(&self) -> Result<Vec<(RemoteKey, TunnelEndpoint)>, DatapathError> {
        let entries = self.0.lock().remotes.entries()?;
        Ok(entries
            .iter()
            .filter_map(|(k, v)| Some((lpm_to_remote_key(k)?, TunnelEndpoint(v.tunnel_ip()))))
            .collect())
    }

    fn insert(&mut self, key: &RemoteKey, value: &TunnelEndpoint) -> Result<(), DatapathError> {
        let k = remote_key_to_lpm(key)?;
        self.0.lock().remotes.insert(&k, &Remote::new(value.0))
    }

    fn remove(&mut self, key: &RemoteKey) -> Result<bool, DatapathError> {
        let k = remote_key_to_lpm(key)?;
        self.0.lock().remotes.remove(&k)
    }
}

/// `cp_node_remotes`.
pub struct NodeRemotesMap<'a>(&'a SharedDatapath);

impl KernelMap<IpAddr, TunnelEndpoint> for NodeRemotesMap<'_> {
    type Error = DatapathError;

    fn iter(&self) -> Result<Vec<(IpAddr, TunnelEndpoint)>, DatapathError> {
        let entries = self.0.lock().node_remotes.entries()?;
        Ok(entries
            .iter()
            .map(|(k, v)| (k.to_ip(), TunnelEndpoint(v.tunnel_ip())))
            .collect())
    }

    fn insert(&mut self, key: &IpAddr, value: &TunnelEndpoint) -> Result<(), DatapathError> {
        self.0
            .lock()
            .node_remotes
            .insert(&Addr128::from(*key), &Remote::new(value.0))
    }

    fn remove(&mut self, key: &IpAddr) -> Result<bool, DatapathError> {
        self.0.lock().node_remotes.remove(&Addr128::from(*key))
    }
}

/// `cp_peer_routes`: `{network, peer CIDR}` → the peer's network.
pub struct PeerRoutesMap<'a>(&'a SharedDatapath);

impl KernelMap<(u32, ipnet::IpNet), u32> for PeerRoutesMap<'_> {
    type Error = DatapathError;

    fn iter(&self) -> Result<Vec<((u32, ipnet::IpNet), u32)>, DatapathError> {
        let entries = self.0.lock().peer_routes.entries()?;
        Ok(entries
            .iter()
            .filter_map(|(k, v)| {
                let r = lpm_to_remote_key(k)?;
                let net = ipnet::IpNet::new(r.addr, r.prefix_len).ok()?;
                Some(((r.net, net), *v))
            })
            .collect())
    }

    fn insert(&mut self, key: &(u32, ipnet::IpNet), value: &u32) -> Result<(), DatapathError> {
        let k = peer_key(key)?;
        self.0.lock().peer_routes.insert(&k, value)
    }

    fn remove(&mut self, key: &(u32, ipnet::IpNet)) -> Result<bool, DatapathError> {
        let k = peer_key(key)?;
        self.0.lock().peer_routes.remove(&k)
    }
}

fn peer_key((net, cidr): &(u32, ipnet::IpNet)) -> Result<LpmKey, DatapathError> {
    remote_key_to_lpm(&RemoteKey {
        net: *net,
        addr: cidr.network(),
        prefix_len: cidr.prefix_len(),
    })
}

/// `cp_vnis`: the VNIs `from_overlay` accepts, and their networks.
pub struct VnisMap<'a>(&'a SharedDatapath);

impl KernelMap<u32, u32> for VnisMap<'_> {
    type Error = DatapathError;

    fn iter(&self) -> Result<Vec<(u32, u32)>, DatapathError> {
        self.0.lock().vnis.entries()
    }

    fn insert(&mut self, key: &u32, value: &u32) -> Result<(), DatapathError> {
        self.0.lock().vnis.insert(key, value)
    }

    fn remove(&mut self, key: &u32) -> Result<bool, DatapathError> {
        self.0.lock().vnis.remove(key)
    }
}

/// `VtepOwner` ↔ `cp_vteps` flags.
fn vtep_flags(owner: VtepOwner) -> u32 {
    match owner {
        VtepOwner::Topology => VTEP_F_NODE,
        VtepOwner::Other(flags) => flags,
    }
}

fn vtep_owner(flags: u32) -> VtepOwner {
    if flags == VTEP_F_NODE {
        VtepOwner::Topology
    } else {
        VtepOwner::Other(flags)
    }
}

/// `cp_vteps`: the tunnel endpoints `from_overlay` accepts packets from.
pub struct VtepsMap<'a>(&'a SharedDatapath);

impl KernelMap<TunnelEndpoint, VtepOwner> for VtepsMap<'_> {
    type Error = DatapathError;

    fn iter(&self) -> Result<Vec<(TunnelEndpoint, VtepOwner)>, DatapathError> {
        let entries = self.0.lock().vteps.entries()?;
        Ok(entries
            .iter()
            .map(|(k, v)| (TunnelEndpoint((*k).into()), vtep_owner(*v)))
            .collect())
    }

    fn insert(&mut self, key: &TunnelEndpoint, value: &VtepOwner) -> Result<(), DatapathError> {
        self.0
            .lock()
            .vteps
            .insert(&vtep_key(key.0), &vtep_flags(*value))
    }

    fn remove(&mut self, key: &TunnelEndpoint) -> Result<bool, DatapathError> {
        self.0.lock().vteps.remove(&vtep_key(key.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vtep_owners_survive_the_flags_encoding() {
        for owner in [
            VtepOwner::Topology,
            VtepOwner::Other(0x2),
            VtepOwner::Other(0),
        ] {
            assert_eq!(vtep_owner(vtep_flags(owner)), owner);
        }
        assert_eq!(vtep_flags(VtepOwner::Topology), VTEP_F_NODE);
        // another writer's entry that also carries the node bit is not ours
        assert_eq!(
            vtep_owner(VTEP_F_NODE | 0x2),
            VtepOwner::Other(VTEP_F_NODE | 0x2)
        );
    }

    #[test]
    fn remote_keys_survive_the_lpm_encoding() {
        for k in [
            RemoteKey::host(0, "10.244.1.7".parse().unwrap()),
            RemoteKey::host(3, "fd00::7".parse().unwrap()),
            RemoteKey {
                net: 0,
                addr: "10.244.0.0".parse().unwrap(),
                prefix_len: 16,
            },
        ] {
            let lpm = remote_key_to_lpm(&k).unwrap();
            assert_eq!(lpm_to_remote_key(&lpm), Some(k));
        }
        let too_long = RemoteKey {
            net: 0,
            addr: "10.0.0.1".parse().unwrap(),
            prefix_len: 33,
        };
        assert!(remote_key_to_lpm(&too_long).is_err());
    }
}

//! The kernel-facing steps of an attachment, as traits so the state machine
//! can be tested with implementations that fail at any step. The agent
//! implements them over the datapath crate (netlink plumbing, pinned maps,
//! tcx links).

use std::net::IpAddr;

use async_trait::async_trait;

/// A step failed. Implementations render their own error into text: the
/// handler only needs to report it and roll back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StepError(pub String);

impl StepError {
    /// An error from anything displayable.
    pub fn new(e: impl std::fmt::Display) -> Self {
        StepError(e.to_string())
    }
}

/// What to plumb for one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlumbSpec {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// The pod's addresses (at most one per family).
    pub addresses: Vec<IpAddr>,
}

/// An attachment's plumbing as read back from the kernel (the host veth and
/// its rebuild record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plumbed {
    /// `CNI_CONTAINERID` of the attachment.
    pub container_id: String,
    /// `CNI_IFNAME` of the attachment.
    pub ifname: String,
    /// Host-side veth name.
    pub host_ifname: String,
    /// Host-side veth ifindex.
    pub host_ifindex: u32,
    /// The pod interface's MAC.
    pub pod_mac: [u8; 6],
    /// The pod's addresses.
    pub addresses: Vec<IpAddr>,
}

/// Veth pair, addresses and routes. Every method is idempotent where the
/// CNI needs it: `unplumb` of nothing succeeds.
#[async_trait]
pub trait Plumber: Send + Sync {
    /// Creates the veth pair and configures both ends; all or nothing.
    async fn plumb(&self, spec: &PlumbSpec) -> Result<Plumbed, StepError>;
    /// Removes the attachment's veth; `false` if there was none.
    async fn unplumb(&self, container_id: &str, ifname: &str) -> Result<bool, StepError>;
    /// The attachment's plumbing, if it exists.
    async fn inspect(&self, container_id: &str, ifname: &str)
        -> Result<Option<Plumbed>, StepError>;
    /// Every attachment plumbed on this node (for GC).
    async fn list(&self) -> Result<Vec<Plumbed>, StepError>;
}

/// The per-pod datapath state: `ports` (ifindex → net), `locals`
/// ({net, address} → veth) and the tcx programs on the host veth.
/// Removals are idempotent.
#[async_trait]
pub trait DatapathWriter: Send + Sync {
    /// `ports[ifindex] = net`.
    async fn put_port(&self, ifindex: u32, net: u32) -> Result<(), StepError>;
    /// Removes `ports[ifindex]`.
    async fn delete_port(&self, ifindex: u32) -> Result<(), StepError>;
    /// `locals[{net, addr}] = {ifindex, mac}`.
    async fn put_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Result<(), StepError>;
    /// Removes `locals[{net, addr}]`; with `Some(ifindex)` only if the entry
    /// still points at that veth (never another pod's newer entry).
    async fn delete_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: Option<u32>,
    ) -> Result<(), StepError>;
    /// Attaches `from_pod` / `to_pod` to the host veth.
    async fn attach(&self, host_ifname: &str, ifindex: u32) -> Result<(), StepError>;
    /// Detaches them (and unpins their links).
    async fn detach(&self, host_ifname: &str) -> Result<(), StepError>;
    /// CHECK: are the entries and programs of this endpoint in place?
    async fn check(&self, ep: &crate::desired::LocalEndpoint) -> Result<(), StepError>;
}

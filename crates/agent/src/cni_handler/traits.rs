//! The kernel-facing steps of an attachment, as traits so the state machine
//! can be tested with implementations that fail at any step. The agent
//! implements them over the datapath crate (netlink plumbing, pinned maps,
//! tcx links).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use async_trait::async_trait;
use cozyplane_datapath::{netlink, DatapathError};
use cozyplane_errors::Chain;

use crate::ipam::IpamError;

/// A step failed. The kernel's error is kept as it is (errno included), so
/// the handler can report it and roll back, and the text is made only where
/// the error leaves the agent (the CNI result, a log line).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A map operation or a tcx link failed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// Netlink, a namespace or a sysctl failed.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// Releasing (undo) or verifying (CHECK) the address claims failed.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// A file operation failed (e.g. listing the link pins).
    #[error("{op} {}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel's state is not what the step needs or expects (a foreign
    /// veth in the way, an entry CHECK finds missing).
    #[error("{0}")]
    Mismatch(String),
    /// The step was asked for something it cannot do (two addresses of one
    /// family).
    #[error("{0}")]
    Invalid(String),
}

/// One failure of a path that goes on past its failures (undo, teardown, GC,
/// rebuild): what was being done, and the error, kept typed.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct Failure {
    /// What was being done, e.g. `detach cph0123abcd`.
    pub what: String,
    /// Why it failed.
    #[source]
    pub error: StepError,
}

impl Failure {
    /// A failure of `what`.
    pub fn new(what: impl Into<String>, error: impl Into<StepError>) -> Self {
        Self {
            what: what.into(),
            error: error.into(),
        }
    }
}

/// The failures of one such path, in order. Displayed as
/// `what: cause: …; what: cause: …`, each failure with its whole chain (a
/// list has no single `source()`).
#[derive(Debug, Default)]
pub struct Failures(pub Vec<Failure>);

impl Failures {
    /// No failure?
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds one.
    pub fn push(&mut self, f: Failure) {
        self.0.push(f);
    }

    /// Adds `other`'s failures, each prefixed with `context` (flattened: a
    /// GC of several attachments lists every step that failed, by attachment).
    pub fn extend_in(&mut self, context: &str, other: Failures) {
        self.0.extend(other.0.into_iter().map(|mut f| {
            f.what = format!("{context}: {}", f.what);
            f
        }));
    }
}

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}", Chain(failure))?;
        }
        Ok(())
    }
}

/// The veth pair of one attachment, made before its addresses are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairSpec {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// MTU of both veth ends.
    pub mtu: u32,
}

/// What to plumb for one attachment (its pair's [`PairSpec`] and more).
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
    /// The addresses inside the pod (at most one per family): a VPC pod's
    /// are in its VPC.
    pub addresses: Vec<IpAddr>,
    /// The pod's network: 0, or its VPC's VNI.
    pub net: u32,
    /// The pod's net-0 addresses, which the host routes to the veth (the
    /// same as `addresses` on net 0).
    pub fabric: Vec<IpAddr>,
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
    /// The addresses inside the pod.
    pub addresses: Vec<IpAddr>,
    /// The pod's network (0 when unknown: a veth without a record).
    pub net: u32,
    /// The pod's net-0 addresses (on net 0 the same as `addresses`).
    pub fabric: Vec<IpAddr>,
    /// Severed from its VPC (see [`crate::runtime::sever`]).
    pub severed: bool,
    /// A VPC pod's network namespace cookie, read at plumb and recorded:
    /// the key of its `cp_netns` entry. `None` on net 0, and for a VPC pod
    /// plumbed by an agent that did not record it.
    pub netns_cookie: Option<u64>,
}

impl Plumbed {
    /// The datapath endpoint this plumbing carries.
    pub fn endpoint(&self) -> crate::desired::LocalEndpoint {
        crate::desired::LocalEndpoint {
            net: self.net,
            host_ifname: self.host_ifname.clone(),
            host_ifindex: self.host_ifindex,
            pod_mac: self.pod_mac,
            addresses: self.addresses.clone(),
            fabric: if self.net == crate::desired::NET_DEFAULT {
                Vec::new()
            } else {
                self.fabric.clone()
            },
            severed: self.severed,
        }
    }
}

/// Veth pair, addresses and routes. Every method is idempotent where the
/// CNI needs it: `unplumb` of nothing succeeds.
#[async_trait]
pub trait Plumber: Send + Sync {
    /// A veth pair [`Plumber::prepare`] made.
    type Pair: Send + Sync;
    /// Creates the attachment's veth pair before its addresses are known
    /// (an ADD runs this while its address claims are in flight): the pair
    /// carries nothing and has no record yet, so a killed agent's restart
    /// deletes it, and a retried ADD finds it by name. All or nothing.
    async fn prepare(&self, spec: &PairSpec) -> Result<Self::Pair, StepError>;
    /// Configures a prepared pair: the record, addresses, routes. On
    /// failure the pair is deleted.
    async fn plumb(&self, spec: &PlumbSpec, pair: Self::Pair) -> Result<Plumbed, StepError>;
    /// Removes the attachment's veth; `false` if there was none.
    async fn unplumb(&self, container_id: &str, ifname: &str) -> Result<bool, StepError>;
    /// The attachment's plumbing, if it exists.
    async fn inspect(&self, container_id: &str, ifname: &str)
        -> Result<Option<Plumbed>, StepError>;
    /// Every attachment plumbed on this node (for GC).
    async fn list(&self) -> Result<Vec<Plumbed>, StepError>;
    /// Deletes pod veths that carry no record at all (a plumb killed between
    /// creating the pair and writing its alias): no runtime can name them in
    /// a valid list. Only for GC, which no ADD runs beside. Returns how many.
    async fn remove_unrecorded(&self) -> Result<usize, StepError> {
        Ok(0)
    }
    /// Dual-address bridge, kernel half: routes the VPC pod's `fabric`
    /// address into its host veth `host_ifindex` with a permanent neighbour
    /// `pod_mac`, so the node's own stack reaches it (the datapath half is
    /// [`DatapathWriter::put_bridge`]). Idempotent; deleting the veth
    /// removes it.
    async fn plumb_bridge(
        &self,
        host_ifindex: u32,
        fabric: IpAddr,
        pod_mac: [u8; 6],
    ) -> Result<(), StepError>;
    /// Undoes [`Plumber::plumb_bridge`] while the pod lives on (revocation);
    /// idempotent.
    async fn unplumb_bridge(&self, host_ifindex: u32, fabric: IpAddr) -> Result<(), StepError>;
}

/// The per-pod datapath state: `ports` (ifindex → net), `locals`
/// ({net, address} → veth) and the programs on the host veth.
/// Removals are idempotent.
#[async_trait]
pub trait DatapathWriter: Send + Sync {
    /// `ports[ifindex] = net`.
    async fn put_port(&self, ifindex: u32, net: u32) -> Result<(), StepError>;
    /// Removes `ports[ifindex]`.
    async fn delete_port(&self, ifindex: u32) -> Result<(), StepError>;
    /// Severs the pod behind `ifindex` (revocation): sets the port's
    /// quarantine flag, so it sends and receives nothing while it keeps
    /// running; only a new attach (`put_port`) writes a port without it.
    /// Idempotent; a veth without a port entry is already cut off.
    async fn quarantine_port(&self, ifindex: u32) -> Result<(), StepError>;
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
    /// `netns[cookie] = {net, ifindex}`: the socket-LB programs look the
    /// frontends of the sockets of network namespace `cookie` (a VPC pod's,
    /// behind host veth `ifindex`) up under `net`, never net 0's
    /// (docs/services.md). `net` must be a VPC's (not 0).
    async fn put_netns(&self, cookie: u64, net: u32, ifindex: u32) -> Result<(), StepError>;
    /// Removes `netns[cookie]`; with `Some(ifindex)` only if the entry still
    /// belongs to that veth.
    async fn delete_netns(&self, cookie: u64, ifindex: Option<u32>) -> Result<(), StepError>;
    /// Dual-address bridge: `bridges[{0, fabric}] = {net, ifindex, vpc}`, so
    /// what the node sends to the VPC pod's `fabric` address reaches it at
    /// `vpc` (docs/datapath.md, "Dual-address bridge"). Needs the route of
    /// [`Plumber::plumb_bridge`]. One call per family (the pod's IPv4
    /// fabric address to its IPv4 VPC address, likewise IPv6); `net` is the
    /// VPC's (not 0).
    async fn put_bridge(
        &self,
        fabric: IpAddr,
        net: u32,
        vpc: IpAddr,
        ifindex: u32,
    ) -> Result<(), StepError>;
    /// Removes `bridges[{0, fabric}]` and its flows; with `Some(ifindex)`
    /// only if the entry still points at that veth.
    async fn delete_bridge(&self, fabric: IpAddr, ifindex: Option<u32>) -> Result<(), StepError>;
    /// Attaches `from_pod` / `to_pod` to the host veth (or replaces the
    /// programs already attached).
    async fn attach(&self, host_ifname: &str, ifindex: u32) -> Result<(), StepError>;
    /// Releases what the attachment holds outside the veth, before the
    /// veth goes (the programs themselves may stay on it until then, the
    /// port entry being gone: fail closed); idempotent.
    async fn detach(&self, host_ifname: &str, ifindex: u32) -> Result<(), StepError>;
    /// CHECK: are the entries and programs of this endpoint in place?
    async fn check(&self, ep: &crate::desired::LocalEndpoint) -> Result<(), StepError>;
}

/// The claims a CNI ADD made or reused, for [`PolicyGate::wait`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BarrierClaims {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name and UID (the watch must hold it: a local pod's
    /// NetworkPolicy identity comes from its live labels).
    pub pod: (String, String),
    /// A VPC pod's VPC's namespace (where its SecurityGroups live).
    pub vpc_namespace: Option<String>,
    /// FabricIP claims: (name, UID).
    pub fabric_ips: Vec<(String, String)>,
    /// Port claims: (name, UID).
    pub ports: Vec<(String, String)>,
}

/// Holds an ADD back until the node's datapath holds the new pod's policy
/// state (the agent's implementation: `runtime::barrier`).
#[async_trait]
pub trait PolicyGate: Send + Sync {
    /// Waits until the policy state of the pod that made `claims` is in the
    /// datapath. `Ok(false)`: no policy can apply to it, nothing waited for;
    /// `Err`: it did not get there (the ADD fails closed).
    async fn wait(&self, claims: &BarrierClaims) -> Result<bool, String>;
}

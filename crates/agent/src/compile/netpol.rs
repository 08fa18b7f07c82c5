//! NetworkPolicy (`networking.k8s.io/v1`) compiled into the maps of
//! `bpf/netpol.h` for one node: a pure function of the policies, the pods
//! and the namespaces (`docs/policy.md`).
//!
//! * **Identities.** Pods with the same namespace, labels and named
//!   container ports share an identity, so a rule is written once for all
//!   replicas. Named ports are part of it because a named port resolves per
//!   destination pod: an egress rule's `http` may be 8080 on one peer and
//!   80 on another. An id is the FNV-1a hash of the identity, probed to the
//!   next free id on a collision in sorted order, so every agent derives
//!   the same ids and a restart rewrites nothing.
//! * **Endpoints** (`cp_np_eps`): every address of every pod the API server
//!   knows (not hostNetwork pods, not finished ones), with its identity;
//!   this node's pods also carry their isolation per direction.
//! * **Rules** (`cp_np_rules`): only for the identities with a pod on this
//!   node: a node judges its own pods only (ingress at the gate, egress at
//!   the source). A rule peer is an identity, any peer (a rule without
//!   `from`/`to`), or a CIDR class; ports are prefixes of the port space
//!   (`endPort` ranges included), a protocol's every port, or every
//!   protocol (a rule without `ports`).
//! * **CIDR classes** (`cp_np_cidrs`): per subject and direction, every
//!   ipBlock boundary (each `cidr` and each `except`) becomes a class whose
//!   ports are those of the rules whose block contains it and does not
//!   except it; the datapath's longest-prefix match then decides alone. A
//!   named port in an egress rule towards a block resolves per destination
//!   pod: each pod address in the block with that name becomes a host
//!   boundary of its own, holding the resolved port.
//!
//! Semantics as the API reference defines them: a pod is isolated for a
//! direction when a policy with that policy type selects it; `policyTypes`
//! defaults to Ingress, plus Egress when the policy has egress rules;
//! policies add up; a peer with a `podSelector` alone means pods of the
//! policy's namespace, with a `namespaceSelector` alone every pod of the
//! selected namespaces, with both the selected pods of the selected
//! namespaces. What the datapath cannot express is reported
//! ([`NpDiagnostic`]) and fails closed: a policy whose own `podSelector`
//! cannot be evaluated isolates its whole namespace and admits nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};
use cozyplane_api::labels::{
    ANNOTATION_POD_LABELS, ANNOTATION_POD_PORTS, LABEL_FABRIC_POD_UID, LABEL_POLICY_ENTITY,
};
use cozyplane_api::selector::selector_matches;
use cozyplane_api::{FabricIP, HostFirewall};
use cozyplane_datapath::abi::{
    np_cidr_key, np_ep_key, np_host_key, NpEp, NpMatch, NpRule, PortPrefixes, NP_EGRESS,
    NP_F_DENY_IN, NP_F_DENY_OUT, NP_F_ISOLATED_IN, NP_F_ISOLATED_OUT, NP_HOST_ID, NP_INGRESS,
    NP_PEER_ANY, NP_PEER_CIDR,
};
use cozyplane_datapath::netpol::{NpDesired, Prefixed};
use cozyplane_datapath::sorted::SortedMap;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A hash map with a fast, non-cryptographic hasher: the compile's maps are
/// keyed by what the API server holds and rebuilt every pass, and SipHash
/// over label sets was a tenth of a pass.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

/// Something in a policy the compile could not use as written; each is
/// enforced fail closed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum NpDiagnostic {
    /// A selector that cannot be evaluated (`what` names it).
    #[error("NetworkPolicy {policy}: {what} cannot be evaluated ({error}); it selects nothing, and a policy's own podSelector isolates its namespace")]
    BadSelector {
        /// `namespace/name`.
        policy: String,
        /// Which selector.
        what: &'static str,
        /// Why.
        error: String,
    },
    /// An ipBlock whose `cidr` or an `except` is no CIDR.
    #[error("NetworkPolicy {policy}: ipBlock {cidr:?} is not a CIDR; the peer matches nothing")]
    BadCidr {
        /// `namespace/name`.
        policy: String,
        /// The text.
        cidr: String,
    },
    /// A namespaceSelector with `policy.cozyplane.io/entity` that is not an
    /// entity peer: an unknown value, or other terms beside it.
    #[error("NetworkPolicy {policy}: entity peer {entity:?} is not one of nodes, local-pods, local-node alone (no other labels, expressions or podSelector); it matches nothing")]
    BadEntity {
        /// `namespace/name`.
        policy: String,
        /// The label's value.
        entity: String,
    },
    /// `nodes` or `local-node` in an egress rule: node entities are
    /// ingress peers (the node's own traffic is the host firewall's).
    #[error("NetworkPolicy {policy}: entity {entity:?} is an ingress peer only; in an egress rule it matches nothing")]
    EntityInEgress {
        /// `namespace/name`.
        policy: String,
        /// The entity.
        entity: String,
    },
    /// A port this datapath cannot match (an unknown protocol, a port out
    /// of range, an `endPort` below `port` or on a named port).
    #[error("NetworkPolicy {policy}: port {port} cannot be matched; it matches nothing")]
    BadPort {
        /// `namespace/name`.
        policy: String,
        /// The port as written.
        port: String,
    },
    /// Part of a Cilium policy outside the subset cozyplane enforces
    /// (`docs/policy.md`), and what became of it.
    #[error("{policy}: {field} is outside the enforced Cilium subset; {effect}")]
    CiliumOutside {
        /// `CiliumNetworkPolicy namespace/name` or
        /// `CiliumClusterwideNetworkPolicy name`.
        policy: String,
        /// Where, as a field path (`specs[1].egress[0].toFQDNs`).
        field: String,
        /// What the compile did instead (always fail closed, except host
        /// policies, which are not enforced yet).
        effect: &'static str,
    },
}

impl NpDiagnostic {
    /// The object the diagnostic is about: (apiVersion, kind, namespace —
    /// empty for a cluster-scoped one —, name).
    pub fn object(&self) -> (&'static str, &'static str, String, String) {
        let policy = match self {
            NpDiagnostic::BadSelector { policy, .. }
            | NpDiagnostic::BadCidr { policy, .. }
            | NpDiagnostic::BadEntity { policy, .. }
            | NpDiagnostic::EntityInEgress { policy, .. }
            | NpDiagnostic::BadPort { policy, .. }
            | NpDiagnostic::CiliumOutside { policy, .. } => policy.as_str(),
        };
        let split = |s: &str| match s.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), s.to_string()),
        };
        if let Some(rest) = policy.strip_prefix("CiliumNetworkPolicy ") {
            let (ns, name) = split(rest);
            ("cilium.io/v2", "CiliumNetworkPolicy", ns, name)
        } else if let Some(rest) = policy.strip_prefix("CiliumClusterwideNetworkPolicy ") {
            (
                "cilium.io/v2",
                "CiliumClusterwideNetworkPolicy",
                String::new(),
                rest.to_string(),
            )
        } else if let Some(rest) = policy.strip_prefix("HostFirewall ") {
            (
                "sdn.cozystack.io/v1alpha1",
                "HostFirewall",
                String::new(),
                rest.to_string(),
            )
        } else {
            let (ns, name) = split(policy);
            ("networking.k8s.io/v1", "NetworkPolicy", ns, name)
        }
    }
}

/// The addresses the entity peers name (`policy.cozyplane.io/entity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NpHosts {
    /// Every node's addresses (`nodes`).
    pub nodes: Vec<IpAddr>,
    /// This node's addresses (`local-node`).
    pub local_node: Vec<IpAddr>,
    /// The pod network's CIDRs (Cilium's `cluster` and `world` entities).
    pub cluster_cidrs: Vec<IpNet>,
    /// The API server's addresses (Cilium's `kube-apiserver` entity; the
    /// host firewall always admits them).
    pub apiserver: Vec<IpAddr>,
    /// This node's labels (host policies' `nodeSelector`).
    pub node_labels: BTreeMap<String, String>,
}

/// Every policy kind one compile reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyInput<'a> {
    /// `networking.k8s.io/v1` NetworkPolicies.
    pub network_policies: &'a [NetworkPolicy],
    /// `cilium.io/v2` CiliumNetworkPolicies.
    pub cilium: &'a [CiliumNetworkPolicy],
    /// `cilium.io/v2` CiliumClusterwideNetworkPolicies.
    pub cilium_clusterwide: &'a [CiliumClusterwideNetworkPolicy],
    /// `sdn.cozystack.io` HostFirewalls.
    pub host_firewalls: &'a [HostFirewall],
}

/// What one compile produced.
#[derive(Debug, Clone, Default)]
pub struct CompiledNetworkPolicies {
    /// What the maps should hold.
    pub desired: NpDesired,
    /// What was skipped or narrowed (fail closed).
    pub diagnostics: Vec<NpDiagnostic>,
    /// Distinct identities.
    pub identities: usize,
}

/// A named container port.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct NamedPort {
    /// The port's name.
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The container port.
    pub port: u16,
}

impl NamedPort {
    fn proto(&self) -> Option<u8> {
        proto_of(Some(&self.protocol))
    }
}

/// What makes pods one identity (borrowed from the members: a pass
/// copies no label set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct IdentityKey<'a> {
    namespace: &'a str,
    labels: &'a BTreeMap<String, String>,
    ports: &'a BTreeSet<NamedPort>,
}

/// One pod address as NetworkPolicy knows it: the claim's (FabricIP's)
/// snapshot of its pod, or this node's live pod ([`MemberCache`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpMember {
    /// The pod's namespace.
    pub namespace: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its named container ports.
    pub ports: BTreeSet<NamedPort>,
    /// The address.
    pub ip: IpAddr,
    /// The pod runs on this node (a subject).
    pub local: bool,
}

/// The protocol number of a NetworkPolicy protocol name (default TCP).
fn proto_of(name: Option<&str>) -> Option<u8> {
    match name.unwrap_or("TCP") {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

/// The named container ports of `pod` (init containers too: a sidecar's).
pub fn named_ports(pod: &Pod) -> BTreeSet<NamedPort> {
    let Some(spec) = &pod.spec else {
        return BTreeSet::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.clone()?,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                port: u16::try_from(p.container_port).ok()?,
            })
        })
        .collect()
}

/// The value of [`ANNOTATION_POD_PORTS`] for `ports` (sorted JSON).
pub fn ports_snapshot(ports: &BTreeSet<NamedPort>) -> String {
    serde_json::to_string(ports).unwrap_or_else(|_| String::from("[]"))
}

/// The pod's addresses, if it takes part (not hostNetwork, not finished).
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Vec::new();
    }
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Vec::new();
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .pod_ip
                .as_deref()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// The members of `pods` as they are (tests and benchmarks; the agent uses
/// [`MemberCache`], which cannot see other nodes' pods).
pub fn members_of_pods(pods: &[Pod], node: &str) -> Vec<NpMember> {
    pods.iter()
        .flat_map(|pod| {
            let local = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            let ports = named_ports(pod);
            pod_ips(pod).into_iter().map(move |ip| NpMember {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                labels: pod.metadata.labels.clone().unwrap_or_default(),
                ports: ports.clone(),
                ip,
                local,
            })
        })
        .collect()
}

/// What makes pods one identity, owned (the cache's interned copy).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Identity {
    namespace: String,
    labels: BTreeMap<String, String>,
    ports: BTreeSet<NamedPort>,
    /// Its [`identity_hash`], made once (last: equal identities have
    /// equal hashes, so it never decides the order).
    hash: u64,
}

impl Identity {
    fn key(&self) -> IdentityKey<'_> {
        IdentityKey {
            namespace: &self.namespace,
            labels: &self.labels,
            ports: &self.ports,
        }
    }
}

/// One address claim as the cache last read it.
#[derive(Debug)]
struct Claim {
    /// The claim's `resourceVersion` (and, for this node's pods, the live
    /// pod's): unchanged versions mean an unchanged member.
    version: (Option<String>, Option<String>),
    /// `Some` for this node's claims: its pod's uid, if it names one.
    local: Option<Option<String>>,
    /// Its member: the identity and the address, if it is one.
    member: Option<(Arc<Identity>, IpAddr, bool)>,
    /// The last pass that saw the claim.
    pass: u64,
}

/// The addresses of one identity.
#[derive(Debug, Default)]
struct Group {
    ips: Vec<IpAddr>,
    /// How many of them are this node's pods.
    local: usize,
}

/// The members the agent knows: every net-0 address claim (FabricIP), by
/// its pod snapshot (`sdn.cozystack.io/pod-labels`, `pod-ports`), except
/// that this node's pods are taken live (the snapshots of other nodes'
/// pods are written by their own agents; node restriction keeps an agent
/// from reading other nodes' pods). A claim without a snapshot yet names
/// no identity: its address can match ipBlocks only, never a selector
/// (fail closed).
///
/// They are kept across passes and
/// grouped into identities as they change: a pass reads each claim's
/// versions and re-reads only the claims (and this node's pods) that
/// changed, so an unchanged cluster costs one lookup per claim and no
/// parse, no label-set hashing, no grouping.
#[derive(Debug, Default)]
pub struct MemberCache {
    /// Claim name → what it was at its last versions.
    claims: FastMap<String, Claim>,
    /// Identity → its addresses, in identity order (the compile's).
    groups: BTreeMap<Arc<Identity>, Group>,
    /// Pass counter (claims not seen in the current pass are gone).
    pass: u64,
    /// The shared objects the last [`MemberCache::update_shared`] read.
    last: Option<LastInput>,
    /// The node the claims were read for.
    node: String,
}

/// Do `a` and `b` hold the very same objects, in the same order?
fn same_objects<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

/// The input of the last shared update, held.
#[derive(Debug)]
struct LastInput {
    node: String,
    fabric_ips: Vec<Arc<FabricIP>>,
    pods: Vec<Arc<Pod>>,
}

impl MemberCache {
    /// [`MemberCache::update`] of the objects as a reflector's store shares
    /// them: when the lists hold the very objects of the last call (a
    /// store replaces an object it updates, never changes it), nothing
    /// changed and nothing is read.
    pub fn update_shared(
        &mut self,
        fabric_ips: &[Arc<FabricIP>],
        local_pods: &[Arc<Pod>],
        node: &str,
    ) {
        if let Some(last) = &self.last {
            if last.node == node
                && same_objects(&last.fabric_ips, fabric_ips)
                && same_objects(&last.pods, local_pods)
            {
                return;
            }
        }
        self.read(
            fabric_ips.iter().map(|f| &**f),
            local_pods.iter().map(|p| &**p),
            node,
        );
        // held, so that they cannot change while they are the reference
        self.last = Some(LastInput {
            node: node.to_string(),
            fabric_ips: fabric_ips.to_vec(),
            pods: local_pods.to_vec(),
        });
    }

    /// Reads `fabric_ips` and this node's `local_pods`, re-reading what
    /// changed since the last call and forgetting claims that are gone.
    pub fn update(&mut self, fabric_ips: &[FabricIP], local_pods: &[Pod], node: &str) {
        self.read(fabric_ips.iter(), local_pods.iter(), node);
        self.last = None;
    }

    fn read<'f, 'p>(
        &mut self,
        fabric_ips: impl Iterator<Item = &'f FabricIP>,
        local_pods: impl Iterator<Item = &'p Pod>,
        node: &str,
    ) {
        // which claims are this node's was read with the node: another
        // node's view starts over
        if self.node != node {
            self.claims.clear();
            self.groups.clear();
            self.node = node.to_string();
        }
        self.pass = self.pass.wrapping_add(1);
        let pass = self.pass;
        let live: FastMap<&str, &Pod> = local_pods
            .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
            .collect();
        let mut seen = 0usize;
        for f in fabric_ips {
            if f.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(name) = f.metadata.name.as_deref() else {
                continue;
            };
            let rv = f.metadata.resource_version.as_deref();
            if let Some(c) = self.claims.get_mut(name) {
                if c.pass == pass {
                    continue; // a duplicate name: the first one stands
                }
                // the claim as it was (a known, unchanged version): only
                // this node's live pod can have changed, and it is fresh
                // when its version is known and unchanged too
                let fresh = rv.is_some()
                    && c.version.0.as_deref() == rv
                    && match &c.local {
                        None => true,
                        Some(uid) => {
                            let pod_rv = uid
                                .as_deref()
                                .and_then(|u| live.get(u))
                                .and_then(|p| p.metadata.resource_version.as_deref());
                            pod_rv.is_some() && pod_rv == c.version.1.as_deref()
                        }
                    };
                if fresh {
                    c.pass = pass;
                    seen += 1;
                    continue;
                }
            }
            // this node's pod is read live; a claim whose pod is not (yet)
            // seen is no member
            let local = (f.spec.node.as_deref() == Some(node)).then(|| {
                f.spec.pod_uid.as_deref().or_else(|| {
                    f.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_FABRIC_POD_UID))
                        .map(String::as_str)
                })
            });
            let pod = local.map(|uid| uid.and_then(|u| live.get(u).copied()));
            let version = (
                rv,
                pod.flatten()
                    .and_then(|p| p.metadata.resource_version.as_deref()),
            );
            let version = (version.0.map(str::to_string), version.1.map(str::to_string));
            let member = read_member(f, pod).map(|(mut identity, ip, local)| {
                identity.hash = identity_hash(&identity.key());
                let identity = match self.groups.get_key_value(&identity) {
                    Some((k, _)) => Arc::clone(k),
                    None => Arc::new(identity),
                };
                (identity, ip, local)
            });
            if let Some(old) = self.claims.remove(name) {
                self.unlink(old.member);
            }
            if let Some((identity, ip, local)) = &member {
                let g = self.groups.entry(Arc::clone(identity)).or_default();
                g.ips.push(*ip);
                g.local += usize::from(*local);
            }
            self.claims.insert(
                name.to_string(),
                Claim {
                    version,
                    local: local.map(|uid| uid.map(str::to_string)),
                    member,
                    pass,
                },
            );
            seen += 1;
        }
        if seen != self.claims.len() {
            let gone: Vec<String> = self
                .claims
                .iter()
                .filter(|(_, c)| c.pass != pass)
                .map(|(k, _)| k.clone())
                .collect();
            for k in gone {
                if let Some(c) = self.claims.remove(&k) {
                    self.unlink(c.member);
                }
            }
        }
    }

    /// Takes a claim's member out of its group.
    fn unlink(&mut self, member: Option<(Arc<Identity>, IpAddr, bool)>) {
        let Some((identity, ip, local)) = member else {
            return;
        };
        let Some(g) = self.groups.get_mut(&identity) else {
            return;
        };
        if let Some(i) = g.ips.iter().position(|a| *a == ip) {
            g.ips.swap_remove(i);
        }
        g.local = g.local.saturating_sub(usize::from(local));
        if g.ips.is_empty() {
            self.groups.remove(&identity);
        }
    }

    /// The members grouped into identities, as the compile reads them.
    pub fn groups(&self) -> NpGroups<'_> {
        let mut groups = NpGroups::default();
        for (k, g) in &self.groups {
            groups.keys.push(k.key());
            groups.hashes.push(k.hash);
            groups.info.push((g.ips.clone(), g.local > 0));
        }
        groups
    }

    /// The members one by one (tests).
    pub fn members(&self) -> Vec<NpMember> {
        let mut v: Vec<NpMember> = self
            .claims
            .values()
            .filter_map(|c| c.member.as_ref())
            .map(|(identity, ip, local)| NpMember {
                namespace: identity.namespace.clone(),
                labels: identity.labels.clone(),
                ports: identity.ports.clone(),
                ip: *ip,
                local: *local,
            })
            .collect();
        v.sort_by_key(|m| (m.ip, m.local));
        v
    }
}

/// The member a claim names: `pod` is `Some` for this node's claims (the
/// live pod, if seen), whose identity is read from the pod; other nodes'
/// come from the claim's snapshot, if it carries one.
fn read_member(f: &FabricIP, pod: Option<Option<&Pod>>) -> Option<(Identity, IpAddr, bool)> {
    let ip = f.spec.address.parse::<IpAddr>().ok()?;
    let namespace = f.spec.pod_namespace.clone()?;
    match pod {
        Some(pod) => {
            let pod = pod?;
            Some((
                Identity {
                    namespace,
                    labels: pod.metadata.labels.clone().unwrap_or_default(),
                    ports: named_ports(pod),
                    hash: 0,
                },
                ip,
                true,
            ))
        }
        None => {
            let notes = f.metadata.annotations.as_ref();
            let labels = notes
                .and_then(|a| a.get(ANNOTATION_POD_LABELS))
                .and_then(|s| serde_json::from_str(s).ok())?;
            let ports = notes
                .and_then(|a| a.get(ANNOTATION_POD_PORTS))
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            Some((
                Identity {
                    namespace,
                    labels,
                    ports,
                    hash: 0,
                },
                ip,
                false,
            ))
        }
    }
}

/// Members grouped into identities, in identity order: what a compile
/// reads ([`MemberCache::groups`], or [`NpGroups::of_members`]).
#[derive(Debug, Clone, Default)]
pub struct NpGroups<'a> {
    keys: Vec<IdentityKey<'a>>,
    /// Their [`identity_hash`]es.
    hashes: Vec<u64>,
    /// Per identity: its addresses, and whether one is this node's pod.
    info: Vec<(Vec<IpAddr>, bool)>,
}

impl<'a> NpGroups<'a> {
    /// Groups `members` (equal namespace, labels and named ports).
    pub fn of_members(members_in: impl IntoIterator<Item = &'a NpMember>) -> Self {
        let mut members: FastMap<IdentityKey<'a>, (Vec<IpAddr>, bool)> = FastMap::default();
        for m in members_in {
            let key = IdentityKey {
                namespace: &m.namespace,
                labels: &m.labels,
                ports: &m.ports,
            };
            let e = members.entry(key).or_default();
            e.0.push(m.ip);
            e.1 |= m.local;
        }
        // sorted: the ids' probing order is the identities' order
        let mut members: Vec<(IdentityKey<'a>, (Vec<IpAddr>, bool))> =
            members.into_iter().collect();
        members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let (keys, info): (Vec<_>, Vec<_>) = members.into_iter().unzip();
        let hashes = keys.iter().map(identity_hash).collect();
        Self { keys, hashes, info }
    }
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Ids `1..NP_PEER_CIDR`.
const ID_SPACE: u64 = NP_PEER_CIDR as u64 - 1;

/// The hash an identity's id starts from (FNV-1a of its namespace, labels
/// and named ports).
fn identity_hash(k: &IdentityKey<'_>) -> u64 {
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(k.namespace.as_bytes());
    bytes.push(0);
    for (l, v) in k.labels {
        bytes.extend_from_slice(l.as_bytes());
        bytes.push(b'=');
        bytes.extend_from_slice(v.as_bytes());
        bytes.push(0);
    }
    bytes.push(0);
    for p in k.ports {
        bytes.extend_from_slice(p.name.as_bytes());
        bytes.extend_from_slice(p.protocol.as_bytes());
        bytes.extend_from_slice(&p.port.to_be_bytes());
    }
    fnv1a(bytes)
}

/// The ids of the identities (sorted, distinct) whose [`identity_hash`]es
/// are `hashes`: each its hash, probed past ids an earlier one took.
fn assign_ids(hashes: &[u64]) -> Vec<u32> {
    let mut used = HashSet::with_capacity(hashes.len() + 1);
    // the host's pseudo identity is no pod's
    used.insert(u64::from(NP_HOST_ID));
    hashes
        .iter()
        .map(|h| {
            let mut id = h % ID_SPACE + 1;
            while !used.insert(id) {
                id = id % ID_SPACE + 1;
            }
            // below NP_PEER_CIDR by construction
            u32::try_from(id).unwrap_or(1)
        })
        .collect()
}

/// A port clause as written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PortSpec {
    /// Every protocol, every port (a rule without ports).
    Any,
    /// Every port of the protocol.
    Proto(u8),
    /// `lo..=hi` of the protocol.
    Range(u8, u16, u16),
    /// A named port of the destination pod.
    Named(u8, String),
}

/// A peer as written, resolved to identities where it names pods.
#[derive(Debug, Clone)]
enum Peer {
    /// Every source or destination (a rule without `from`/`to`).
    Any,
    /// These identities (indexes).
    Pods(Vec<usize>),
    /// An ipBlock.
    Block(IpNet, Vec<IpNet>),
    /// An entity peer's addresses (host prefixes); `ingress_only` names the
    /// node entities, which match nothing in egress.
    Hosts {
        /// The entity, for the diagnostic.
        entity: &'static str,
        /// Its addresses.
        addrs: Vec<IpNet>,
        /// Refused in egress rules.
        ingress_only: bool,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    peers: Vec<Peer>,
    ports: Vec<PortSpec>,
}

/// A policy, its selection and rules resolved.
#[derive(Debug, Clone, Default)]
struct Compiled {
    /// `namespace/name`, for diagnostics.
    name: String,
    /// The identities it selects.
    selects: Vec<usize>,
    /// Rules per direction: `Some` isolates the direction, unless `open`
    /// says otherwise (Cilium's `enableDefaultDeny: false`).
    ingress: Option<Vec<Rule>>,
    egress: Option<Vec<Rule>>,
    /// The direction's rules add to others' but do not isolate
    /// ([ingress, egress]).
    open: [bool; 2],
    /// Fail closed: the selected pods admit nothing in the direction,
    /// whatever else admits it ([ingress, egress]).
    blocked: [bool; 2],
    /// Deny rules ([ingress, egress]): they refuse what they match, over
    /// every allow, isolated or not.
    deny: [Vec<Rule>; 2],
    /// The policy applies to the node itself (`bpf/hostfw.h`).
    host: bool,
}

impl Compiled {
    fn subjects(&self) -> impl Iterator<Item = Subject> + '_ {
        self.selects
            .iter()
            .map(|&i| Subject::Pod(i))
            .chain(self.host.then_some(Subject::Host))
    }
}

struct World<'a> {
    /// Every node's, this node's and this node's pods' addresses.
    nodes: Vec<IpNet>,
    local_node: Vec<IpNet>,
    local_pods: Vec<IpNet>,
    /// The pod network and the API server (Cilium's entities).
    cluster_cidrs: Vec<IpNet>,
    apiserver: Vec<IpNet>,
    keys: Vec<IdentityKey<'a>>,
    by_ns: FastMap<&'a str, Vec<usize>>,
    ns_labels: FastMap<&'a str, &'a BTreeMap<String, String>>,
    /// Identities with a given named port: (name, proto) → (identity, port).
    named: FastMap<(String, u8), Vec<(usize, u16)>>,
}

fn policy_name(p: &NetworkPolicy) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

impl World<'_> {
    fn select(
        &self,
        ns: &str,
        sel: &LabelSelector,
        what: &'static str,
        policy: &str,
        diags: &mut Vec<NpDiagnostic>,
    ) -> Result<Vec<usize>, ()> {
        let mut out = Vec::new();
        for &i in self.by_ns.get(ns).into_iter().flatten() {
            match selector_matches(sel, self.keys[i].labels) {
                Ok(true) => out.push(i),
                Ok(false) => {}
                Err(e) => {
                    diags.push(NpDiagnostic::BadSelector {
                        policy: policy.to_string(),
                        what,
                        error: e.to_string(),
                    });
                    return Err(());
                }
            }
        }
        Ok(out)
    }

    fn peer(
        &self,
        ns: &str,
        p: &NetworkPolicyPeer,
        policy: &str,
        diags: &mut Vec<NpDiagnostic>,
    ) -> Option<Peer> {
        if let Some(block) = &p.ip_block {
            let bad = |cidr: &str, diags: &mut Vec<NpDiagnostic>| {
                diags.push(NpDiagnostic::BadCidr {
                    policy: policy.to_string(),
                    cidr: cidr.to_string(),
                });
            };
            let Ok(net) = block.cidr.parse::<IpNet>() else {
                bad(&block.cidr, diags);
                return None;
            };
            let mut except = Vec::new();
            for e in block.except.iter().flatten() {
                match e.parse::<IpNet>() {
                    Ok(n) => except.push(n.trunc()),
                    Err(_) => {
                        bad(e, diags);
                        return None;
                    }
                }
            }
            return Some(Peer::Block(net.trunc(), except));
        }
        // an entity peer: the label alone in the namespaceSelector, no podSelector
        if let Some(sel) = &p.namespace_selector {
            if let Some(entity) = sel
                .match_labels
                .as_ref()
                .and_then(|m| m.get(LABEL_POLICY_ENTITY))
            {
                let alone = p.pod_selector.is_none()
                    && sel.match_labels.as_ref().is_some_and(|m| m.len() == 1)
                    && sel.match_expressions.as_ref().is_none_or(Vec::is_empty);
                let peer = |entity: &'static str, addrs: &[IpNet], ingress_only| Peer::Hosts {
                    entity,
                    addrs: addrs.to_vec(),
                    ingress_only,
                };
                return match (alone, entity.as_str()) {
                    (true, "nodes") => Some(peer("nodes", &self.nodes, true)),
                    (true, "local-node") => Some(peer("local-node", &self.local_node, true)),
                    (true, "local-pods") => Some(peer("local-pods", &self.local_pods, false)),
                    _ => {
                        diags.push(NpDiagnostic::BadEntity {
                            policy: policy.to_string(),
                            entity: entity.clone(),
                        });
                        None
                    }
                };
            }
        }
        let namespaces: Vec<&str> = match &p.namespace_selector {
            None => vec![ns],
            Some(sel) => {
                let mut v = Vec::new();
                for (name, labels) in &self.ns_labels {
                    match selector_matches(sel, labels) {
                        Ok(true) => v.push(*name),
                        Ok(false) => {}
                        Err(e) => {
                            diags.push(NpDiagnostic::BadSelector {
                                policy: policy.to_string(),
                                what: "a peer's namespaceSelector",
                                error: e.to_string(),
                            });
                            return None;
                        }
                    }
                }
                v
            }
        };
        let all = LabelSelector::default();
        let sel = p.pod_selector.as_ref().unwrap_or(&all);
        let mut ids = Vec::new();
        for n in namespaces {
            ids.extend(
                self.select(n, sel, "a peer's podSelector", policy, diags)
                    .ok()?,
            );
        }
        Some(Peer::Pods(ids))
    }
}

fn port_spec(
    p: &NetworkPolicyPort,
    policy: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Option<PortSpec> {
    let bad = |diags: &mut Vec<NpDiagnostic>| {
        diags.push(NpDiagnostic::BadPort {
            policy: policy.to_string(),
            port: format!(
                "{}/{:?}-{:?}",
                p.protocol.as_deref().unwrap_or("TCP"),
                p.port,
                p.end_port
            ),
        });
    };
    let Some(proto) = proto_of(p.protocol.as_deref()) else {
        bad(diags);
        return None;
    };
    match &p.port {
        None => Some(PortSpec::Proto(proto)),
        Some(IntOrString::String(name)) => {
            if p.end_port.is_some() {
                bad(diags);
                return None;
            }
            Some(PortSpec::Named(proto, name.clone()))
        }
        Some(IntOrString::Int(n)) => {
            let lo = u16::try_from(*n).ok().filter(|n| *n > 0);
            let hi = match p.end_port {
                None => lo,
                Some(e) => u16::try_from(e).ok(),
            };
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo <= hi => Some(PortSpec::Range(proto, lo, hi)),
                _ => {
                    bad(diags);
                    None
                }
            }
        }
    }
}

fn rules(
    world: &World<'_>,
    ns: &str,
    list: impl Iterator<
        Item = (
            Option<Vec<NetworkPolicyPeer>>,
            Option<Vec<NetworkPolicyPort>>,
        ),
    >,
    policy: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Vec<Rule> {
    list.map(|(peers, ports)| {
        let peers = match peers {
            Some(v) if !v.is_empty() => v
                .iter()
                .filter_map(|p| world.peer(ns, p, policy, diags))
                .collect(),
            _ => vec![Peer::Any],
        };
        let ports = match ports {
            Some(v) if !v.is_empty() => v
                .iter()
                .filter_map(|p| port_spec(p, policy, diags))
                .collect(),
            _ => vec![PortSpec::Any],
        };
        Rule { peers, ports }
    })
    .collect()
}

/// The policy types in force: as written, or the API's default.
fn policy_types(p: &NetworkPolicy) -> (bool, bool) {
    let Some(spec) = &p.spec else {
        return (true, false);
    };
    match &spec.policy_types {
        Some(t) if !t.is_empty() => (
            t.iter().any(|t| t == "Ingress"),
            t.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

/// Adds `subject`'s rule(s) for `dir` traffic with `peer` matching `what`
/// (collected unsorted, with duplicates: sorted once at the end, which is
/// far cheaper than tens of thousands of ordered-map inserts).
fn emit(out: &mut Vec<u128>, subject: u32, dir: u8, peer: u32, what: &PortSpec) {
    let mut put = |m| {
        out.push(rule_order(&NpRule::key(subject, dir, peer, m).into()));
    };
    match *what {
        PortSpec::Any => put(NpMatch::Any),
        PortSpec::Proto(p) => put(NpMatch::Proto(p)),
        PortSpec::Range(proto, lo, hi) => {
            for (start, bits) in PortPrefixes::new(lo, hi) {
                put(NpMatch::Ports { proto, start, bits });
            }
        }
        // resolved before: never emitted as a name
        PortSpec::Named(..) => {}
    }
}

/// `what` with a named port resolved against identity `i`'s ports (None:
/// `i` has no such port).
fn resolve(world: &World<'_>, i: usize, what: &PortSpec) -> Option<PortSpec> {
    match what {
        PortSpec::Named(proto, name) => world.keys[i]
            .ports
            .iter()
            .find(|p| p.name == *name && p.proto() == Some(*proto))
            .map(|p| PortSpec::Range(*proto, p.port, p.port)),
        other => Some(other.clone()),
    }
}

/// A rule key as one integer with the same order as `Prefixed<NpRule>`'s
/// (subject, dir, peer, proto, port, prefix length; the pads are zero):
/// sorting tens of thousands of these is several times cheaper than sorting
/// the structs field by field.
fn rule_order(r: &Prefixed<NpRule>) -> u128 {
    let d = &r.data;
    (u128::from(d.subject) << 72)
        | (u128::from(d.dir) << 64)
        | (u128::from(d.peer) << PEER_SHIFT)
        | (u128::from(d.proto) << 24)
        | (u128::from(u16::from_be_bytes(d.port)) << 8)
        | u128::from(r.prefix_len & 0xff)
}

/// Where [`rule_order`] puts the peer: a key made with peer 0 takes any
/// peer by OR (a rule's prefix always covers the whole peer).
const PEER_SHIFT: u32 = 32;

fn rule_of_order(k: u128) -> Prefixed<NpRule> {
    // each field is masked to its width before the narrowing cast
    let field = |shift: u32, mask: u128| (k >> shift) & mask;
    Prefixed {
        prefix_len: field(0, 0xff) as u32,
        data: NpRule {
            subject: field(72, 0xffff_ffff) as u32,
            dir: field(64, 0xff) as u8,
            pad: [0; 3],
            peer: field(32, 0xffff_ffff) as u32,
            proto: field(24, 0xff) as u8,
            pad2: 0,
            port: (field(8, 0xffff) as u16).to_be_bytes(),
        },
    }
}

/// Sorts one subject's emitted rules (with duplicates), appends them to
/// `out` as map entries and empties `chunk`. Subjects come in id order and
/// the id is the rules' first key, so `out` stays sorted.
fn append_sorted(out: &mut Vec<(Prefixed<NpRule>, u32)>, chunk: &mut Vec<u128>) {
    // stable on purpose: a peer list emits in id order (sorted after the
    // policies are resolved), so a chunk is a few sorted runs, which the
    // stable sort finds and merges
    chunk.sort();
    chunk.dedup();
    out.extend(chunk.drain(..).map(|k| (rule_of_order(k), 1)));
}

/// Whose policies a rule is: a local pod identity (index), or the node
/// itself (HostFirewall, Cilium host policies: `bpf/hostfw.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Subject {
    Pod(usize),
    Host,
}

/// ipBlocks of one (subject, dir): (cidr, excepts, port specs, deny).
type Blocks = Vec<(IpNet, Vec<IpNet>, Vec<PortSpec>, bool)>;

/// Emits one subject's rules for one direction.
struct Emit<'e, 'w> {
    world: &'e World<'w>,
    member_info: &'e [(Vec<IpAddr>, bool)],
    ids: &'e [u32],
    subject: u32,
    s: Subject,
    dir: u8,
    keys: &'e mut Vec<u128>,
    blocks: &'e mut BTreeMap<(u32, u8), Blocks>,
    deny: bool,
    policy: &'e str,
    diags: &'e mut Vec<NpDiagnostic>,
}

impl Emit<'_, '_> {
    /// `what` resolved against the subject (ingress: its own named ports;
    /// the host has none).
    fn own(&self, what: &PortSpec) -> Option<PortSpec> {
        match self.s {
            Subject::Pod(i) => resolve(self.world, i, what),
            Subject::Host => match what {
                PortSpec::Named(..) => None,
                other => Some(other.clone()),
            },
        }
    }

    fn rule(&mut self, rule: &Rule) {
        let (world, dir, subject) = (self.world, self.dir, self.subject);
        for peer in &rule.peers {
            for what in &rule.ports {
                match peer {
                    Peer::Any if dir == NP_EGRESS => {
                        if let PortSpec::Named(proto, n) = what {
                            // every pod with the name, as itself
                            for &(i, port) in
                                world.named.get(&(n.clone(), *proto)).into_iter().flatten()
                            {
                                let r = PortSpec::Range(*proto, port, port);
                                emit(self.keys, subject, dir, self.ids[i], &r);
                            }
                        } else {
                            emit(self.keys, subject, dir, NP_PEER_ANY, what);
                        }
                    }
                    Peer::Any => {
                        if let Some(r) = self.own(what) {
                            emit(self.keys, subject, dir, NP_PEER_ANY, &r);
                        }
                    }
                    Peer::Pods(list) if dir == NP_INGRESS => {
                        // the subject's own port: the same for every peer,
                        // so each key is made once and the peers ORed in
                        let Some(r) = self.own(what) else { continue };
                        let start = self.keys.len();
                        emit(self.keys, subject, dir, 0, &r);
                        let end = self.keys.len();
                        for &i in list {
                            let peer = u128::from(self.ids[i]) << PEER_SHIFT;
                            for k in start..end {
                                let key = self.keys[k] | peer;
                                self.keys.push(key);
                            }
                        }
                        self.keys.drain(start..end);
                    }
                    Peer::Pods(list) => {
                        for &i in list {
                            // a name resolves against the destination
                            if let Some(r) = resolve(world, i, what) {
                                emit(self.keys, subject, dir, self.ids[i], &r);
                            }
                        }
                    }
                    Peer::Hosts {
                        entity,
                        ingress_only: true,
                        ..
                    } if dir == NP_EGRESS => {
                        self.diags.push(NpDiagnostic::EntityInEgress {
                            policy: self.policy.to_string(),
                            entity: entity.to_string(),
                        });
                    }
                    Peer::Block(..) | Peer::Hosts { .. } => {
                        let nets: Vec<(IpNet, Vec<IpNet>)> = match peer {
                            Peer::Block(net, except) => vec![(*net, except.clone())],
                            Peer::Hosts { addrs, .. } => {
                                addrs.iter().map(|a| (*a, Vec::new())).collect()
                            }
                            _ => Vec::new(),
                        };
                        for (net, except) in &nets {
                            match what {
                                // a name towards a block resolves per
                                // destination pod in it: a host boundary for
                                // each such address
                                PortSpec::Named(proto, n) if dir == NP_EGRESS => {
                                    for &(i, port) in
                                        world.named.get(&(n.clone(), *proto)).into_iter().flatten()
                                    {
                                        for ip in &self.member_info[i].0 {
                                            if net.contains(ip)
                                                && !except.iter().any(|e| e.contains(ip))
                                            {
                                                self.blocks
                                                    .entry((subject, dir))
                                                    .or_default()
                                                    .push((
                                                        IpNet::from(*ip),
                                                        Vec::new(),
                                                        vec![PortSpec::Range(*proto, port, port)],
                                                        self.deny,
                                                    ));
                                            }
                                        }
                                    }
                                }
                                _ => {
                                    if let Some(r) = self.own(what) {
                                        self.blocks.entry((subject, dir)).or_default().push((
                                            *net,
                                            except.clone(),
                                            vec![r],
                                            self.deny,
                                        ));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Compiles `policies` for `members` (the subjects are the local ones).
pub fn compile_network_policies<'m>(
    policies: &[NetworkPolicy],
    members_in: impl IntoIterator<Item = &'m NpMember>,
    namespaces: &[Namespace],
    hosts: &NpHosts,
) -> CompiledNetworkPolicies {
    compile_policies(
        PolicyInput {
            network_policies: policies,
            ..PolicyInput::default()
        },
        members_in,
        namespaces,
        hosts,
    )
}

/// Compiles every policy kind of `input` for `members` (the subjects are
/// the local ones) into one set of maps: a pod's policies add up across
/// kinds, as they do on Cilium.
pub fn compile_policies<'m>(
    input: PolicyInput<'_>,
    members_in: impl IntoIterator<Item = &'m NpMember>,
    namespaces: &[Namespace],
    hosts: &NpHosts,
) -> CompiledNetworkPolicies {
    compile_groups(input, NpGroups::of_members(members_in), namespaces, hosts)
}

/// [`compile_policies`] of members already grouped (the agent's
/// [`MemberCache::groups`]).
pub fn compile_groups(
    input: PolicyInput<'_>,
    groups: NpGroups<'_>,
    namespaces: &[Namespace],
    hosts: &NpHosts,
) -> CompiledNetworkPolicies {
    let policies = input.network_policies;
    let mut diags = Vec::new();
    let NpGroups {
        keys,
        hashes,
        info: member_info,
    } = groups;
    let ids = assign_ids(&hashes);
    let host = |ips: &mut dyn Iterator<Item = IpAddr>| -> Vec<IpNet> {
        let mut v: Vec<IpNet> = ips.map(IpNet::from).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut world = World {
        nodes: host(&mut hosts.nodes.iter().copied()),
        local_node: host(&mut hosts.local_node.iter().copied()),
        local_pods: host(
            &mut member_info
                .iter()
                .filter(|(_, local)| *local)
                .flat_map(|(ips, _)| ips.iter().copied()),
        ),
        cluster_cidrs: hosts.cluster_cidrs.iter().map(IpNet::trunc).collect(),
        apiserver: host(&mut hosts.apiserver.iter().copied()),
        keys,
        by_ns: FastMap::default(),
        ns_labels: FastMap::default(),
        named: FastMap::default(),
    };
    for (i, k) in world.keys.iter().enumerate() {
        world.by_ns.entry(k.namespace).or_default().push(i);
        for p in k.ports {
            if let Some(proto) = p.proto() {
                world
                    .named
                    .entry((p.name.clone(), proto))
                    .or_default()
                    .push((i, p.port));
            }
        }
    }
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    for ns in namespaces {
        if let Some(name) = ns.metadata.name.as_deref() {
            world
                .ns_labels
                .insert(name, ns.metadata.labels.as_ref().unwrap_or(&NO_LABELS));
        }
    }
    let local: BTreeSet<usize> = member_info
        .iter()
        .enumerate()
        .filter(|(_, (_, l))| *l)
        .map(|(i, _)| i)
        .collect();

    // the policies that select a local identity, resolved once
    let mut compiled: Vec<Compiled> = Vec::new();
    for p in policies {
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = policy_name(p);
        let Some(spec) = &p.spec else { continue };
        let all = LabelSelector::default();
        let selects: Vec<usize> = match world.select(
            ns,
            spec.pod_selector.as_ref().unwrap_or(&all),
            "podSelector",
            &name,
            &mut diags,
        ) {
            Ok(s) => s.into_iter().filter(|i| local.contains(i)).collect(),
            Err(()) => {
                // fail closed: the whole namespace, admitting nothing
                let (ing, eg) = policy_types(p);
                compiled.push(Compiled {
                    name: name.clone(),
                    selects: world
                        .by_ns
                        .get(ns)
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|i| local.contains(i))
                        .collect(),
                    ingress: ing.then(Vec::new),
                    egress: eg.then(Vec::new),
                    ..Compiled::default()
                });
                continue;
            }
        };
        if selects.is_empty() {
            continue;
        }
        let (ing, eg) = policy_types(p);
        let ingress = ing.then(|| {
            rules(
                &world,
                ns,
                spec.ingress
                    .iter()
                    .flatten()
                    .map(|r| (r.from.clone(), r.ports.clone())),
                &name,
                &mut diags,
            )
        });
        let egress = eg.then(|| {
            rules(
                &world,
                ns,
                spec.egress
                    .iter()
                    .flatten()
                    .map(|r| (r.to.clone(), r.ports.clone())),
                &name,
                &mut diags,
            )
        });
        compiled.push(Compiled {
            name,
            selects,
            ingress,
            egress,
            ..Compiled::default()
        });
    }
    cilium::compile(&world, &input, &local, hosts, &mut compiled, &mut diags);
    hostfw::compile(
        &world,
        input.host_firewalls,
        hosts,
        &mut compiled,
        &mut diags,
    );

    // peer lists in id order: a rule's keys are then emitted sorted
    for c in &mut compiled {
        let lists = c
            .ingress
            .iter_mut()
            .chain(c.egress.iter_mut())
            .chain(c.deny.iter_mut());
        for rule in lists.flatten() {
            for peer in &mut rule.peers {
                if let Peer::Pods(list) = peer {
                    list.sort_unstable_by_key(|&i| ids[i]);
                }
            }
        }
    }
    // per subject (local identity, or the host), in id order: isolation
    // and rules; each subject's rules are sorted on their own and appended,
    // since the map's order is the subject's first
    let mut out = NpDesired::default();
    let mut flags: HashMap<Subject, u32> = HashMap::new();
    // fail closed: (subject, dir) that admit nothing
    let mut blocked: HashSet<(Subject, u8)> = HashSet::new();
    let mut by_subject: FastMap<Subject, Vec<usize>> = FastMap::default();
    for (n, c) in compiled.iter().enumerate() {
        for s in c.subjects() {
            by_subject.entry(s).or_default().push(n);
        }
        for (k, dir) in [(0, NP_INGRESS), (1, NP_EGRESS)] {
            if c.blocked[k] {
                blocked.extend(c.subjects().map(|s| (s, dir)));
            }
        }
    }
    let id_of = |s: Subject| match s {
        Subject::Pod(i) => ids[i],
        Subject::Host => NP_HOST_ID,
    };
    let mut by_subject: Vec<(u32, Subject, Vec<usize>)> = by_subject
        .into_iter()
        .map(|(s, list)| (id_of(s), s, list))
        .collect();
    by_subject.sort_unstable_by_key(|(id, _, _)| *id);
    let (mut all_rules, mut all_deny) = (Vec::new(), Vec::new());
    let (mut rules, mut deny_rules): (Vec<u128>, Vec<u128>) = (Vec::new(), Vec::new());
    // ipBlocks per (subject id, dir): (cidr, excepts, port specs, deny)
    let mut blocks: BTreeMap<(u32, u8), Blocks> = BTreeMap::new();
    let mut cidrs = Vec::new();
    for (subject, s, list) in &by_subject {
        let (subject, s) = (*subject, *s);
        rules.clear();
        deny_rules.clear();
        blocks.clear();
        for c in list.iter().map(|&n| &compiled[n]) {
            for (k, dir, list, bit, deny_bit) in [
                (0, NP_INGRESS, &c.ingress, NP_F_ISOLATED_IN, NP_F_DENY_IN),
                (1, NP_EGRESS, &c.egress, NP_F_ISOLATED_OUT, NP_F_DENY_OUT),
            ] {
                if c.blocked[k] {
                    *flags.entry(s).or_default() |= bit;
                }
                if !c.deny[k].is_empty() {
                    *flags.entry(s).or_default() |= deny_bit;
                    let mut e = Emit {
                        world: &world,
                        member_info: &member_info,
                        ids: &ids,
                        subject,
                        s,
                        dir,
                        keys: &mut deny_rules,
                        blocks: &mut blocks,
                        deny: true,
                        policy: &c.name,
                        diags: &mut diags,
                    };
                    for rule in &c.deny[k] {
                        e.rule(rule);
                    }
                }
                let Some(list) = list else { continue };
                if !c.open[k] {
                    *flags.entry(s).or_default() |= bit;
                }
                if blocked.contains(&(s, dir)) {
                    continue;
                }
                let mut e = Emit {
                    world: &world,
                    member_info: &member_info,
                    ids: &ids,
                    subject,
                    s,
                    dir,
                    keys: &mut rules,
                    blocks: &mut blocks,
                    deny: false,
                    policy: &c.name,
                    diags: &mut diags,
                };
                for rule in list {
                    e.rule(rule);
                }
            }
        }
        for ((subject, dir), list) in &blocks {
            let bounds: BTreeSet<IpNet> = list
                .iter()
                .flat_map(|(net, except, _, _)| std::iter::once(*net).chain(except.iter().copied()))
                .collect();
            for (n, b) in bounds.iter().enumerate() {
                let class = u32::try_from(n + 1).unwrap_or(u32::MAX) & !NP_PEER_CIDR;
                let Some(key) = np_cidr_key(*subject, *dir, b.network(), b.prefix_len()) else {
                    continue; // lengths come from parsed CIDRs: never too long
                };
                cidrs.push((key.into(), class));
                for (net, except, ports, deny) in list {
                    if net.contains(b) && !except.iter().any(|e| e.contains(b)) {
                        let target = if *deny { &mut deny_rules } else { &mut rules };
                        for what in ports {
                            emit(target, *subject, *dir, NP_PEER_CIDR | class, what);
                        }
                    }
                }
            }
        }
        append_sorted(&mut all_rules, &mut rules);
        append_sorted(&mut all_deny, &mut deny_rules);
    }
    out.cidrs = cidrs.into_iter().collect();
    let mut eps = Vec::with_capacity(member_info.len() + 1);
    for (i, (ips, _)) in member_info.iter().enumerate() {
        let ep = NpEp {
            id: ids[i],
            flags: flags.get(&Subject::Pod(i)).copied().unwrap_or(0),
        };
        eps.extend(ips.iter().map(|ip| (np_ep_key(*ip), ep)));
    }
    if let Some(f) = flags.get(&Subject::Host).copied().filter(|f| *f != 0) {
        eps.push((
            np_host_key(),
            NpEp {
                id: NP_HOST_ID,
                flags: f,
            },
        ));
    }
    out.eps = eps.into_iter().collect();
    out.rules = SortedMap::from_sorted(all_rules);
    out.deny = SortedMap::from_sorted(all_deny);
    diags.sort();
    diags.dedup();
    CompiledNetworkPolicies {
        desired: out,
        diagnostics: diags,
        identities: ids.len(),
    }
}

mod cilium;
pub mod explain;
mod hostfw;

#[cfg(test)]
mod tests;

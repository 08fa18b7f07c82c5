//! The Services compiler (issue #11, `docs/services.md`): a pure function from
//! the watched Services and EndpointSlices, and what this node knows about
//! itself, to the frontends the service maps must hold and the backends each
//! one may pick.
//!
//! It decides what kube-proxy decides, per frontend:
//!
//! * **Frontends.** For every port of a Service: each ClusterIP and externalIP,
//!   each LoadBalancer ingress IP (not those with `ipMode: Proxy`, whose load
//!   balancer proxies itself), and the NodePort on each of this node's
//!   addresses. Each exists in two [`Scope`]s: as seen from inside the cluster
//!   (socket-LB, pods and host processes on this node) and as seen on the wire
//!   (per-packet LB on the uplink). ClusterIPs have no wire scope: they are
//!   never reachable from outside. Headless and ExternalName Services, and
//!   Services another proxy owns (`service.kubernetes.io/service-proxy-name`),
//!   have none.
//! * **Endpoints.** The slices labelled `kubernetes.io/service-name` in the
//!   Service's namespace, the endpoint port whose name and protocol match the
//!   Service port's, of the frontend's address family. Ready endpoints are
//!   used; when none is ready, the serving terminating ones are (as kube-proxy
//!   does since 1.28), so a rolling update's last pods keep answering.
//! * **Traffic policies.** `internalTrafficPolicy: Local` restricts ClusterIP
//!   frontends to this node's endpoints; `externalTrafficPolicy: Local` does the
//!   same for wire-scope NodePort, LoadBalancer and externalIP frontends (with
//!   no local endpoint the frontend has no backend and the traffic is refused,
//!   never sent to another node, which would lose the client's address). From
//!   inside the cluster, an externalIP, LoadBalancer IP or NodePort reaches all
//!   endpoints whatever its `externalTrafficPolicy`, as kube-proxy's
//!   short-circuit does.
//! * **Backends are cluster addresses only.** An endpoint address that is not a
//!   pod's (a FabricIP claim) or a node's, nor inside `--service-external-backends`,
//!   is skipped with [`ServiceDiagnostic::ForeignEndpoint`]: EndpointSlices are
//!   namespaced and writable by tenants, and a Service must not become a way to
//!   reach an address its creator could not reach directly (another tenant's
//!   VPC address through a NodePort, say).
//! * **Maglev.** Wire-scope frontends also get a Maglev lookup table over their
//!   backends, a pure function of the backend set ([`maglev_table`]), so every
//!   node sends a flow to the same backend without sharing state.
//!
//! Output is in `BTreeMap`s and sorted vectors: the same input yields the same
//! tables, so the sync's diffs are stable. Nothing here fails: a malformed
//! object is skipped and reported, the rest compiles.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label that hands a Service to a named proxy (kube-proxy's contract).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// `sessionAffinityConfig.clientIP.timeoutSeconds` when unset (kube's default, 3 h).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// Maglev table sizes: primes, the smallest one at least 100 × the backends is used.
pub const MAGLEV_SIZES: [u32; 9] = [251, 509, 1021, 2039, 4093, 8191, 16_381, 32_749, 65_521];

/// An L4 protocol a Service port may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (17).
    Udp,
    /// SCTP (132).
    Sctp,
}

impl Proto {
    /// Parses a Kubernetes protocol name; unset means TCP.
    pub fn parse(s: Option<&str>) -> Option<Proto> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Proto::Tcp),
            "UDP" => Some(Proto::Udp),
            "SCTP" => Some(Proto::Sctp),
            _ => None,
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
        }
    }
}

/// Where a frontend is seen from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// From a socket on this node (pods and host processes): socket-LB.
    Internal,
    /// From the wire, arriving on this node's uplink: per-packet LB.
    External,
}

/// What kind of Service address a frontend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    /// `spec.clusterIPs`.
    ClusterIp,
    /// `spec.externalIPs`.
    ExternalIp,
    /// `status.loadBalancer.ingress[].ip`.
    LoadBalancer,
    /// `spec.ports[].nodePort` on one of this node's addresses.
    NodePort,
}

/// A frontend's key: what a connection or packet is looked up by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendKey {
    /// The network (0: the default network).
    pub net: u32,
    /// The Service address.
    pub addr: IpAddr,
    /// The Service port (the nodePort for NodePort frontends).
    pub port: u16,
    /// The protocol.
    pub proto: Proto,
    /// Where it is seen from.
    pub scope: Scope,
}

impl std::fmt::Display for FrontendKey {
    /// `10.96.0.10:80/TCP`, `[fd96::a]:80/UDP`; wire-scope ones marked `(wire)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        };
        write!(
            f,
            "{}/{proto}",
            std::net::SocketAddr::new(self.addr, self.port)
        )?;
        if self.scope == Scope::External {
            f.write_str(" (wire)")?;
        }
        Ok(())
    }
}

/// A backend: where a frontend's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    /// The endpoint's address.
    pub addr: IpAddr,
    /// The endpoint's port.
    pub port: u16,
    /// The protocol.
    pub proto: Proto,
}

/// A frontend: the Service port it stands for and the backends it picks from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    /// `(namespace, name)` of the Service.
    pub service: (String, String),
    /// The Service port's name (empty for a single unnamed port).
    pub port_name: String,
    /// The kind of address.
    pub kind: FrontendKind,
    /// The backends, this node's first (`local_count` of them), each group sorted.
    pub backends: Vec<Backend>,
    /// How many of `backends` are on this node.
    pub local_count: usize,
    /// Whether `backends` are serving terminating endpoints, used because no
    /// endpoint was ready.
    pub terminating_fallback: bool,
    /// `sessionAffinity: ClientIP`: the timeout, seconds.
    pub affinity_timeout_s: Option<u32>,
    /// `loadBalancerSourceRanges` (LoadBalancer frontends of the wire scope only).
    pub source_ranges: Vec<IpNet>,
    /// The Maglev table (wire scope only): indices into `backends`, empty when
    /// there is no backend.
    pub maglev: Vec<u32>,
}

/// This node's view of the cluster, as the compiler needs it.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// This node's name (`EndpointSlice` endpoints' `nodeName`).
    pub name: String,
    /// This node's addresses, where NodePorts are served.
    pub addresses: Vec<IpAddr>,
    /// Every address a backend may have: pods' (FabricIP claims) and nodes'.
    pub cluster_addresses: BTreeSet<IpAddr>,
    /// Addresses outside the cluster that backends may have anyway
    /// (`--service-external-backends`; empty by default).
    pub external_backends: Vec<IpNet>,
    /// The proxy name this agent answers to (`--service-proxy-name`): a Service
    /// labelled with another name is skipped, as is one labelled at all when
    /// this is `None` (kube-proxy's rule).
    pub proxy_name: Option<String>,
}

/// What the compiler produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceTables {
    /// Every frontend.
    pub frontends: BTreeMap<FrontendKey, Frontend>,
    /// What was skipped, sorted.
    pub diagnostics: Vec<ServiceDiagnostic>,
}

/// Something the Services compiler skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum ServiceDiagnostic {
    /// A Service address or port that does not parse.
    #[error("Service {namespace}/{name}: {what}")]
    BadService {
        /// The Service's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// An endpoint whose address is neither a pod's nor a node's.
    #[error(
        "EndpointSlice {namespace}/{slice}: endpoint {addr} is not a pod or node address; ignored"
    )]
    ForeignEndpoint {
        /// The slice's namespace.
        namespace: String,
        /// The slice's name.
        slice: String,
        /// The address.
        addr: IpAddr,
    },
    /// An endpoint address that does not parse or does not match the slice's type.
    #[error("EndpointSlice {namespace}/{slice}: bad endpoint address {value:?}")]
    BadEndpoint {
        /// The slice's namespace.
        namespace: String,
        /// The slice's name.
        slice: String,
        /// The value.
        value: String,
    },
}

/// An endpoint of one Service port, as the slices give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Endpoint {
    backend: Backend,
    local: bool,
    ready: bool,
    serving_terminating: bool,
}

/// Compiles the service tables. Pure: no I/O, no clock.
pub fn compile_services(
    services: &[Service],
    slices: &[EndpointSlice],
    node: &NodeView,
) -> ServiceTables {
    let mut out = ServiceTables::default();
    let by_service = slices_by_service(slices);
    let mut diagnostics = BTreeSet::new();
    // In namespace/name order: of two Services claiming one frontend, the
    // first keeps it (as [`ServiceIndex`] decides).
    let mut ordered: Vec<&Service> = services.iter().collect();
    ordered.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    for svc in ordered {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        if !ours(svc, node) {
            continue;
        }
        let slices = by_service
            .get(&(ns, name))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        compile_service(
            svc,
            ns,
            name,
            slices,
            node,
            &mut out.frontends,
            &mut diagnostics,
        );
    }
    out.diagnostics = diagnostics.into_iter().collect();
    out
}

/// The slices by the Service they are labelled with (`kubernetes.io/service-name`,
/// in the slice's namespace): `(namespace, service)` → slices.
fn slices_by_service<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>> {
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
        let svc = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME));
        if let Some(svc) = svc {
            by_service
                .entry((ns, svc.as_str()))
                .or_default()
                .push(slice);
        }
    }
    by_service
}

/// Whether this agent handles the Service (kube-proxy's `service-proxy-name` rule).
fn ours(svc: &Service, node: &NodeView) -> bool {
    let label = svc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME));
    match (label, &node.proxy_name) {
        (None, _) => true,
        (Some(l), Some(ours)) => l == ours,
        (Some(_), None) => false,
    }
}

fn compile_service(
    svc: &Service,
    ns: &str,
    name: &str,
    slices: &[&EndpointSlice],
    node: &NodeView,
    frontends: &mut BTreeMap<FrontendKey, Frontend>,
    diagnostics: &mut BTreeSet<ServiceDiagnostic>,
) {
    let Some(spec) = &svc.spec else { return };
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    if ty == "ExternalName" {
        return;
    }
    let bad = |what: String| ServiceDiagnostic::BadService {
        namespace: ns.to_string(),
        name: name.to_string(),
        what,
    };
    let mut cluster_ips = Vec::new();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    if !headless {
        let ips = spec
            .cluster_ips
            .clone()
            .filter(|v| !v.is_empty())
            .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
            .unwrap_or_default();
        for ip in ips {
            match ip.parse::<IpAddr>() {
                Ok(ip) => cluster_ips.push(ip),
                Err(_) => {
                    diagnostics.insert(bad(format!("clusterIP {ip:?} is not an address")));
                }
            }
        }
    }
    let mut external_ips = Vec::new();
    for ip in spec.external_ips.iter().flatten() {
        match ip.parse::<IpAddr>() {
            Ok(ip) => external_ips.push(ip),
            Err(_) => {
                diagnostics.insert(bad(format!("externalIP {ip:?} is not an address")));
            }
        }
    }
    let mut lb_ips = Vec::new();
    if ty == "LoadBalancer" {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for ing in ingress.into_iter().flatten() {
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(ip) = &ing.ip {
                match ip.parse::<IpAddr>() {
                    Ok(ip) => lb_ips.push(ip),
                    Err(_) => {
                        diagnostics
                            .insert(bad(format!("load balancer IP {ip:?} is not an address")));
                    }
                }
            }
        }
    }
    let node_ports = matches!(ty, "NodePort" | "LoadBalancer");
    // A NodePort is served on the node's addresses of the Service's own
    // families (`ipFamilies`, else its cluster IPs'), as kube-proxy's one
    // proxier per family does: an IPv4-only Service has no NodePort on the
    // node's IPv6 address, whose connections stay the node's own.
    let mut families: Vec<bool> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some(true),
            "IPv6" => Some(false),
            _ => None,
        })
        .collect();
    if families.is_empty() {
        families = cluster_ips.iter().map(IpAddr::is_ipv4).collect();
    }
    let node_port_family = |ip: &IpAddr| families.is_empty() || families.contains(&ip.is_ipv4());
    let etp_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let itp_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_S)
    });
    let mut source_ranges = Vec::new();
    for r in spec.load_balancer_source_ranges.iter().flatten() {
        match r.trim().parse::<IpNet>() {
            Ok(n) => source_ranges.push(n.trunc()),
            Err(_) => {
                diagnostics.insert(bad(format!("loadBalancerSourceRange {r:?} is not a CIDR")));
            }
        }
    }
    source_ranges.sort();
    source_ranges.dedup();

    for sp in spec.ports.iter().flatten() {
        let Some(proto) = Proto::parse(sp.protocol.as_deref()) else {
            diagnostics.insert(bad(format!(
                "port {:?}: protocol {:?} is not TCP, UDP or SCTP",
                sp.name.as_deref().unwrap_or_default(),
                sp.protocol.as_deref().unwrap_or_default()
            )));
            continue;
        };
        let Ok(port) = u16::try_from(sp.port) else {
            diagnostics.insert(bad(format!("port {} is out of range", sp.port)));
            continue;
        };
        if port == 0 {
            diagnostics.insert(bad("port 0".into()));
            continue;
        }
        let endpoints = endpoints_of(sp, proto, slices, node, diagnostics);
        let base = Frontend {
            service: (ns.to_string(), name.to_string()),
            port_name: sp.name.clone().unwrap_or_default(),
            kind: FrontendKind::ClusterIp,
            backends: Vec::new(),
            local_count: 0,
            terminating_fallback: false,
            affinity_timeout_s: affinity,
            source_ranges: Vec::new(),
            maglev: Vec::new(),
        };
        let mut add =
            |kind: FrontendKind, addr: IpAddr, port: u16, scope: Scope, local_only: bool| {
                let (backends, local_count, terminating_fallback) =
                    select(&endpoints, addr.is_ipv4(), local_only);
                let maglev = if scope == Scope::External {
                    maglev_table(&backends)
                } else {
                    Vec::new()
                };
                let source_ranges =
                    if scope == Scope::External && kind == FrontendKind::LoadBalancer {
                        source_ranges
                            .iter()
                            .filter(|n| n.addr().is_ipv4() == addr.is_ipv4())
                            .copied()
                            .collect()
                    } else {
                        Vec::new()
                    };
                let key = FrontendKey {
                    net: 0,
                    addr,
                    port,
                    proto,
                    scope,
                };
                // Two Services cannot share an address and port (the API server's
                // allocators see to it); if they do anyway, the first by
                // namespace/name keeps it, the same on every node.
                frontends.entry(key).or_insert_with(|| Frontend {
                    kind,
                    backends,
                    local_count,
                    terminating_fallback,
                    source_ranges,
                    maglev,
                    ..base.clone()
                });
            };
        for &ip in &cluster_ips {
            add(
                FrontendKind::ClusterIp,
                ip,
                port,
                Scope::Internal,
                itp_local,
            );
        }
        for &ip in &external_ips {
            add(FrontendKind::ExternalIp, ip, port, Scope::Internal, false);
            add(
                FrontendKind::ExternalIp,
                ip,
                port,
                Scope::External,
                etp_local,
            );
        }
        for &ip in &lb_ips {
            add(FrontendKind::LoadBalancer, ip, port, Scope::Internal, false);
            add(
                FrontendKind::LoadBalancer,
                ip,
                port,
                Scope::External,
                etp_local,
            );
        }
        if node_ports {
            let node_port = sp
                .node_port
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(0);
            if node_port != 0 {
                for &ip in node.addresses.iter().filter(|ip| node_port_family(ip)) {
                    add(
                        FrontendKind::NodePort,
                        ip,
                        node_port,
                        Scope::Internal,
                        false,
                    );
                    add(
                        FrontendKind::NodePort,
                        ip,
                        node_port,
                        Scope::External,
                        etp_local,
                    );
                }
            }
        }
    }
}

/// The endpoints of one Service port across the Service's slices, deduplicated
/// (an address in two slices counts once, with the better of its conditions).
fn endpoints_of(
    sp: &ServicePort,
    proto: Proto,
    slices: &[&EndpointSlice],
    node: &NodeView,
    diagnostics: &mut BTreeSet<ServiceDiagnostic>,
) -> Vec<Endpoint> {
    let want_name = sp.name.as_deref().unwrap_or_default();
    let mut found: BTreeMap<Backend, Endpoint> = BTreeMap::new();
    for slice in slices {
        let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
        let slice_name = slice.metadata.name.as_deref().unwrap_or_default();
        let v4 = match slice.address_type.as_str() {
            "IPv4" => true,
            "IPv6" => false,
            _ => continue, // FQDN slices are not load-balanced (kube-proxy ignores them).
        };
        let port = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == want_name
                && Proto::parse(p.protocol.as_deref()) == Some(proto)
        });
        let Some(port) = port
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0)
        else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            let cond = ep.conditions.as_ref();
            // Unset `ready` means ready; unset `serving` means as `ready`.
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            let local = ep.node_name.as_deref() == Some(node.name.as_str());
            for value in &ep.addresses {
                let addr = match value.parse::<IpAddr>() {
                    Ok(a) if a.is_ipv4() == v4 => a,
                    _ => {
                        diagnostics.insert(ServiceDiagnostic::BadEndpoint {
                            namespace: ns.to_string(),
                            slice: slice_name.to_string(),
                            value: value.clone(),
                        });
                        continue;
                    }
                };
                if !node.cluster_addresses.contains(&addr)
                    && !node.external_backends.iter().any(|n| n.contains(&addr))
                {
                    diagnostics.insert(ServiceDiagnostic::ForeignEndpoint {
                        namespace: ns.to_string(),
                        slice: slice_name.to_string(),
                        addr,
                    });
                    continue;
                }
                let backend = Backend { addr, port, proto };
                let e = Endpoint {
                    backend,
                    local,
                    ready: ready && !terminating,
                    serving_terminating: serving && terminating,
                };
                found
                    .entry(backend)
                    .and_modify(|old| {
                        old.ready |= e.ready;
                        old.serving_terminating |= e.serving_terminating;
                        old.local |= e.local;
                    })
                    .or_insert(e);
            }
        }
    }
    found.into_values().collect()
}

/// The backends of a frontend of family `v4`: ready endpoints, else serving
/// terminating ones; only this node's when `local_only`. Local ones first.
/// Returns (backends, how many are local, whether they are the terminating fallback).
fn select(endpoints: &[Endpoint], v4: bool, local_only: bool) -> (Vec<Backend>, usize, bool) {
    let family = |e: &&Endpoint| e.backend.addr.is_ipv4() == v4 && (!local_only || e.local);
    let mut chosen: Vec<&Endpoint> = endpoints
        .iter()
        .filter(family)
        .filter(|e| e.ready)
        .collect();
    let fallback = chosen.is_empty();
    if fallback {
        chosen = endpoints
            .iter()
            .filter(family)
            .filter(|e| e.serving_terminating)
            .collect();
    }
    // Sorted by backend within each group: the input is a BTreeMap's values.
    let mut backends: Vec<Backend> = chosen
        .iter()
        .filter(|e| e.local)
        .map(|e| e.backend)
        .collect();
    let local_count = backends.len();
    backends.extend(chosen.iter().filter(|e| !e.local).map(|e| e.backend));
    let fallback = fallback && !backends.is_empty();
    (backends, local_count, fallback)
}

/// The Maglev table size for `n` backends: the smallest of [`MAGLEV_SIZES`] at
/// least 100 × n, or the largest.
pub fn maglev_size(n: usize) -> u32 {
    MAGLEV_SIZES
        .iter()
        .copied()
        .find(|&m| m as usize >= n.saturating_mul(100))
        .unwrap_or(MAGLEV_SIZES[MAGLEV_SIZES.len() - 1])
}

/// Maglev consistent hashing (Eisenbud et al., NSDI 2016): a table of
/// [`maglev_size`] slots, each an index into `backends`, filled by every
/// backend in turn along its own permutation of the slots. Removing one backend
/// moves only about its share of slots, and the table depends on the backend
/// *set* alone (not on its order or on which node computes it): the hash is
/// FNV-1a over the backend's address, port and protocol, fixed forever because
/// nodes running different versions must agree.
pub fn maglev_table(backends: &[Backend]) -> Vec<u32> {
    if backends.is_empty() {
        return Vec::new();
    }
    // Permutations are computed over the sorted set so the table is a function of the set.
    let mut order: Vec<(Backend, u32)> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| (*b, i as u32))
        .collect();
    order.sort();
    order.dedup_by_key(|(b, _)| *b);
    let m = u64::from(maglev_size(order.len()));
    let perms: Vec<(u64, u64)> = order
        .iter()
        .map(|(b, _)| {
            let key = backend_bytes(b);
            let offset = fnv1a(0x6d61_676c_6576_3031, &key) % m;
            let skip = fnv1a(0x6d61_676c_6576_3032, &key) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; order.len()];
    let mut table = vec![u32::MAX; m as usize];
    let mut filled = 0u64;
    'fill: loop {
        for (i, &(offset, skip)) in perms.iter().enumerate() {
            let mut slot = (offset + next[i] * skip) % m;
            while table[slot as usize] != u32::MAX {
                next[i] += 1;
                slot = (offset + next[i] * skip) % m;
            }
            table[slot as usize] = order[i].1;
            next[i] += 1;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    table
}

fn backend_bytes(b: &Backend) -> Vec<u8> {
    let mut key = match b.addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    key.extend_from_slice(&b.port.to_be_bytes());
    key.push(b.proto.number());
    key
}

/// 64-bit FNV-1a, seeded by hashing the seed's bytes first, then the splitmix64
/// finalizer: FNV alone leaves keys that differ in their last byte (consecutive
/// pod addresses) close together, and offset and skip must look independent.
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in seed.to_le_bytes().iter().chain(bytes) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Every address a Service backend may have: the pods' (FabricIP claims)
/// and the nodes' (status addresses, the agents' address annotation, and
/// this node's own), for [`NodeView::cluster_addresses`].
pub fn cluster_addresses(
    nodes: &[k8s_openapi::api::core::v1::Node],
    fabric_ips: &[impl Borrow<cozyplane_api::FabricIP>],
    own: &[IpAddr],
) -> BTreeSet<IpAddr> {
    let mut out: BTreeSet<IpAddr> = own.iter().copied().collect();
    out.extend(
        fabric_ips
            .iter()
            .filter_map(|f| crate::ipam::claim_address(f.borrow())),
    );
    for node in nodes {
        out.extend(node_addresses(node));
    }
    out
}

/// A node's addresses: its status addresses and the agents' address
/// annotation.
pub fn node_addresses(node: &k8s_openapi::api::core::v1::Node) -> Vec<IpAddr> {
    let status = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(cozyplane_api::labels::ANNOTATION_NODE_ADDRESSES));
    status
        .into_iter()
        .flatten()
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .chain(
            annotated
                .into_iter()
                .flat_map(|v| v.split(','))
                .filter_map(|a| a.trim().parse::<IpAddr>().ok()),
        )
        .collect()
}

/// The service maps' desired state: the inside-scope frontends for the
/// socket-level load balancer, and the wire-scope ones (NodePort,
/// LoadBalancer and externalIP traffic from outside, with their Maglev
/// tables) for the per-packet one (`bpf/lb.h`), of both families.
pub fn to_desired(tables: &ServiceTables) -> cozyplane_datapath::service::SvcDesired {
    tables
        .frontends
        .iter()
        .map(|(k, f)| desired_frontend(k, f))
        .collect()
}

/// A frontend's key in `cp_svc`.
pub fn svc_key(k: &FrontendKey) -> cozyplane_datapath::abi::SvcKey {
    use cozyplane_datapath::abi::{SvcKey, SVC_SCOPE_EXTERNAL, SVC_SCOPE_INTERNAL};
    let scope = match k.scope {
        Scope::Internal => SVC_SCOPE_INTERNAL,
        Scope::External => SVC_SCOPE_EXTERNAL,
    };
    SvcKey::new(k.net, k.addr, k.port, k.proto.number(), scope)
}

/// One frontend as the service maps hold it ([`to_desired`]).
pub fn desired_frontend(
    k: &FrontendKey,
    f: &Frontend,
) -> (
    cozyplane_datapath::abi::SvcKey,
    cozyplane_datapath::service::DesiredFrontend,
) {
    use cozyplane_datapath::abi::{
        Backend as AbiBackend, BACKEND_F_LOCAL, BACKEND_F_TERMINATING, SVC_F_AFFINITY,
    };
    use cozyplane_datapath::service::DesiredFrontend;
    let proto = k.proto.number();
    let backends = f
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut flags = 0;
            if i < f.local_count {
                flags |= BACKEND_F_LOCAL;
            }
            if f.terminating_fallback {
                flags |= BACKEND_F_TERMINATING;
            }
            AbiBackend::new(k.net, b.addr, b.port, proto, flags)
        })
        .collect();
    (
        svc_key(k),
        DesiredFrontend {
            addr: AbiBackend::new(k.net, k.addr, k.port, proto, 0),
            backends,
            local_count: u32::try_from(f.local_count).unwrap_or(u32::MAX),
            maglev: f.maglev.clone(),
            source_ranges: f
                .source_ranges
                .iter()
                .map(|n| (n.addr(), n.prefix_len()))
                .collect(),
            affinity_s: f.affinity_timeout_s.unwrap_or(0),
            flags: if f.affinity_timeout_s.is_some() {
                SVC_F_AFFINITY
            } else {
                0
            },
        },
    )
}

mod health;
mod index;
pub use health::{health_checks, HealthCheck};
pub use index::{ServiceIndex, SvcObjectKind};

#[cfg(test)]
mod tests;

//! Watch → compile → sync for the overlay maps.
//!
//! Nodes and FabricIPs are mirrored by kube-runtime reflectors. Every event
//! only *signals* the sync loop ([`Notify`] keeps one pending permit, so no
//! event is lost and a burst costs one sync); the loop waits a short
//! debounce, compiles the topology from the whole cache and diff-syncs
//! `vteps`, `remotes`, `node_remotes`, the VPC maps and the SecurityGroup maps
//! against the maps themselves (the maps this sync owns whole, against a
//! mirror of their last converged state between full syncs at most 30 s
//! apart: [`OverlayMirrors`]).
//! Compiling from scratch on every pass means a missed or reordered event
//! cannot leave a stale entry behind. A sync that does not converge is
//! retried.
//!
//! The cache is fine here (unlike for IPAM, docs/lessons.md #28): a lagging
//! remote entry only delays reachability, it never hands out an address.
//!
//! SecurityGroups are the exception to compiling from the stores: the VPC,
//! SecurityGroup, Port and Pod events also update the SecurityGroup index
//! as they arrive (`sg_watch.rs`), so a compile reads compact records
//! instead of parsing every Port again; a relist reconciles the index like
//! the stores.
//!
//! Services go further (`svc_watch.rs`, `compile/services/index.rs`): the
//! Service and EndpointSlice events mark the Services they touch dirty, a
//! pass recompiles only those, and the service maps' sync visits only the
//! frontends whose desired state changed, trusting its mirror of the maps
//! (`cozyplane_datapath::service`): at 10k Services a full compile and diff
//! cost hundreds of milliseconds, a backend change a few. A missed event
//! cannot leave a stale entry for long there either: a relist reconciles
//! the index, and any failed map write makes the next sync a full one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};
use cozyplane_api::{FabricIP, HostFirewall, Port, SecurityGroup, VPCPeering, VPC};
use cozyplane_errors::Chain;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{watch, Notify};

use super::events::ServiceWarning;
use super::kernel::SharedDatapath;
use super::plumber::NetlinkPlumber;
use super::sg_watch::{index_events, SharedSgIndex};
use super::svc_watch::SharedServiceIndex;
use crate::compile::netpol::{compile_groups, MemberCache, NpDiagnostic, NpHosts, PolicyInput};
use crate::compile::security_groups::{SgDiagnostic, SgIndex};
use crate::compile::services::{
    cluster_addresses, health_checks, NodeView, ServiceDiagnostic, ServiceIndex,
};
use crate::compile::vpc::{compile_vpcs, VpcTopology};
use crate::compile::{compile, Diagnostic};
use crate::desired::{RemoteKey, TunnelEndpoint, VtepOwner, NET_DEFAULT};
use crate::sync::{sync, Mirror};
use cozyplane_datapath::abi::VNI_DEFAULT;

/// Counters of the sync loop, for /metrics (`runtime::metrics`).
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Completed syncs.
    pub syncs: Counter,
    /// Syncs that left failures (retried).
    pub failed_syncs: Counter,
    /// Entries written or removed in total.
    pub changes: Counter,
    /// Diagnostics of the last compile.
    pub diagnostics: Gauge,
    /// Addresses several nodes reported in the last compile.
    pub address_conflicts: Gauge,
    /// VPC endpoints severed because their Port was deleted.
    pub severed: Counter,
    /// The conflicts last logged, so a standing conflict is logged once, not
    /// on every sync.
    logged_conflicts: Mutex<Vec<Diagnostic>>,
    /// The VPCs served (network id → namespace, name), for metering.
    vpc_names: Mutex<BTreeMap<u32, (String, String)>>,
    /// What the last SecurityGroup compile skipped.
    pub sg_diagnostics: Gauge,
    /// What the last NetworkPolicy compile narrowed (fail closed).
    pub np_diagnostics: Gauge,
    /// NetworkPolicy identities of the last compile.
    pub np_identities: Gauge,
    /// The NetworkPolicy diagnostics last logged (each logged once).
    logged_np: Mutex<Vec<NpDiagnostic>>,
    /// The SecurityGroup diagnostics last logged (each logged once).
    logged_sg: Mutex<Vec<SgDiagnostic>>,
    /// The VPC compile's diagnostics last logged.
    logged_vpc: Mutex<Vec<crate::compile::vpc::VpcDiagnostic>>,
    /// What the last Services compile skipped (foreign or malformed endpoints,
    /// bad Service fields).
    pub service_diagnostics: Gauge,
    /// Frontends the last sync could not program (the slots are full).
    pub service_unfitted: Gauge,
    /// The Services diagnostics last logged (each logged once while it stands).
    logged_services: Mutex<Vec<ServiceDiagnostic>>,
    /// The Services with a frontend the last sync could not program.
    unfitted_services: Mutex<BTreeSet<(String, String)>>,
    /// Warnings to record as Events (runtime/events.rs).
    service_warnings: Mutex<Vec<ServiceWarning>>,
}

impl SyncStats {
    /// Adds the counters to `registry` (counters get `_total` when encoded).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cozyplane_syncs",
            "Overlay map syncs run",
            self.syncs.clone(),
        );
        registry.register(
            "cozyplane_sync_failures",
            "Overlay map syncs that did not converge",
            self.failed_syncs.clone(),
        );
        registry.register(
            "cozyplane_sync_changes",
            "Overlay map entries written or removed",
            self.changes.clone(),
        );
        registry.register(
            "cozyplane_vpc_severed",
            "VPC endpoints cut off because their Port was deleted (binding revoked)",
            self.severed.clone(),
        );
        registry.register(
            "cozyplane_compile_diagnostics",
            "Objects the last compile skipped",
            self.diagnostics.clone(),
        );
        registry.register(
            "cozyplane_security_group_diagnostics",
            "Rules, groups and Ports the last SecurityGroup compile skipped (fail closed)",
            self.sg_diagnostics.clone(),
        );
        registry.register(
            "cozyplane_network_policy_diagnostics",
            "NetworkPolicy peers, ports and selectors the last compile could not use as written (enforced fail closed)",
            self.np_diagnostics.clone(),
        );
        registry.register(
            "cozyplane_network_policy_identities",
            "Distinct NetworkPolicy identities (namespace, labels, named ports) of the last compile",
            self.np_identities.clone(),
        );
        registry.register(
            "cozyplane_service_diagnostics",
            "Service fields and endpoints the last Services compile ignored (e.g. an endpoint that is no pod or node address)",
            self.service_diagnostics.clone(),
        );
        registry.register(
            "cozyplane_service_unfitted_frontends",
            "Service frontends left unprogrammed because the backend slots are full",
            self.service_unfitted.clone(),
        );
        registry.register(
            "cozyplane_node_address_conflicts",
            "Addresses several nodes report (status beats annotation; otherwise routed to none)",
            self.address_conflicts.clone(),
        );
    }

    /// Records the last compile's diagnostics: both gauges, a debug line for
    /// each, and a warning for each address conflict that was not already
    /// standing at the last compile. Returns the newly logged conflicts.
    pub fn record_diagnostics(&self, diagnostics: &[Diagnostic]) -> Vec<Diagnostic> {
        self.diagnostics
            .set(i64::try_from(diagnostics.len()).unwrap_or(i64::MAX));
        let conflicts: Vec<Diagnostic> = diagnostics
            .iter()
            .filter(|d| d.is_address_conflict())
            .cloned()
            .collect();
        self.address_conflicts
            .set(i64::try_from(conflicts.len()).unwrap_or(i64::MAX));
        for d in diagnostics.iter().filter(|d| !d.is_address_conflict()) {
            tracing::debug!(diagnostic = %d, "compile skipped an object");
        }
        let mut logged = self
            .logged_conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let new: Vec<Diagnostic> = conflicts
            .iter()
            .filter(|d| !logged.contains(d))
            .cloned()
            .collect();
        for d in &new {
            tracing::warn!(conflict = %d, "nodes report the same address");
        }
        *logged = conflicts;
        new
    }
}

impl SyncStats {
    /// Keeps the served VPCs' names and logs new VPC diagnostics once.
    pub fn record_vpcs(&self, vpc: &VpcTopology) {
        *self.vpc_names.lock().unwrap_or_else(|p| p.into_inner()) = vpc.names.clone();
        let mut logged = self.logged_vpc.lock().unwrap_or_else(|p| p.into_inner());
        for d in vpc.diagnostics.iter().filter(|d| !logged.contains(d)) {
            tracing::warn!(diagnostic = %d, "VPC compile skipped an object");
        }
        *logged = vpc.diagnostics.clone();
    }

    /// Counts the SecurityGroup compile's diagnostics and logs new ones once.
    pub fn record_security_groups(&self, diagnostics: &[SgDiagnostic]) {
        self.sg_diagnostics
            .set(i64::try_from(diagnostics.len()).unwrap_or(i64::MAX));
        let mut logged = self.logged_sg.lock().unwrap_or_else(|p| p.into_inner());
        for d in diagnostics.iter().filter(|d| !logged.contains(d)) {
            tracing::warn!(diagnostic = %d, "SecurityGroup compile skipped an object");
        }
        *logged = diagnostics.to_vec();
    }

    /// Counts the policy compile's diagnostics; logs each new one once and
    /// queues a Warning Event on its object.
    pub fn record_network_policies(
        &self,
        diagnostics: &[NpDiagnostic],
        identities: usize,
        node: &str,
    ) {
        self.np_diagnostics
            .set(i64::try_from(diagnostics.len()).unwrap_or(i64::MAX));
        self.np_identities
            .set(i64::try_from(identities).unwrap_or(i64::MAX));
        let mut logged = self.logged_np.lock().unwrap_or_else(|p| p.into_inner());
        let mut warnings = self
            .service_warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for d in diagnostics.iter().filter(|d| !logged.contains(d)) {
            tracing::warn!(diagnostic = %d, "policy not enforced as written");
            warnings.push(super::events::Warning::policy(d, node));
        }
        *logged = diagnostics.to_vec();
    }

    /// Records which Services have frontends the last sync could not program
    /// (`unfitted`: Service → its frontends, displayed), and queues a Warning
    /// for each that was not in that state after the sync before.
    pub fn record_unfitted(
        &self,
        unfitted: BTreeMap<(String, String), (Service, Vec<String>)>,
        node: &str,
    ) {
        let mut last = self
            .unfitted_services
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut warnings = self
            .service_warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (name, (svc, frontends)) in &unfitted {
            if !last.contains(name) {
                let w = ServiceWarning::unfitted(svc, frontends, node);
                tracing::warn!(service = %format!("{}/{}", name.0, name.1), message = %w.message, "Service not programmed");
                warnings.push(w);
            }
        }
        *last = unfitted.into_keys().collect();
    }

    /// The Warnings queued since the last call.
    pub fn take_service_warnings(&self) -> Vec<ServiceWarning> {
        std::mem::take(
            &mut *self
                .service_warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Records the Services compile's diagnostics: the gauge, and a warning
    /// for each one that was not standing at the last compile.
    pub fn record_services(&self, diagnostics: &[ServiceDiagnostic]) {
        self.service_diagnostics
            .set(i64::try_from(diagnostics.len()).unwrap_or(i64::MAX));
        let mut logged = self
            .logged_services
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for d in diagnostics.iter().filter(|d| !logged.contains(d)) {
            tracing::warn!(diagnostic = %d, "Service skipped in part");
        }
        *logged = diagnostics.to_vec();
    }

    /// The VPCs last served: network id → (namespace, name).
    pub fn vpc_names(&self) -> BTreeMap<u32, (String, String)> {
        self.vpc_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What the sync loop needs about this node.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// This node's name.
    pub node: String,
    /// This node's tunnel endpoint.
    pub endpoint: TunnelEndpoint,
    /// This node's own addresses: pod → own node traffic is encapsulated to
    /// the node's own endpoint like any other (docs/datapath.md).
    pub own_addresses: Vec<IpAddr>,
    /// Coalescing delay after an event.
    pub debounce: Duration,
    /// Service load balancing (`None`: kube-proxy replacement is off and the
    /// service maps are kept empty).
    pub services: Option<ServiceOptions>,
    /// The pod network (`--cluster-cidr`): Cilium's `cluster` and `world`.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    /// The API server this agent talks to (its kubeconfig's, when an
    /// address): the host firewall always admits it, like the `kubernetes`
    /// Service's endpoints.
    pub apiserver_addresses: Vec<IpAddr>,
    /// Where the watch of this node's pods is handed to the CNI handler's
    /// VPC directory (tenancy/directory.rs).
    pub node_pods: crate::tenancy::directory::NodePods,
    /// The CNI ADDs' policy barrier (barrier.rs): handed the stores, told
    /// when syncs start and complete.
    pub barrier: super::barrier::PolicyBarrier,
}

/// How this agent load-balances Services.
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// `--service-proxy-name`.
    pub proxy_name: Option<String>,
    /// `--service-external-backends`.
    pub external_backends: Vec<ipnet::IpNet>,
}

/// Why the watches and the sync loop stopped (they never stop otherwise).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The Node watch stream ended.
    #[error("the node watch ended")]
    NodeWatchEnded,
    /// The FabricIP watch stream ended.
    #[error("the FabricIP watch ended")]
    FabricIpWatchEnded,
    /// The VPC watch stream ended.
    #[error("the VPC watch ended")]
    VpcWatchEnded,
    /// The Port watch stream ended.
    #[error("the Port watch ended")]
    PortWatchEnded,
    /// The VPCPeering watch stream ended.
    #[error("the VPCPeering watch ended")]
    PeeringWatchEnded,
    /// The SecurityGroup watch stream ended.
    #[error("the SecurityGroup watch ended")]
    SecurityGroupWatchEnded,
    /// The watch of this node's pods ended.
    #[error("the Pod watch ended")]
    PodWatchEnded,
    /// The Service watch stream ended.
    #[error("the Service watch ended")]
    ServiceWatchEnded,
    /// The EndpointSlice watch stream ended.
    #[error("the EndpointSlice watch ended")]
    EndpointSliceWatchEnded,
    /// The NetworkPolicy watch stream ended.
    #[error("the NetworkPolicy watch ended")]
    NetworkPolicyWatchEnded,
    /// The Namespace watch stream ended.
    #[error("the Namespace watch ended")]
    NamespaceWatchEnded,
    /// The HostFirewall watch stream ended.
    #[error("the HostFirewall watch ended")]
    HostFirewallWatchEnded,
    /// A Cilium policy watch stream ended.
    #[error("a Cilium policy watch ended")]
    CiliumPolicyWatchEnded,
    /// The reflector stores were dropped before they became ready.
    #[error("the reflector stores were dropped")]
    StoresDropped,
}

/// Mirrors every `K` into a reflector store and hands each event to
/// `on_event` (the SecurityGroup index's, `sg_watch.rs`); each event (or
/// error) pokes `notify`. The future ends only if the watch stream does.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    notify: Arc<Notify>,
    what: &'static str,
    mut on_event: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> (reflector::Store<K>, impl std::future::Future<Output = ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .for_each(move |ev| {
            match ev {
                Ok(ev) => on_event(&ev),
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), kind = what, "watch error (retrying)");
                }
            }
            notify.notify_one();
            futures::future::ready(())
        });
    (store, stream)
}

fn snapshot<K>(store: &reflector::Store<K>) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// Runs the watches and the sync loop until a watch stream ends; `ready`
/// turns true after the first converged sync, frontends that did not fit the
/// service slots aside (they are reported and retried, and must not keep a
/// node from serving everything else: one tenant's oversized Service would
/// otherwise hold back a restarted agent's CNI config).
pub async fn run(
    client: Client,
    dp: SharedDatapath,
    plumber: NetlinkPlumber,
    cfg: SyncConfig,
    stats: Arc<SyncStats>,
    ready: watch::Sender<bool>,
) -> Result<(), WatchError> {
    // the sync loop's wake-up, shared with the CNI ADDs that wait for it
    let notify = cfg.barrier.notify();
    let all = watcher::Config::default;
    // the SecurityGroup compile's input, kept by the watches (sg_watch.rs)
    let sg_index = SharedSgIndex::default();
    let (nodes, node_stream) = reflect(
        Api::<Node>::all(client.clone()),
        all(),
        notify.clone(),
        "Node",
        |_| {},
    );
    let (fips, fip_stream) = reflect(
        Api::<FabricIP>::all(client.clone()),
        all(),
        notify.clone(),
        "FabricIP",
        |_| {},
    );
    let (vpcs, vpc_stream) = reflect(
        Api::<VPC>::all(client.clone()),
        all(),
        notify.clone(),
        "VPC",
        index_events::<VPC, _>(sg_index.clone()),
    );
    let (ports, port_stream) = reflect(
        Api::<Port>::all(client.clone()),
        all(),
        notify.clone(),
        "Port",
        index_events::<Port, _>(sg_index.clone()),
    );
    let (peerings, peering_stream) = reflect(
        Api::<VPCPeering>::all(client.clone()),
        all(),
        notify.clone(),
        "VPCPeering",
        |_| {},
    );
    let (groups, group_stream) = reflect(
        Api::<SecurityGroup>::all(client.clone()),
        all(),
        notify.clone(),
        "SecurityGroup",
        index_events::<SecurityGroup, _>(sg_index.clone()),
    );
    // Only this node's pods: their labels, for the Port snapshots (labels.rs).
    let (pods, pod_stream) = reflect(
        Api::<Pod>::all(client.clone()),
        all().fields(&format!("spec.nodeName={}", cfg.node)),
        notify.clone(),
        "Pod",
        index_events::<Pod, _>(sg_index.clone()),
    );
    cfg.node_pods.set(pods.clone());

    // The Services compile's input, kept by the watches (svc_watch.rs).
    let svc_index = SharedServiceIndex::default();
    let (services, service_stream) = reflect(
        Api::<Service>::all(client.clone()),
        all(),
        notify.clone(),
        "Service",
        index_events::<Service, _>(svc_index.clone()),
    );
    let (slices, slice_stream) = reflect(
        Api::<EndpointSlice>::all(client.clone()),
        all(),
        notify.clone(),
        "EndpointSlice",
        index_events::<EndpointSlice, _>(svc_index.clone()),
    );

    // NetworkPolicy's input: the policies and the namespaces' labels; pods
    // are known by their address claims' snapshots (compile/netpol.rs).
    let (policies, policy_stream) = reflect(
        Api::<NetworkPolicy>::all(client.clone()),
        all(),
        notify.clone(),
        "NetworkPolicy",
        |_| {},
    );
    let (namespaces, namespace_stream) = reflect(
        Api::<Namespace>::all(client.clone()),
        all(),
        notify.clone(),
        "Namespace",
        |_| {},
    );

    // The node's own firewall (compile/netpol/hostfw.rs).
    let (firewalls, firewall_stream) = reflect(
        Api::<HostFirewall>::all(client.clone()),
        all(),
        notify.clone(),
        "HostFirewall",
        |_| {},
    );
    // The Cilium policy subset (compile/netpol/cilium.rs), when the server
    // serves its kinds (Cozystack installs the CRDs; a cluster without them
    // has no such policies to enforce).
    let cilium = serves_cilium(&client).await;
    let (cnps, cnp_stream) = reflect(
        Api::<CiliumNetworkPolicy>::all(client.clone()),
        all(),
        notify.clone(),
        "CiliumNetworkPolicy",
        |_| {},
    );
    let (ccnps, ccnp_stream) = reflect(
        Api::<CiliumClusterwideNetworkPolicy>::all(client.clone()),
        all(),
        notify.clone(),
        "CiliumClusterwideNetworkPolicy",
        |_| {},
    );
    cfg.barrier.set_stores(super::barrier::Stores {
        fabric_ips: fips.clone(),
        ports: ports.clone(),
        pods: pods.clone(),
        policies: policies.clone(),
        groups: groups.clone(),
        cilium: cilium.then(|| (cnps.clone(), ccnps.clone())),
    });
    let (cnp_stream, ccnp_stream): (BoxedWatch, BoxedWatch) = if cilium {
        (Box::pin(cnp_stream), Box::pin(ccnp_stream))
    } else {
        tracing::info!("the API server serves no cilium.io/v2 policies: none are enforced (restart the agent after installing the CRDs)");
        (
            Box::pin(futures::future::pending()),
            Box::pin(futures::future::pending()),
        )
    };

    // NetworkPolicy members parsed from the claims' snapshots, across passes
    let np_members = Mutex::new(MemberCache::default());
    let mirrors = Mutex::new(OverlayMirrors::default());
    let sync_loop = async {
        if cilium {
            for ready in [
                cnps.wait_until_ready().await,
                ccnps.wait_until_ready().await,
            ] {
                if ready.is_err() {
                    return;
                }
            }
        }
        for ready in [
            firewalls.wait_until_ready().await,
            policies.wait_until_ready().await,
            namespaces.wait_until_ready().await,
            services.wait_until_ready().await,
            slices.wait_until_ready().await,
            nodes.wait_until_ready().await,
            fips.wait_until_ready().await,
            vpcs.wait_until_ready().await,
            ports.wait_until_ready().await,
            peerings.wait_until_ready().await,
            groups.wait_until_ready().await,
            pods.wait_until_ready().await,
        ] {
            if ready.is_err() {
                return;
            }
        }
        // healthCheckNodePort servers (health_ports.rs), following the Services.
        let mut health = super::health_ports::HealthPorts::default();
        loop {
            let started = cfg.barrier.sync_started();
            let started_at = std::time::Instant::now();
            // the claims and pods as their stores share them (the
            // NetworkPolicy members see which changed), and copies of the
            // same objects for the rest
            let (shared_fabric_ips, shared_pods) = (fips.state(), pods.state());
            let objects = Objects {
                nodes: snapshot(&nodes),
                vpcs: snapshot(&vpcs),
                ports: snapshot(&ports),
                peerings: snapshot(&peerings),
                pods: shared_pods.iter().map(|o| (**o).clone()).collect(),
                shared_fabric_ips,
                shared_pods,
                policies: snapshot(&policies),
                namespaces: snapshot(&namespaces),
                cilium: if cilium { snapshot(&cnps) } else { Vec::new() },
                cilium_clusterwide: if cilium { snapshot(&ccnps) } else { Vec::new() },
                host_firewalls: snapshot(&firewalls),
            };
            let pass_started = std::time::Instant::now();
            let pass = sync_once(
                &dp,
                &cfg,
                &objects,
                &mirrors,
                &sg_index,
                &svc_index,
                &np_members,
                &stats,
            );
            let compute = pass_started.elapsed();
            tracing::debug!(
                snapshot_us = pass_started.duration_since(started_at).as_micros() as u64,
                sync_us = compute.as_micros() as u64,
                fabric_ips = objects.shared_fabric_ips.len(),
                "sync pass"
            );
            let mut converged = pass.converged;
            cfg.barrier.sync_completed(started);
            for w in stats.take_service_warnings() {
                super::events::record(&client, &cfg.node, &w).await;
            }
            let checks = match &cfg.services {
                Some(opts) => {
                    let view = NodeView {
                        name: cfg.node.clone(),
                        proxy_name: opts.proxy_name.clone(),
                        ..NodeView::default()
                    };
                    let index = svc_index.lock().unwrap_or_else(|p| p.into_inner());
                    health_checks(index.services(), index.slices(), &view)
                }
                None => Default::default(),
            };
            health.sync(&checks);
            converged &= health.unbound.is_empty();
            let stale = super::labels::stale_snapshots(&objects.ports, &objects.pods, &cfg.node);
            if !stale.is_empty() {
                let written = super::labels::refresh(&client, &stale).await;
                tracing::info!(
                    written,
                    stale = stale.len(),
                    "pod-label snapshots refreshed"
                );
                converged &= written == stale.len();
            }
            let stale = super::labels::stale_fabric_snapshots(
                &objects.shared_fabric_ips,
                &objects.pods,
                &cfg.node,
            );
            if !stale.is_empty() {
                let written = super::labels::refresh_fabric(&client, &stale).await;
                tracing::debug!(
                    written,
                    stale = stale.len(),
                    "pod snapshots of address claims refreshed"
                );
                converged &= written == stale.len();
            }
            // Revocation: pods whose Port is gone are cut off (sever.rs).
            let cut =
                super::sever::sever_unclaimed(&client, &dp, &plumber, &objects.ports, &cfg.node)
                    .await;
            if cut > 0 {
                stats.severed.inc_by(cut as u64);
                converged = false; // look again soon: more may follow
            }
            if converged {
                ready.send_replace(true);
            }
            if converged && !pass.unfitted {
                notify.notified().await;
            } else {
                // Retry even without a new event.
                let _ = tokio::time::timeout(Duration::from_secs(1), notify.notified()).await;
            }
            // An ADD waiting for its policy is not kept waiting for more events.
            cfg.barrier.debounce(pace(cfg.debounce, compute)).await;
        }
    };

    tokio::select! {
        () = node_stream => Err(WatchError::NodeWatchEnded),
        () = fip_stream => Err(WatchError::FabricIpWatchEnded),
        () = vpc_stream => Err(WatchError::VpcWatchEnded),
        () = port_stream => Err(WatchError::PortWatchEnded),
        () = peering_stream => Err(WatchError::PeeringWatchEnded),
        () = group_stream => Err(WatchError::SecurityGroupWatchEnded),
        () = pod_stream => Err(WatchError::PodWatchEnded),
        () = service_stream => Err(WatchError::ServiceWatchEnded),
        () = slice_stream => Err(WatchError::EndpointSliceWatchEnded),
        () = policy_stream => Err(WatchError::NetworkPolicyWatchEnded),
        () = namespace_stream => Err(WatchError::NamespaceWatchEnded),
        () = firewall_stream => Err(WatchError::HostFirewallWatchEnded),
        () = cnp_stream => Err(WatchError::CiliumPolicyWatchEnded),
        () = ccnp_stream => Err(WatchError::CiliumPolicyWatchEnded),
        () = sync_loop => Err(WatchError::StoresDropped),
    }
}

/// The most a pass's cost stretches the debounce after it.
const MAX_PACE: Duration = Duration::from_millis(500);

/// The debounce after a pass whose compile and sync took `compute`: at least
/// `debounce`, and twice the pass, so the loop takes at most a third of a
/// CPU however large the cluster and however fast its claims change (every
/// pod started anywhere is an event on every node), capped at
/// [`MAX_PACE`]. An ADD waiting for its policy still cuts it short.
fn pace(debounce: Duration, compute: Duration) -> Duration {
    debounce.max(compute.saturating_mul(2).min(MAX_PACE))
}

/// The watched objects one sync compiles (SecurityGroups and Services are
/// compiled from the indexes the watches keep instead: [`SgIndex`],
/// [`ServiceIndex`]).
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// Every Node.
    pub nodes: Vec<Node>,
    /// Every VPC.
    pub vpcs: Vec<VPC>,
    /// Every Port.
    pub ports: Vec<Port>,
    /// Every VPCPeering half.
    pub peerings: Vec<VPCPeering>,
    /// This node's pods (their live labels; other nodes' pods are known by
    /// their Ports' label snapshots).
    pub pods: Vec<Pod>,
    /// Every FabricIP, as the store shares them (a pass copies none: at
    /// 5 000 claims the copies cost milliseconds per pass).
    pub shared_fabric_ips: Vec<Arc<FabricIP>>,
    /// The same pods, as the store shares them.
    pub shared_pods: Vec<Arc<Pod>>,
    /// Every NetworkPolicy.
    pub policies: Vec<NetworkPolicy>,
    /// Every Namespace (their labels, for namespaceSelectors).
    pub namespaces: Vec<Namespace>,
    /// Every CiliumNetworkPolicy (empty when the server has no such kind).
    pub cilium: Vec<CiliumNetworkPolicy>,
    /// Every CiliumClusterwideNetworkPolicy (likewise).
    pub cilium_clusterwide: Vec<CiliumClusterwideNetworkPolicy>,
    /// Every HostFirewall.
    pub host_firewalls: Vec<HostFirewall>,
}

/// A watch future of either kind (a real one, or one that never ends).
type BoxedWatch = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Whether the API server serves the Cilium policy kinds.
pub(crate) async fn serves_cilium(client: &Client) -> bool {
    match client.list_api_group_resources("cilium.io/v2").await {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.name == "ciliumnetworkpolicies"),
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot tell whether cilium.io/v2 is served; assuming it is");
            true
        }
    }
}

/// The API server's addresses: the endpoints of `default/kubernetes`.
fn apiserver_addresses(index: &ServiceIndex) -> Vec<IpAddr> {
    index
        .slices()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some("default")
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::compile::services::LABEL_SERVICE_NAME))
                    .map(String::as_str)
                    == Some("kubernetes")
        })
        .flat_map(|s| {
            s.endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.iter())
        })
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// Records one map's sync outcome; false when it did not converge.
fn note<K: std::fmt::Debug, E: std::fmt::Debug + std::error::Error + 'static>(
    what: &str,
    outcome: Result<crate::sync::SyncReport<K, E>, crate::sync::ReadError<E>>,
    changes: &mut usize,
) -> bool {
    match outcome {
        Ok(r) => {
            *changes += r.inserted + r.replaced + r.removed;
            if !r.converged() {
                tracing::warn!(failures = ?r.failures, map = what, "sync incomplete");
                return false;
            }
            true
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), map = what, "sync failed");
            false
        }
    }
}

/// The mirrors of the overlay maps the sync owns whole
/// ([`crate::sync::Mirror`]), kept from one pass to the next.
#[derive(Debug, Default)]
pub struct OverlayMirrors {
    vnis: Mirror<u32, u32>,
    remotes: Mirror<RemoteKey, TunnelEndpoint>,
    peer_routes: Mirror<(u32, ipnet::IpNet), u32>,
    node_remotes: Mirror<IpAddr, TunnelEndpoint>,
}

/// What one [`sync_once`] left undone.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// Every map holds what was compiled, but for `unfitted`.
    pub converged: bool,
    /// Service frontends did not fit the slots: reported (Event, metric) and
    /// tried again by the next pass.
    pub unfitted: bool,
}

/// One compile + sync of the overlay maps.
#[allow(clippy::too_many_arguments)] // the pass's shared state, each owned by the loop
pub fn sync_once(
    dp: &SharedDatapath,
    cfg: &SyncConfig,
    objects: &Objects,
    mirrors: &Mutex<OverlayMirrors>,
    sg_index: &Mutex<SgIndex>,
    svc_index: &Mutex<ServiceIndex>,
    np_members: &Mutex<MemberCache>,
    stats: &SyncStats,
) -> Pass {
    let t0 = std::time::Instant::now();
    let topo = compile(&objects.nodes, &objects.shared_fabric_ips, &cfg.node);
    stats.record_diagnostics(&topo.diagnostics);
    let vpc = compile_vpcs(
        &objects.vpcs,
        &objects.ports,
        &objects.peerings,
        &topo.endpoints,
        &cfg.node,
    );
    stats.record_vpcs(&vpc);
    let t_compile = t0.elapsed();
    let mut node_remotes: BTreeMap<IpAddr, TunnelEndpoint> = topo.node_remotes;
    for a in &cfg.own_addresses {
        node_remotes.insert(*a, cfg.endpoint);
    }
    let mut remotes = topo.remotes;
    remotes.extend(vpc.remotes);
    let mut vnis = vpc.vnis;
    vnis.insert(VNI_DEFAULT, NET_DEFAULT);

    let mut converged = true;
    let mut unfitted = false;
    let mut changes = 0;
    // The senders from_overlay accepts, first: a joining node is trusted
    // before its pods become remotes (make before break). Never this node's
    // own endpoint, whatever the Node objects say; other writers' entries stay.
    let vteps: BTreeMap<TunnelEndpoint, VtepOwner> = topo
        .vteps
        .iter()
        .filter(|ep| **ep != cfg.endpoint)
        .map(|ep| (*ep, VtepOwner::Topology))
        .collect();
    converged &= note(
        "vteps",
        sync(&mut dp.vteps(), &vteps, |_, owner| {
            *owner == VtepOwner::Topology
        }),
        &mut changes,
    );
    // VNIs before the remotes of their networks (make before break).
    // The sync owns these four whole: each is written from its mirror
    // (only what changed since the last pass; the kernel's entries read
    // back every 30 s and after any failure, crate::sync::Mirror).
    let mut mirrors = mirrors.lock().unwrap_or_else(|p| p.into_inner());
    converged &= note(
        "vnis",
        mirrors.vnis.sync(&mut dp.vnis(), &vnis),
        &mut changes,
    );
    converged &= note(
        "remotes",
        mirrors.remotes.sync(&mut dp.remotes(), &remotes),
        &mut changes,
    );
    // Peer routes after the remotes they lead to.
    converged &= note(
        "peer_routes",
        mirrors
            .peer_routes
            .sync(&mut dp.peer_routes(), &vpc.peer_routes),
        &mut changes,
    );
    converged &= note(
        "node_remotes",
        mirrors
            .node_remotes
            .sync(&mut dp.node_remotes(), &node_remotes),
        &mut changes,
    );
    drop(mirrors);
    let t_overlay = t0.elapsed();
    // SecurityGroups: from the index the watches keep (this node's pods'
    // live labels, every other Port's label snapshot).
    let sg = sg_index.lock().unwrap_or_else(|p| p.into_inner()).compile();
    stats.record_security_groups(&sg.diagnostics);
    let outcome = dp.lock().sg.sync(&sg.desired);
    match outcome {
        Ok(r) => {
            changes += r.written + r.removed;
            if !r.converged() {
                tracing::warn!(failures = ?r.failures, map = "security_groups", "sync incomplete");
                converged = false;
            }
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), map = "security_groups", "sync failed");
            converged = false;
        }
    }
    // NetworkPolicy (default network): identities, isolation and rules for
    // this node's pods; the sync bumps the policy epoch when anything
    // changed, so every tracked flow is judged again (bpf/netpol.h).
    let t_sg = t0.elapsed();
    let np = {
        let mut cache = np_members.lock().unwrap_or_else(|p| p.into_inner());
        cache.update_shared(&objects.shared_fabric_ips, &objects.shared_pods, &cfg.node);
        let hosts = NpHosts {
            nodes: node_remotes.keys().copied().collect(),
            local_node: cfg.own_addresses.clone(),
            cluster_cidrs: cfg.cluster_cidrs.clone(),
            apiserver: {
                let mut v =
                    apiserver_addresses(&svc_index.lock().unwrap_or_else(|p| p.into_inner()));
                v.extend(cfg.apiserver_addresses.iter().copied());
                v
            },
            node_labels: objects
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(cfg.node.as_str()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default(),
        };
        let input = PolicyInput {
            network_policies: &objects.policies,
            cilium: &objects.cilium,
            cilium_clusterwide: &objects.cilium_clusterwide,
            host_firewalls: &objects.host_firewalls,
        };
        compile_groups(input, cache.groups(), &objects.namespaces, &hosts)
    };
    stats.record_network_policies(&np.diagnostics, np.identities, &cfg.node);
    let outcome = dp.lock().np.sync(&np.desired);
    match outcome {
        Ok(r) => {
            changes += r.written + r.removed;
            if !r.converged() {
                tracing::warn!(failures = ?r.failures, map = "network_policies", "sync incomplete");
                converged = false;
            }
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), map = "network_policies", "sync failed");
            converged = false;
        }
    }
    let t_np = t0.elapsed();
    // Services: the socket-LB's and the per-packet LB's maps (empty without
    // kube-proxy replacement), from the index: only the Services the watches
    // touched since the last sync are recompiled, and only the frontends
    // whose desired state changed are synced.
    let outcome = match &cfg.services {
        Some(opts) => {
            let view = NodeView {
                name: cfg.node.clone(),
                addresses: cfg.own_addresses.clone(),
                cluster_addresses: cluster_addresses(
                    &objects.nodes,
                    &objects.shared_fabric_ips,
                    &cfg.own_addresses,
                ),
                external_backends: opts.external_backends.clone(),
                proxy_name: opts.proxy_name.clone(),
            };
            let mut index = svc_index.lock().unwrap_or_else(|p| p.into_inner());
            index.set_view(view);
            index.compile();
            stats.record_services(&index.diagnostics());
            let changed = index.take_changes();
            let outcome = dp.lock().svc.sync_changes(index.desired(), &changed);
            if let Ok(r) = &outcome {
                let mut by_service: BTreeMap<(String, String), (Service, Vec<String>)> =
                    BTreeMap::new();
                for k in &r.unfitted {
                    if let Some((svc, key)) = index.owner(k) {
                        let name = (
                            svc.metadata.namespace.clone().unwrap_or_default(),
                            svc.metadata.name.clone().unwrap_or_default(),
                        );
                        by_service
                            .entry(name)
                            .or_insert_with(|| (svc.clone(), Vec::new()))
                            .1
                            .push(key.to_string());
                    }
                }
                stats.record_unfitted(by_service, &cfg.node);
            }
            outcome
        }
        None => dp
            .lock()
            .svc
            .sync_changes(&Default::default(), &Default::default()),
    };
    match outcome {
        Ok(r) => {
            changes +=
                r.frontends_written + r.frontends_removed + r.backends_written + r.backends_removed;
            stats
                .service_unfitted
                .set(i64::try_from(r.unfitted.len()).unwrap_or(i64::MAX));
            if !r.converged() {
                tracing::warn!(failures = ?r.failures, unfitted = r.unfitted.len(), map = "services", "sync incomplete");
                converged &= r.failures.is_empty();
                unfitted = !r.unfitted.is_empty();
            }
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), map = "services", "sync failed");
            converged = false;
        }
    }
    tracing::debug!(
        compile_us = t_compile.as_micros() as u64,
        overlay_us = t_overlay.as_micros() as u64,
        sg_us = t_sg.as_micros() as u64,
        np_us = t_np.as_micros() as u64,
        services_us = t0.elapsed().as_micros() as u64,
        "sync steps (cumulative)"
    );
    stats.syncs.inc();
    stats.changes.inc_by(changes as u64);
    if !converged || unfitted {
        stats.failed_syncs.inc();
    }
    if changes > 0 {
        tracing::info!(changes, "overlay maps synced");
    }
    Pass {
        converged,
        unfitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_pass_stretches_the_debounce_to_twice_its_cost_within_a_cap() {
        let ms = Duration::from_millis;
        assert_eq!(pace(ms(20), ms(2)), ms(20), "a cheap pass: the debounce");
        assert_eq!(pace(ms(20), ms(14)), ms(28));
        assert_eq!(pace(ms(20), ms(900)), MAX_PACE);
        assert_eq!(pace(ms(800), ms(900)), ms(800), "never below the debounce");
    }

    fn conflict(address: &str, kept: Option<&str>, dropped: &[&str]) -> Diagnostic {
        Diagnostic::AddressConflict {
            address: address.parse().unwrap(),
            kept: kept.map(str::to_string),
            dropped: dropped.iter().map(|d| (*d).to_string()).collect(),
        }
    }

    #[test]
    fn an_unfitted_service_is_warned_about_once_while_it_stays_unfitted() {
        let stats = SyncStats::default();
        let svc = |name: &str| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "shop", "name": name},
            }))
            .unwrap()
        };
        let unfitted = |names: &[&str]| {
            names
                .iter()
                .map(|n| {
                    (
                        ("shop".to_string(), n.to_string()),
                        (svc(n), vec!["10.96.0.10:80/TCP".to_string()]),
                    )
                })
                .collect::<BTreeMap<_, _>>()
        };
        let warned = |stats: &SyncStats| -> Vec<String> {
            stats
                .take_service_warnings()
                .into_iter()
                .map(|w| w.name)
                .collect()
        };
        stats.record_unfitted(unfitted(&["a"]), "n1");
        assert_eq!(warned(&stats), ["a"]);
        // the retries while it stays unfitted warn nothing new
        stats.record_unfitted(unfitted(&["a", "b"]), "n1");
        stats.record_unfitted(unfitted(&["a", "b"]), "n1");
        assert_eq!(warned(&stats), ["b"]);
        // fitted, then unfitted again: warned again
        stats.record_unfitted(unfitted(&["b"]), "n1");
        stats.record_unfitted(unfitted(&["a", "b"]), "n1");
        assert_eq!(warned(&stats), ["a"]);
    }

    #[test]
    fn address_conflicts_are_counted_and_each_logged_once_while_it_stands() {
        let stats = SyncStats::default();
        let hijack = conflict("192.168.1.2", Some("victim"), &["attacker"]);
        let shared = conflict("203.0.113.7", None, &["b", "c"]);
        let other = Diagnostic::NodeWithoutEndpoint { node: "d".into() };

        let logged = stats.record_diagnostics(&[hijack.clone(), other.clone()]);
        assert_eq!(logged, vec![hijack.clone()]);
        assert_eq!(stats.address_conflicts.get(), 1);
        assert_eq!(stats.diagnostics.get(), 2);
        // a standing conflict is not logged again on the next sync
        let logged = stats.record_diagnostics(&[hijack.clone(), shared.clone(), other]);
        assert_eq!(logged, vec![shared.clone()]);
        assert_eq!(stats.address_conflicts.get(), 2);
        // resolved, then back: logged again
        assert!(stats
            .record_diagnostics(std::slice::from_ref(&shared))
            .is_empty());
        assert_eq!(stats.address_conflicts.get(), 1);
        assert_eq!(
            stats.record_diagnostics(&[hijack.clone(), shared]),
            vec![hijack]
        );
    }
}

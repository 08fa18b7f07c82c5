//! The node agent process: wires the pure core (IPAM, compiler, sync, CNI
//! handler) to the kernel (datapath crate) and the API server (kube-rs).
//!
//! # Startup order, and why
//! 1. metrics listener (a bad address fails before anything is touched);
//! 2. bpffs, load + pin the object (compatible pins are reused, so a restart
//!    keeps every map);
//! 3. the VNIs of the local VPC pods' networks from their veth records
//!    ([`rebuild::seed_vnis`]), then the node's bring-up,
//!    [`cozyplane_datapath::node::bring_up`] (the one the benchmark and the
//!    overlay tests call too): sysctls, uplink, overlay device, pod-CIDR
//!    route + gateway neighbour, node maps, overlay and uplink programs
//!    (links are updated in place);
//! 4. rebuild per-pod state from the veth records ([`rebuild`]) — before
//!    the CNI socket exists, so no ADD or DEL races the prune;
//! 5. the CNI socket (the handler refuses ADD until ready);
//! 6. Node + FabricIP watches → compile → sync; ready after the first
//!    converged sync;
//! 7. the plugin binary (optional) and, last, the CNI conflist.
//!
//! Nothing in this sequence detaches or deletes what a previous agent left,
//! so killing and restarting the agent does not interrupt pod traffic: the
//! programs stay attached through their pinned links and the maps through
//! their pins while no agent runs.

pub mod args;
pub mod barrier;
pub mod error;
pub mod events;
pub mod health_ports;
pub mod http;
pub mod index_watch;
pub mod install;
pub mod kernel;
pub mod labels;
pub mod metrics;
pub mod node;
pub mod plumber;
pub mod rebuild;
pub mod record;
pub mod sever;
pub mod sg_watch;
pub mod svc_watch;
pub mod watch;

use std::net::IpAddr;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_datapath::netlink::NetnsHandle;
use cozyplane_datapath::node::bring_up;
use cozyplane_datapath::Datapath;
use cozyplane_errors::Chain;
use kube::Client;

pub use args::{AgentArgs, Masquerade, MasqueradeArg};
pub use error::{AgentError, TaskEnd};

use crate::cni_handler::{CniHandler, CniMetrics, HandlerConfig};
use crate::desired::TunnelEndpoint;
use crate::ipam::kube_store::KubeClaimStore;
use crate::ipam::{ClaimObject, ClaimStore, FabricIpam, NodeIndexed, Pools};
use crate::tenancy::directory::{KubeDirectory, NodePods};
use crate::tenancy::VpcAttach;
use cozyplane_api::{FabricIP, Port};
use kernel::SharedDatapath;
use plumber::NetlinkPlumber;

/// The CNI handler over the real implementations.
pub type Handler =
    CniHandler<FabricIpam<NodeIndexed<KubeClaimStore, FabricIP>>, NetlinkPlumber, SharedDatapath>;

/// Runs the agent until a fatal error; see the module docs.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let pools = Pools::parse(&args.cluster_cidr, &[]).map_err(|e| AgentError::InvalidArg {
        arg: "--cluster-cidr",
        reason: e.to_string(),
    })?;
    if args.node_name.is_empty() {
        return Err(AgentError::InvalidArg {
            arg: "--node-name",
            reason: "empty".into(),
        });
    }

    // 2. bpffs and the object
    node::ensure_bpffs(&args.bpffs)?;
    let pin_dir = args.pin_dir();
    let mut dp = Datapath::load(&pin_dir)?;
    if let Some(n) = args.service_slots {
        dp.svc.limit_slots(n)?;
        tracing::warn!(
            slots = n,
            "Services are placed in the first {n} slots only (--service-slots)"
        );
    }
    if !dp.replaced_pins().is_empty() {
        tracing::warn!(maps = ?dp.replaced_pins(), "incompatible pinned maps were replaced; rebuilding them");
    }
    let links_dir = pin_dir.join("links");
    std::fs::create_dir_all(&links_dir).map_err(|e| AgentError::io("create", &links_dir, e))?;
    let host = NetnsHandle::current()?;
    let shared = SharedDatapath::new(dp, links_dir, host.nl.clone())?;
    let stats = Arc::new(watch::SyncStats::default());
    let cni_metrics = CniMetrics::default();
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);

    // 1. metrics (bound now that there is a datapath to report on)
    let http = http::serve(
        args.metrics_bind,
        http::HttpState {
            dp: shared.clone(),
            metrics: Arc::new(metrics::AgentMetrics::new(&stats, &cni_metrics)),
            stats: stats.clone(),
            ready: ready_rx.clone(),
        },
    )
    .await?;
    let http_task = tokio::spawn(http);

    // 3. node networking, the local VPC pods' VNIs first (rebuild::seed_vnis)
    let plumber = NetlinkPlumber::new(NetnsHandle {
        netns: host.netns.try_clone()?,
        nl: host.nl.clone(),
    });
    let seeded = rebuild::seed_vnis(&plumber, &shared)
        .await
        .map_err(AgentError::Rebuild)?;
    if seeded > 0 {
        tracing::info!(seeded, "cp_vnis seeded from the VPC pods' records");
    }
    let spec = node::node_spec(&args, &pools, shared.links_dir())?;
    let net = bring_up(&host, &spec, || shared.lock()).await?;
    let node_ip = net.node_ip;
    tracing::info!(node = %args.node_name, %node_ip, uplink = %net.uplink.name, pod_mtu = net.pod_mtu, "node datapath set up");

    // Services: socket-level load balancing at --cgroup-root, or none at all
    // (an iptables kube-proxy then owns Services; PARAM_F_KERNEL_LOCAL is set
    // by bring-up). Links from an earlier run with the other setting go.
    let services = if args.kube_proxy_replacement {
        let external_backends =
            args.external_backends()
                .map_err(|reason| AgentError::InvalidArg {
                    arg: "--service-external-backends",
                    reason,
                })?;
        cozyplane_datapath::ensure_cgroup2(&args.cgroup_root)?;
        shared
            .lock()
            .attach_socket_lb(&args.cgroup_root, shared.links_dir())?;
        tracing::info!(cgroup = %args.cgroup_root.display(), "socket-level Service load balancing attached");
        Some(watch::ServiceOptions {
            proxy_name: args.service_proxy_name.clone(),
            external_backends,
        })
    } else {
        let n = cozyplane_datapath::detach_socket_lb(shared.links_dir())?;
        if n > 0 {
            tracing::info!(
                links = n,
                "socket-level Service load balancing detached (--kube-proxy-replacement=false)"
            );
        }
        None
    };
    // The node's own firewall (bpf/hostfw.h): attached always; without a
    // host policy its programs return at their first lookup.
    cozyplane_datapath::ensure_cgroup2(&args.cgroup_root)?;
    shared
        .lock()
        .attach_host_firewall(&args.cgroup_root, shared.links_dir())?;
    tracing::info!(cgroup = %args.cgroup_root.display(), "host firewall attached");

    // 4. rebuild
    let report = rebuild::rebuild(&plumber, &shared)
        .await
        .map_err(AgentError::Rebuild)?;
    if !report.failures.is_empty() {
        tracing::warn!(failures = %report.failures, "rebuild incomplete");
    }
    tracing::info!(?report, "local state rebuilt");

    // 5. the CNI socket
    let (client, apiserver_address) = kube_client(&args).await?;
    let cluster_cidrs = pools.clone();
    // A pod's claims are found by name from an index of this node's claims,
    // not by a label scan of the cluster's (ipam/node_index.rs); until the
    // index's first list succeeds, lookups are live lists.
    let fabric_claims = NodeIndexed::new(KubeClaimStore::new(client.clone()), &args.node_name);
    let port_claims =
        NodeIndexed::new(KubeClaimStore::<Port>::new(client.clone()), &args.node_name);
    if !args.claims_by_label {
        tokio::spawn(keep_seeded(fabric_claims.clone(), "FabricIP"));
        tokio::spawn(keep_seeded(port_claims.clone(), "Port"));
    }
    let ipam = FabricIpam::new(fabric_claims, pools);
    let node_pods = NodePods::default();
    let barrier = barrier::PolicyBarrier::default();
    let tenancy = VpcAttach::new(
        KubeDirectory::new(client.clone()).with_node_pods(node_pods.clone()),
        port_claims,
        Some(node_ip.to_string()),
    );
    let handler = Arc::new(
        CniHandler::new(
            ipam,
            plumber,
            shared.clone(),
            HandlerConfig {
                node: args.node_name.clone(),
                default_mtu: net.pod_mtu,
                serial_add: args.serial_add,
            },
        )
        .with_metrics(cni_metrics)
        .with_tenancy(Arc::new(tenancy))
        .with_policy_gate(Arc::new(barrier.clone())),
    );
    std::fs::create_dir_all(&args.run_dir)
        .map_err(|e| AgentError::io("create", &args.run_dir, e))?;
    let socket = args.socket_path();
    let listener = cozyplane_cni::server::bind_atomic(&socket)
        .map_err(|e| AgentError::io("bind", &socket, e))?;
    let rt = tokio::runtime::Handle::current();
    let h = handler.clone();
    std::thread::Builder::new()
        .name("cni-accept".into())
        .spawn(move || accept_loop(listener, h, rt))
        .map_err(|e| AgentError::io("spawn the CNI accept thread for", &socket, e))?;

    // 6. watches
    let sync_cfg = watch::SyncConfig {
        node: args.node_name.clone(),
        endpoint: TunnelEndpoint(node_ip),
        own_addresses: net.addresses.clone(),
        debounce: Duration::from_millis(args.sync_debounce_ms),
        services,
        apiserver_addresses: apiserver_address.into_iter().collect(),
        node_pods,
        barrier,
        cluster_cidrs: cluster_cidrs
            .iter()
            .filter_map(|p| {
                let c = p.cidr();
                ipnet::IpNet::new(c.addr(), c.len()).ok()
            })
            .collect(),
    };
    let sever_plumber = NetlinkPlumber::new(NetnsHandle {
        netns: host.netns.try_clone()?,
        nl: host.nl.clone(),
    });
    let mut watch_task = tokio::spawn(watch::run(
        client,
        shared.clone(),
        sever_plumber,
        sync_cfg,
        stats,
        ready_tx,
    ));
    let mut ready = ready_rx.clone();
    tokio::select! {
        r = ready.wait_for(|r| *r) => {
            r.map_err(|e| AgentError::TaskStopped { task: "sync", cause: e.into() })?;
        }
        r = &mut watch_task => return Err(stopped("watch", r)),
    }
    handler.set_ready(true);

    // 7. plugin and conflist, last
    if let Some(src) = &args.cni_plugin {
        install::install_plugin(src, &args.cni_bin_dir)?;
    }
    install::write_conflist(&args.cni_conf_dir, &args.cni_conf_name, &socket)?;
    tracing::info!(conflist = %args.cni_conf_dir.join(&args.cni_conf_name).display(), "ready");

    tokio::select! {
        r = watch_task => Err(stopped("watch", r)),
        r = http_task => Err(stopped("metrics server", r)),
    }
}

/// How often the claim index is re-seeded once seeded: it drops the names of
/// claims others deleted (the controller's GC of pods whose DEL never came).
const CLAIM_RESEED: Duration = Duration::from_secs(600);

/// Seeds a claim index (retrying every 2 s until the API server answers),
/// then re-seeds it every [`CLAIM_RESEED`].
async fn keep_seeded<S, O>(index: NodeIndexed<S, O>, kind: &'static str)
where
    S: ClaimStore<O>,
    O: ClaimObject,
{
    loop {
        let wait = match index.seed().await {
            Ok(names) => {
                tracing::debug!(kind, names, "claim index seeded");
                CLAIM_RESEED
            }
            Err(e) => {
                tracing::warn!(kind, error = %Chain(&e), "cannot list this node's claims; retrying");
                Duration::from_secs(2)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// The error of a background task that ended (with its result `r`).
fn stopped<E: Into<TaskEnd>>(
    task: &'static str,
    r: Result<Result<(), E>, tokio::task::JoinError>,
) -> AgentError {
    let cause = match r {
        Ok(Ok(())) => TaskEnd::Returned,
        Ok(Err(e)) => e.into(),
        Err(e) => TaskEnd::Join(e),
    };
    AgentError::TaskStopped { task, cause }
}

/// One thread per connection: the handler drives each request to completion
/// with `block_on` (an ADD must never be cancelled between two steps).
fn accept_loop(listener: UnixListener, handler: Arc<Handler>, rt: tokio::runtime::Handle) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "CNI accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let h = handler.clone();
        let rt = rt.clone();
        let spawned = std::thread::Builder::new()
            .name("cni-conn".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                match h.serve_blocking(&rt, &stream) {
                    Ok(req) => tracing::debug!(
                        op = req.op(),
                        micros = started.elapsed().as_micros() as u64,
                        "CNI request served"
                    ),
                    Err(e) => tracing::warn!(error = %Chain(&e), "CNI connection failed"),
                }
            });
        if let Err(e) = spawned {
            // The stream was moved into the failed closure and is closed:
            // the plugin sees a broken connection and reports "try again".
            tracing::error!(error = %Chain(&e), "cannot spawn a CNI connection thread");
        }
    }
}

/// The client, and the API server's address when its URL names one (the
/// host firewall always admits it).
async fn kube_client(args: &AgentArgs) -> Result<(Client, Option<IpAddr>), AgentError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = |source| AgentError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(kubeconfig)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(kubeconfig)?
        }
        None => kube::Config::infer()
            .await
            .map_err(AgentError::InferConfig)?,
    };
    let server = config
        .cluster_url
        .host()
        .and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse().ok());
    Ok((
        Client::try_from(config).map_err(AgentError::Client)?,
        server,
    ))
}

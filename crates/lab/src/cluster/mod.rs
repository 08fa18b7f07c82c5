//! `cozyplane lab up/down/status`: a whole cozyplane cluster on one machine.
//!
//! `up` composes what the rest of the project already provides: the topology
//! ([`crate::Topology`]), the standalone API server on its embedded store, one
//! real agent per node and the controller, all started from the same
//! `cozyplane` binary as tracked processes of the lab, so that `down`
//! ([`crate::destroy_by_prefix`]) finds and kills them even after a crash.
//!
//! Where things run, and why:
//! - the API server and the controller run in the fabric namespace; the API
//!   server listens on the lab's service address only (`198.18.0.2:6443`,
//!   on-link for every node), not on the fabric's other addresses;
//! - every component has its own identity (a client certificate from the API
//!   server's CA) and a least-privilege role, none is in `system:masters`
//!   ([`identity`]);
//! - the host (kubectl) reaches it through a small relay (`lab relay`, see
//!   [`relay`]) that also lives in the fabric namespace but accepts on a
//!   listening socket `up` created in the host namespace (`127.0.0.1:<port>`)
//!   and handed down as an inherited fd. Nothing is added to the host's
//!   network configuration, and every process of the lab lives in one of the
//!   lab's namespaces, where teardown discovers it.
//! - a trivial scheduler ([`crate::scheduler`]) and the EndpointSlice
//!   controller ([`crate::endpoints`]) run in the fabric and one
//!   lab kubelet ([`crate::kubelet`]) per node runs in the node's namespace,
//!   so Pods applied with kubectl run as processes in netns plumbed by the
//!   real CNI plugin; a probe server named `external` runs on the external
//!   host, and the host kubeconfig's context carries its address (extension
//!   `cozyplane.io/lab`) for `cozyplane connectivity test`.
//!
//! The lead wires this as `Cmd::Lab(args) => rt.block_on(cozyplane_lab::cluster::run(args))`.

mod api;
mod error;
pub mod identity;
mod preflight;
mod probe;
mod record;
pub mod relay;
mod status;
mod up;
pub use up::{agent_args, controller_args, AgentPlace};

use std::path::PathBuf;

pub(crate) use api::client as api_client;
pub use error::{ClusterError, ClusterResult};
pub(crate) use preflight::require_root;
#[cfg(test)]
pub(crate) use probe::http_status;
pub use record::{ClusterRecord, Component};

/// The environment variable naming the `cozyplane` binary whose subcommands
/// (`apiserver`, `agent`, `controller`) the lab runs; default: this binary.
pub const BIN_ENV: &str = "COZYPLANE_BIN";
/// The environment variable naming the CNI plugin binary the agents install;
/// default: `cozyplane-cni` next to the `cozyplane` binary, if there is one.
pub const CNI_BIN_ENV: &str = "COZYPLANE_CNI_BIN";

/// Where the lab mounts the cgroup v2 hierarchy (the agents' default
/// `--cgroup-root`, so one mount serves both).
pub const LAB_CGROUP_MOUNT: &str = "/run/cozyplane/cgroupv2";

/// A lab node's cgroup: its kubelet starts pods in it and its agent attaches
/// the socket-level Service load balancer to it, so each node's pods are
/// load-balanced by their own node's agent only, as on separate machines.
pub fn node_cgroup(topology: &str, node: &str) -> std::path::PathBuf {
    std::path::Path::new(LAB_CGROUP_MOUNT)
        .join(format!("cozyplane-lab-{topology}"))
        .join(node)
}

/// `cozyplane lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// What to do.
    #[command(subcommand)]
    pub cmd: LabCmd,
}

/// The `cozyplane lab` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum LabCmd {
    /// Bring up a multi-node cluster in network namespaces (needs root).
    Up(UpArgs),
    /// Remove everything a lab made; safe to run twice and after a crash.
    Down(DownArgs),
    /// Show nodes, component health and the pods.
    Status(StatusArgs),
    /// Internal: the host ↔ fabric relay to the API server (started by `up`).
    #[command(hide = true)]
    Relay(relay::RelayArgs),
    /// Internal: the lab kubelet of one node (started by `up`).
    #[command(hide = true)]
    Kubelet(crate::kubelet::KubeletArgs),
    /// Internal: the lab's trivial scheduler (started by `up`).
    #[command(hide = true)]
    Scheduler(crate::scheduler::SchedulerArgs),
    /// Internal: the lab's EndpointSlice controller (started by `up`).
    #[command(hide = true)]
    Endpoints(crate::endpoints::EndpointsArgs),
}

/// `cozyplane lab up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Lab name: the prefix of every namespace, link and directory (1-10 of [a-z0-9], starting with a letter).
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The agents load-balance Services (`true`); `false` leaves them to an iptables
    /// kube-proxy you install in the nodes' namespaces (the agents' own flag).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub kube_proxy_replacement: bool,
    /// The agents' hidden `--service-slots`: Services are placed in the first
    /// N service slots only, so a test can make one not fit.
    #[arg(long, hide = true)]
    pub service_slots: Option<u32>,
}

/// `cozyplane lab down`.
#[derive(Debug, clap::Args)]
pub struct DownArgs {
    /// Lab name.
    #[arg(long, default_value = "lab")]
    pub name: String,
}

/// `cozyplane lab status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Lab name.
    #[arg(long, default_value = "lab")]
    pub name: String,
}

/// Runs a `cozyplane lab` subcommand.
pub async fn run(args: LabArgs) -> ClusterResult<()> {
    match args.cmd {
        LabCmd::Up(a) => up::up(&a).await.map(|_| ()),
        LabCmd::Down(a) => down(&a.name),
        LabCmd::Status(a) => {
            let report = status::status(&a.name).await?;
            print!("{report}");
            if report.healthy() {
                Ok(())
            } else {
                Err(ClusterError::Unhealthy(a.name))
            }
        }
        LabCmd::Relay(a) => relay::run(a).await,
        LabCmd::Kubelet(a) => crate::kubelet::run(a).await,
        LabCmd::Scheduler(a) => crate::scheduler::run(a).await,
        LabCmd::Endpoints(a) => crate::endpoints::run(a).await,
    }
}

/// `lab down`: removes everything carrying the lab's prefix.
pub fn down(name: &str) -> ClusterResult<()> {
    preflight::require_root()?;
    let done = crate::destroy_by_prefix(name)?;
    if done.is_empty() {
        println!("lab {name}: nothing to remove");
    } else {
        println!(
            "lab {name} removed: {} processes, {} namespaces, {} mounts, {} directories",
            done.processes.len(),
            done.netns.len(),
            done.mounts.len(),
            done.dirs.len()
        );
    }
    Ok(())
}

/// The `cozyplane` binary the lab runs: `$COZYPLANE_BIN`, else this executable.
pub fn cozyplane_binary() -> ClusterResult<PathBuf> {
    match std::env::var_os(BIN_ENV) {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().map_err(|e| ClusterError::Io {
            op: "find the current executable",
            path: PathBuf::from("/proc/self/exe"),
            source: e,
        }),
    }
}

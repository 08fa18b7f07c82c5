//! Command-line arguments of `cozyplane agent`.
//!
//! Every path is configurable because several agents share one kernel in
//! the lab (one node namespace each): each needs its own pin directory,
//! socket and CNI config directory.

use std::net::SocketAddr;
use std::path::PathBuf;

pub use cozyplane_datapath::node::{Masquerade, Tunnel};

/// `--masquerade`: [`Masquerade`] as a command-line value (clap derives
/// `ValueEnum` only on the crate's own types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MasqueradeArg {
    /// In eBPF on the uplink (`to_uplink` / `from_uplink`).
    Bpf,
    /// Not at all (pods' addresses must be routable outside).
    Off,
}

impl From<MasqueradeArg> for Masquerade {
    fn from(m: MasqueradeArg) -> Masquerade {
        match m {
            MasqueradeArg::Bpf => Masquerade::Bpf,
            MasqueradeArg::Off => Masquerade::Off,
        }
    }
}

/// `--tunnel-mode`: [`Tunnel`] as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TunnelArg {
    /// Encapsulate and decapsulate in tc.
    Tc,
    /// Leave both to the kernel's VXLAN device.
    Device,
}

impl From<TunnelArg> for Tunnel {
    fn from(t: TunnelArg) -> Tunnel {
        match t {
            TunnelArg::Tc => Tunnel::Tc,
            TunnelArg::Device => Tunnel::Device,
        }
    }
}

/// `cozyplane agent` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// This node's name (the Kubernetes Node object).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig to reach the API server; in-cluster config when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Cluster pod CIDR(s), a comma list with at most one per family.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: String,

    /// Pod MTU; default: the uplink's MTU minus the encapsulation overhead.
    #[arg(long)]
    pub mtu: Option<u32>,

    /// A bpf filesystem; mounted here if the directory is not on one.
    #[arg(long, default_value = "/sys/fs/bpf")]
    pub bpffs: PathBuf,

    /// Where maps and links are pinned; default `<bpffs>/cozyplane`.
    #[arg(long)]
    pub pin_dir: Option<PathBuf>,

    /// Runtime directory: the CNI socket `agent.sock` lives here.
    #[arg(long, default_value = "/run/cozyplane")]
    pub run_dir: PathBuf,

    /// Where the CNI network configuration is written (last, atomically).
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,

    /// The CNI network configuration file name.
    #[arg(long, default_value = "10-cozyplane.conflist")]
    pub cni_conf_name: String,

    /// Directory of CNI plugin binaries; with `--cni-plugin` the plugin is
    /// installed there as `cozyplane`.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,

    /// The plugin binary to install into `--cni-bin-dir` (nothing is
    /// installed when absent).
    #[arg(long)]
    pub cni_plugin: Option<PathBuf>,

    /// Uplink device (masquerade hooks, node address); default: the
    /// device of the IPv4 default route.
    #[arg(long)]
    pub uplink: Option<String>,

    /// Name of the overlay (VXLAN) device.
    #[arg(long, default_value = "cozyplane0")]
    pub overlay_device: String,

    /// Masquerade of pod → outside traffic.
    #[arg(long, value_enum, default_value_t = MasqueradeArg::Bpf)]
    pub masquerade: MasqueradeArg,

    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9411")]
    pub metrics_bind: SocketAddr,

    /// Coalescing delay between a watch event and the map sync it causes.
    #[arg(long, default_value_t = 50)]
    pub sync_debounce_ms: u64,

    /// Where the overlay's VXLAN headers are built and removed: `tc`
    /// encapsulates in tc and sends straight to the uplink, and decapsulates
    /// at the uplink what is for a local pod (the VXLAN device takes the
    /// rest); `device` leaves all of it to the kernel's VXLAN device. Both
    /// put the same packets on the wire, so nodes in either mode interoperate.
    #[arg(long, value_enum, default_value_t = TunnelArg::Tc)]
    pub tunnel_mode: TunnelArg,
    /// Makes a pod's veth pair only after its addresses are claimed,
    /// instead of while the claim is in flight. For the CNI latency bench's
    /// A/B (docs/benchmarks.md); no reason to set it otherwise.
    #[arg(long, hide = true)]
    pub serial_add: bool,
    /// Finds a pod's claims by a label-selected list every time, as before
    /// the node's claim index (ipam/node_index.rs). For the CNI latency
    /// bench's A/B at cluster scale; no reason to set it otherwise.
    #[arg(long, hide = true)]
    pub claims_by_label: bool,
    /// Places Services' backend ranges and Maglev tables in the first N
    /// slots of `cp_svc_slots` only (default: all 2²⁰), so the lab can show
    /// how a Service that does not fit is reported (crates/lab/tests/
    /// service_unfitted.rs) without 2²⁰ slots' worth of pods; no reason to
    /// set it otherwise.
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(1..=i64::from(cozyplane_datapath::abi::MAX_SVC_SLOTS)))]
    pub service_slots: Option<u32>,

    /// Replace kube-proxy: load-balance Services in eBPF (socket-level, at
    /// `--cgroup-root`). With `false` no Service is translated here and local
    /// net-0 delivery goes through the kernel (`PARAM_F_KERNEL_LOCAL`), so an
    /// iptables kube-proxy's conntrack sees both directions of a ClusterIP flow.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub kube_proxy_replacement: bool,

    /// The cgroup v2 directory the socket-level load balancer attaches to:
    /// every process below it has its Service connects translated. Mounted
    /// (cgroup2) if the directory is not on a cgroup v2 file system, which
    /// makes it the root of the unified hierarchy.
    #[arg(long, default_value = "/run/cozyplane/cgroupv2")]
    pub cgroup_root: PathBuf,

    /// Handle only Services labelled `service.kubernetes.io/service-proxy-name`
    /// with this name (and, without it, only Services not labelled at all), as
    /// kube-proxy does with the same label.
    #[arg(long)]
    pub service_proxy_name: Option<String>,

    /// CIDRs outside the cluster that Service backends may be in (comma list;
    /// selectorless Services pointing at external databases). Endpoints outside
    /// the pod and node addresses and these are ignored: EndpointSlices are
    /// tenant-writable (docs/services.md).
    #[arg(long, default_value = "")]
    pub service_external_backends: String,
}

impl AgentArgs {
    /// The pin directory.
    pub fn pin_dir(&self) -> PathBuf {
        self.pin_dir
            .clone()
            .unwrap_or_else(|| self.bpffs.join("cozyplane"))
    }

    /// The CNI socket.
    pub fn socket_path(&self) -> PathBuf {
        self.run_dir.join("agent.sock")
    }

    /// `--service-external-backends`, parsed.
    pub fn external_backends(&self) -> Result<Vec<ipnet::IpNet>, String> {
        self.service_external_backends
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<ipnet::IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|e| format!("{s:?}: {e}"))
            })
            .collect()
    }
}

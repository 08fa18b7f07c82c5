//! The cozyplane datapath.
//!
//! The eBPF half: the C programs in `bpf/` (compiled by `build.rs` and
//! embedded), their map ABI ([`abi`]), loading with pinned maps
//! ([`Datapath`]), typed map access ([`tables`]) and tcx attachment with
//! pinned links ([`tcx`]) for the node's devices, tc filters for the pod
//! veths ([`pod_tc`]). The netlink half lives in `netlink`; [`node`]
//! brings up one node with both (what the agent, the benchmark and the
//! overlay tests share).
pub mod abi;
pub mod batch;
pub mod datapath;
pub mod error;
pub mod hostfw;
pub mod meter;
pub mod netpol;
pub mod node;
pub mod pod_tc;
pub mod service;
pub mod sg;
pub mod sorted;
pub mod tables;
pub mod tcx;

pub use datapath::{ensure_bpffs, Datapath, MapSpec, MapStats, Object, Program, MAP_SPECS};
pub use error::DatapathError;
pub use hostfw::{detach_host_firewall, HostProgram};
pub use pod_tc::{
    attach_pod_programs, check_pod_programs, detach_pod_programs, PodPrograms, POD_FILTER_HANDLE,
    POD_FILTER_PRIORITY,
};
pub use service::{detach_socket_lb, ensure_cgroup2, is_cgroup2, SockProgram, SvcMaps};
pub use tcx::{detach_tcx, Attached, Direction, Iface};
pub mod netlink;

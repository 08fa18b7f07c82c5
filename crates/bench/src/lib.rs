//! The cozyplane datapath benchmark.
//!
//! Measures, in one run and interleaved (every round builds all selected variants,
//! then measures each metric on all of them back to back, the order alternating
//! between a, b, c, d and d, c, b, a; [`runner`]), cross-node pod → pod TCP throughput
//! (iperf3, 1 and 4 streams), TCP_RR and TCP_CRR on three datapaths, the third with pods
//! of two kinds, each on a freshly built 2-node topology of the lab (`cozyplane-lab`),
//! with the clients and servers pinned to fixed CPUs alike in every variant:
//!
//! * **(a) the limit**: plain routing between the node namespaces, pods behind veths,
//!   no encapsulation ([`baseline::direct`]);
//! * **(b) the peer**: a flannel-style Linux bridge `cni0` + kernel VXLAN `flannel.1`
//!   ([`baseline::flannel`]);
//! * **(c) cozyplane**: the production eBPF object with VXLAN in external mode, each
//!   node brought up by the node agent's own function,
//!   [`cozyplane_datapath::node::bring_up`] ([`overlay::setup`]), its pods on the
//!   default network (net 0);
//! * **(d) cozyplane, VPC pods**: the same, with both pods in one VPC (VNI 100, their
//!   own CIDR, the fabric address bridged), attached as the agent attaches a VPC pod
//!   ([`overlay::PodNetwork::Vpc`]).
//!
//! It reports medians and ratios against (a) next to the targets and the peer's
//! published ratios, and (d) ÷ (c) against issue #10's VPC target, each also as the
//! median of the per-round ratios ([`report`]), plus
//! the datapath's map memory and the bench's own setup times. Speed is only ever
//! *reported*: nothing here asserts a timing.
//!
//! A second mode, `cozyplane-bench services` ([`services`], [`kubeproxy`]), measures
//! issue #11's Services figures: connects through the socket-level load balancer against
//! direct connects and kube-proxy's iptables rules, programming 10k Services, a
//! backend change's compile + sync, and cross-node ClusterIP CRR through the eBPF
//! datapath ([`svc_crossnode`]).
//!
//! Everything a round creates carries its topology's prefix and is removed by the lab's
//! teardown: at the end of each round, on error, on panic (the [`cozyplane_lab::Topology`]
//! drop guard) and on Ctrl-C (the binary drops the running future, then tears down by
//! prefix once more). Needs root, iproute2 and iperf3.

pub mod baseline;
pub mod error;
pub mod kubeproxy;
pub mod measure;
pub mod overlay;
pub mod pods;
pub mod policy_crossnode;
pub mod report;
pub mod rr;
pub mod runner;
pub mod services;
pub mod stats;
pub mod svc_crossnode;

pub use error::{BenchError, Result};
pub use runner::{run, Config, Metric, RunResult, Variant};

//! The cozyplane lab: multi-node topologies in network namespaces on one machine.
//!
//! This is the one topology builder of the project: the datapath integration tests and
//! `cozyplane lab up` both use it. A [`TopologySpec`] (name, node count, underlay
//! network, external host, MTU) becomes a [`Topology`]: a fabric namespace holding the
//! underlay bridge and a router, one namespace per [`Node`] attached to the bridge by a
//! veth, and optionally an [`External`] host behind the router. See [`spec`] for the
//! naming and addressing plan and [`topology`] for the layout.
//!
//! Teardown is crash-safe: what a topology makes is recorded in a state file before it
//! is made, and [`destroy_by_prefix`] removes everything carrying a topology's prefix
//! (namespaces, processes inside them, links, mounts, run directory) whether or not
//! the process that built it is still alive. [`Topology`] also tears down on drop.
//!
//! On top of the topology, [`cluster`] brings up a whole cluster (`cozyplane lab
//! up`): API server, agents, controller, the [`scheduler`], the EndpointSlice
//! controller ([`endpoints`]) and one [`kubelet`] per node, which runs Pods as
//! processes in network namespaces plumbed by the real CNI plugin.
//!
//! Everything here needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`).
//!
//! ```no_run
//! # async fn demo() -> cozyplane_lab::Result<()> {
//! use std::process::Command;
//! use std::time::Duration;
//! use cozyplane_lab::{exec_in, wait_for, Topology, TopologySpec};
//!
//! // Three nodes on 198.18.0.0/24 and an external host at 198.19.0.2.
//! let mut topo = Topology::build(TopologySpec::new("demo", 3)).await?;
//! let (n1, n2) = (&topo.nodes()[0], &topo.nodes()[1]);
//! let n2_ip = n2.ip().to_string();
//! wait_for("node1 to ping node2", Duration::from_secs(3), || {
//!     exec_in(n1, &["ping", "-c1", "-W1", &n2_ip]).is_ok_and(|o| o.status.success())
//! })?;
//! // A long-running process inside node 2, killed by destroy (or by a later
//! // `destroy_by_prefix("demo")` if this process crashes first).
//! let _agent = topo.spawn_in_node(n2, Command::new("sleep").arg("600"))?;
//! topo.destroy()?;
//! # Ok(())
//! # }
//! ```

mod build;
pub mod cluster;
pub mod endpoints;
pub mod error;
pub mod exec;
pub mod kubelet;
pub mod process;
pub mod scheduler;
pub mod spec;
pub mod state;
pub mod teardown;
pub mod topology;
pub mod wait;

pub use error::{LabError, Result};
pub use exec::{bind_tcp_in, exec_in, exec_in_async, LabHost};
pub use spec::{Ipv4Cidr, Plan, TopologySpec};
pub use state::{LabState, TrackedProcess};
pub use teardown::{destroy_by_prefix, destroy_by_prefix_in, known_topologies, Cleanup};
pub use topology::{External, Fabric, Node, Topology};
pub use wait::{wait_for, wait_for_async};

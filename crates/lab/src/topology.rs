//! Building a topology from a [`TopologySpec`] and owning it until it is destroyed.
//!
//! ```text
//!  ┌──────────────── fabric namespace <name>-fabric (ip_forward=1) ────────────────┐
//!  │  bridge <name>-br 198.18.0.1/24 (router)            <name>-ext 198.19.0.1/24  │
//!  │     │ port <name>-n1     │ port <name>-n2     …          │                    │
//!  └─────┼────────────────────┼───────────────────────────────┼────────────────────┘
//!        │ veth               │ veth                          │ veth
//!   eth0 198.18.0.11/24  eth0 198.18.0.12/24             eth0 198.19.0.2/24
//!   <name>-node1         <name>-node2                    <name>-ext
//!   default via .1       default via .1                  198.18.0.0/24 via 198.19.0.1
//! ```
//!
//! The bridge and the router live in their own namespace, never in the host's: the lab
//! touches no host interface, route or sysctl, and the host cannot reach the lab nor
//! the lab the host. Each veth is created from the fabric side in one request with
//! its peer already in the node namespace under its final name (`eth0`), so there is
//! no moment where a half-made pair sits anywhere.
//!
//! Every namespace is written to the state file *before* it is created, and a failed
//! build runs the full teardown, so a failed build leaves nothing.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::sync::{Mutex, MutexGuard};

use cozyplane_datapath::netlink::{IpPrefix, Netns, NetnsHandle};
use cozyplane_errors::Chain;

use crate::build;
use crate::error::{LabError, Result};
use crate::exec::{self, LabHost};
use crate::process;
use crate::spec::{Plan, TopologySpec};
use crate::state::{LabState, TrackedProcess};
use crate::teardown::{destroy_by_prefix_in, Cleanup};

/// The fabric namespace: the underlay bridge and the router.
#[derive(Debug)]
pub struct Fabric {
    /// Namespace name (`<name>-fabric`).
    pub name: String,
    /// The namespace and a netlink handle in it.
    pub netns: NetnsHandle,
    /// The bridge (`<name>-br`).
    pub bridge: String,
    /// The bridge's ifindex (in the fabric namespace).
    pub bridge_index: u32,
    /// The router's address on the underlay (nodes' default gateway).
    pub router_ip: Ipv4Addr,
}

/// A node: a namespace on the underlay that plays one machine of the cluster.
#[derive(Debug)]
pub struct Node {
    /// Node name (= namespace name, `<name>-node<i>`), usable as a Kubernetes node name.
    pub name: String,
    /// 1-based index.
    pub index: usize,
    /// The namespace and a netlink handle in it.
    pub netns: NetnsHandle,
    /// Its underlay interface (`eth0`).
    pub underlay_ifname: String,
    /// Its underlay address.
    pub underlay_ip: Ipv4Addr,
    /// The same with the underlay's prefix length, as configured on the interface.
    pub underlay_prefix: IpPrefix,
    /// Its default gateway (the fabric router).
    pub gateway: Ipv4Addr,
    /// The fabric end of its veth (`<name>-n<i>`).
    pub fabric_port: String,
    /// The underlay MTU.
    pub mtu: u32,
}

impl Node {
    /// The node's underlay address.
    pub fn ip(&self) -> Ipv4Addr {
        self.underlay_ip
    }

    /// Its namespace's path (`/run/netns/<name>`), for `ip netns exec` or `CNI_NETNS`-style use.
    pub fn netns_path(&self) -> &Path {
        self.netns.netns.path()
    }
}

/// The external host: the target of north-south (pod → outside) traffic.
#[derive(Debug)]
pub struct External {
    /// Namespace name (`<name>-ext`).
    pub name: String,
    /// The namespace and a netlink handle in it.
    pub netns: NetnsHandle,
    /// Its interface (`eth0`).
    pub ifname: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The same with the external network's prefix length.
    pub prefix: IpPrefix,
    /// The fabric router's address on the external network (its only route's gateway).
    pub gateway: Ipv4Addr,
}

impl LabHost for Node {
    fn name(&self) -> &str {
        &self.name
    }
    fn netns(&self) -> &Netns {
        &self.netns.netns
    }
}

impl LabHost for External {
    fn name(&self) -> &str {
        &self.name
    }
    fn netns(&self) -> &Netns {
        &self.netns.netns
    }
}

impl LabHost for Fabric {
    fn name(&self) -> &str {
        &self.name
    }
    fn netns(&self) -> &Netns {
        &self.netns.netns
    }
}

/// A built topology. Destroyed by [`Topology::destroy`] or, failing that, on drop.
#[derive(Debug)]
pub struct Topology {
    spec: TopologySpec,
    plan: Plan,
    state: Mutex<LabState>,
    fabric: Option<Fabric>,
    nodes: Vec<Node>,
    external: Option<External>,
    destroyed: bool,
}

impl Topology {
    /// Builds the topology `spec` describes. Fails with [`LabError::AlreadyExists`]
    /// (touching nothing) if anything with its prefix exists; on any other failure
    /// everything made so far is removed before the error is returned.
    pub async fn build(spec: TopologySpec) -> Result<Topology> {
        let plan = spec.plan()?;
        build::claim(&spec, &plan)?;
        let mut topo = Topology {
            state: Mutex::new(LabState::new(&plan.name)),
            spec,
            plan,
            fabric: None,
            nodes: Vec::new(),
            external: None,
            destroyed: false,
        };
        match topo.build_all().await {
            Ok(()) => Ok(topo),
            Err(error) => match topo.destroy() {
                Ok(_) => Err(error),
                Err(cleanup) => Err(LabError::RollbackFailed {
                    error: Box::new(error),
                    cleanup: Box::new(cleanup),
                }),
            },
        }
    }

    async fn build_all(&mut self) -> Result<()> {
        // Intent first: a crash from here on leaves a record naming every namespace.
        self.update_state(|s| s.netns = self.plan.netns_names())?;
        self.fabric = Some(build::fabric(&self.spec, &self.plan).await?);
        for node in self.plan.nodes.clone() {
            let built = build::node(&self.spec, &self.plan, self.fabric_ref()?, &node).await?;
            self.nodes.push(built);
            #[cfg(test)]
            if fail_point::hit(&self.plan.name, self.nodes.len()) {
                return Err(LabError::InvalidSpec("injected failure".into()));
            }
        }
        if let Some(ext) = self.plan.external.clone() {
            self.external = Some(build::external(&self.spec, self.fabric_ref()?, &ext).await?);
        }
        Ok(())
    }

    fn fabric_ref(&self) -> Result<&Fabric> {
        self.fabric
            .as_ref()
            .ok_or_else(|| LabError::Destroyed(self.plan.name.clone()))
    }

    fn lock_state(&self) -> MutexGuard<'_, LabState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update_state(&self, f: impl FnOnce(&mut LabState)) -> Result<()> {
        let mut state = self.lock_state();
        f(&mut state);
        state.save(&self.plan.run_dir)
    }

    /// The topology name (the prefix of every resource).
    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// The spec it was built from.
    pub fn spec(&self) -> &TopologySpec {
        &self.spec
    }

    /// Its names and addresses.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Its run directory (holds `state.json`; later components may put files there).
    pub fn run_dir(&self) -> &Path {
        &self.plan.run_dir
    }

    /// The nodes, in index order (empty once destroyed).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| LabError::NoSuchNode(name.to_string()))
    }

    /// The underlay address of node `name`.
    pub fn node_ip(&self, name: &str) -> Result<Ipv4Addr> {
        self.node(name).map(Node::ip)
    }

    /// The external host, if the spec asked for one (and not yet destroyed).
    pub fn external(&self) -> Option<&External> {
        self.external.as_ref()
    }

    /// The fabric namespace (bridge and router), unless destroyed.
    pub fn fabric(&self) -> Option<&Fabric> {
        self.fabric.as_ref()
    }

    /// Starts `cmd` inside `host`'s namespace (a node, the external host or the
    /// fabric), records it (pid and start time) in the state file, and returns it.
    /// It is killed on destroy if still running; reaping it is the caller's business
    /// (`wait` on the returned child).
    pub fn spawn_in(&self, host: &impl LabHost, cmd: &mut Command) -> Result<Child> {
        if self.destroyed {
            return Err(LabError::Destroyed(self.plan.name.clone()));
        }
        exec::enter_before_exec(cmd, host.netns())?;
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            program: program.clone(),
            place: host.name().to_string(),
            source,
        })?;
        match self.track(host, child.id(), program) {
            Ok(()) => Ok(child),
            Err(e) => {
                // An untracked process must not outlive the call: stop it and report.
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Records a child we started (and have not reaped, so its `/proc` entry exists).
    fn track(&self, host: &impl LabHost, pid: u32, program: String) -> Result<()> {
        let stat = format!("/proc/{pid}/stat");
        let pid = i32::try_from(pid)
            .map_err(|_| LabError::io("track", &stat, std::io::Error::other("pid out of range")))?;
        let start_time = process::start_time(pid)
            .map_err(|e| LabError::io("read start time", &stat, e))?
            .ok_or_else(|| {
                LabError::io(
                    "read start time",
                    &stat,
                    std::io::ErrorKind::NotFound.into(),
                )
            })?;
        self.update_state(|s| {
            s.processes.push(TrackedProcess {
                pid,
                start_time,
                place: host.name().to_string(),
                program,
            })
        })
    }

    /// [`Topology::spawn_in`] for a node.
    pub fn spawn_in_node(&self, node: &Node, cmd: &mut Command) -> Result<Child> {
        self.spawn_in(node, cmd)
    }

    /// Runs `argv` in `host`'s namespace to completion (see [`exec::exec_in`]).
    pub fn exec_in(&self, host: &impl LabHost, argv: &[&str]) -> Result<Output> {
        exec::exec_in(host, argv)
    }

    /// Puts the reserved service address `slot` (1–9: `.2`–`.10` of the underlay) on
    /// the fabric bridge and returns it. Every node reaches it on-link. A process that
    /// must serve the nodes (the lab's API server) listens there, either started in the
    /// fabric with [`Topology::spawn_in`] or by binding a socket in the fabric
    /// namespace with [`crate::exec::bind_tcp_in`] while also listening in the host
    /// for `kubectl`. Idempotent.
    pub async fn add_service_address(&self, slot: u32) -> Result<Ipv4Addr> {
        let fabric = self.fabric_ref()?;
        let ip = self.plan.service_ip(slot).ok_or_else(|| {
            LabError::InvalidSpec(format!(
                "service slot {slot}: want 1-{}",
                crate::spec::SERVICE_SLOTS
            ))
        })?;
        let addr = self.spec.underlay.with_len(ip);
        match fabric.netns.nl.add_address(fabric.bridge_index, addr).await {
            Err(e) if !e.is_exists() => return Err(e.into()),
            _ => {}
        }
        // Lab services are for the nodes and the host: the external host, which
        // stands for the outside world, gets "prohibited" from the router.
        if let Some(ext) = &self.plan.external {
            fabric
                .netns
                .nl
                .refuse_local_from(&ext.fabric_port, ip)
                .await?;
        }
        Ok(ip)
    }

    /// Records a bpffs pin directory (say, a lab agent's `--bpffs-root`) for removal
    /// on destroy, before the caller creates it.
    pub fn record_pin_dir(&self, dir: impl Into<std::path::PathBuf>) -> Result<()> {
        let dir = dir.into();
        self.update_state(|s| {
            if !s.pin_dirs.contains(&dir) {
                s.pin_dirs.push(dir)
            }
        })
    }

    /// Records a cgroup directory for removal on destroy, before the caller creates it.
    pub fn record_cgroup(&self, dir: impl Into<std::path::PathBuf>) -> Result<()> {
        let dir = dir.into();
        self.update_state(|s| {
            if !s.cgroups.contains(&dir) {
                s.cgroups.push(dir)
            }
        })
    }

    /// Leaves the topology running after this value is gone (for `cozyplane lab up`,
    /// which exits while the lab stays): the drop guard is disarmed, and
    /// [`crate::destroy_by_prefix`] with the returned name removes it later.
    pub fn detach(mut self) -> String {
        self.destroyed = true;
        self.plan.name.clone()
    }

    /// Removes everything the topology made: its processes, namespaces (and with them
    /// every link), mounts and run directory. Idempotent: a second call finds nothing
    /// and returns an empty [`Cleanup`]. After it, the node list is empty.
    pub fn destroy(&mut self) -> Result<Cleanup> {
        if self.destroyed {
            return Ok(Cleanup::default());
        }
        let result = destroy_by_prefix_in(&self.plan.name, &self.spec.run_root);
        // Our own fds and netlink sockets would keep the (unmounted) namespaces alive.
        self.nodes.clear();
        self.external = None;
        self.fabric = None;
        if result.is_ok() {
            self.destroyed = true;
        }
        result
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            // Drop cannot return the error; destroy_by_prefix (`cozyplane lab down`)
            // retries whatever is left, and the run dir records that something is.
            eprintln!(
                "cozyplane-lab: destroying topology {}: {}",
                self.plan.name,
                Chain(&e)
            );
        }
    }
}

/// Test-only failure injection: makes a build fail after a given number of nodes, to
/// prove that a half-built topology is removed.
#[cfg(test)]
mod fail_point {
    use std::collections::HashMap;
    use std::sync::Mutex;

    static AFTER_NODES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

    pub(super) fn arm(name: &str, nodes: usize) {
        let mut map = AFTER_NODES.lock().unwrap_or_else(|p| p.into_inner());
        map.get_or_insert_with(HashMap::new)
            .insert(name.to_string(), nodes);
    }

    pub(super) fn hit(name: &str, built: usize) -> bool {
        let map = AFTER_NODES.lock().unwrap_or_else(|p| p.into_inner());
        map.as_ref().and_then(|m| m.get(name)) == Some(&built)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::teardown::list_netns;

    #[test]
    fn topology_can_be_shared_across_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Topology>();
    }

    #[tokio::test]
    async fn a_build_that_fails_half_way_leaves_nothing() {
        if !cozyplane_testkit::needs!().root().ready() {
            return;
        }
        let name = format!("lu{}", std::process::id() % 1_000_000);
        fail_point::arm(&name, 2);
        let spec = TopologySpec::new(&name, 3);
        let run_dir = spec.run_root.join(&name);
        let err = Topology::build(spec).await.unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
        // The fabric and two nodes had been made; none of them is left.
        assert!(list_netns(&name).unwrap().is_empty());
        assert!(!run_dir.exists());
    }
}

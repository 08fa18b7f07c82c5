//! `lab status`: is every process of the lab still the one `up` started, does
//! it answer its `/readyz`, which Nodes are registered, how many Pods exist.

use std::fmt;

use cozyplane_errors::Chain;

use super::error::{ClusterError, ClusterResult};
use super::record::{ClusterRecord, Component};
use super::{api, preflight, probe};
use crate::TopologySpec;

/// One component's health.
#[derive(Debug, Clone)]
pub struct ComponentHealth {
    /// What was started.
    pub component: Component,
    /// The process is still running (same pid and start time).
    pub alive: bool,
    /// `/readyz` answered 200 (the API server and relay: an API call through them worked).
    pub ready: bool,
}

/// What `lab status` found.
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// The lab name.
    pub name: String,
    /// The host kubeconfig.
    pub kubeconfig: std::path::PathBuf,
    /// Every component.
    pub components: Vec<ComponentHealth>,
    /// `(node, InternalIP, agent ready)` for every node of the lab.
    pub nodes: Vec<(String, String, bool)>,
    /// Pods in all namespaces (`None`: the API server did not answer).
    pub pods: Option<usize>,
    /// Every pod (empty when the API server did not answer).
    pub pod_rows: Vec<api::PodRow>,
    /// Why the API could not be asked, if it could not.
    pub api_error: Option<String>,
}

impl StatusReport {
    /// Nodes whose Node object exists and whose agent is alive and ready.
    pub fn ready_nodes(&self) -> usize {
        self.nodes.iter().filter(|(_, _, ready)| *ready).count()
    }

    /// True if every component is alive and ready and every node is ready.
    pub fn healthy(&self) -> bool {
        self.api_error.is_none()
            && self.components.iter().all(|c| c.alive && c.ready)
            && self.ready_nodes() == self.nodes.len()
    }
}

impl fmt::Display for StatusReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lab {} (kubeconfig {})",
            self.name,
            self.kubeconfig.display()
        )?;
        writeln!(
            f,
            "{:<11} {:<16} {:>8}  {:<8} READY",
            "COMPONENT", "PLACE", "PID", "PROCESS"
        )?;
        for c in &self.components {
            writeln!(
                f,
                "{:<11} {:<16} {:>8}  {:<8} {}",
                c.component.role,
                c.component.place,
                c.component.pid,
                if c.alive { "alive" } else { "gone" },
                if c.ready { "yes" } else { "no" }
            )?;
        }
        writeln!(f, "{:<16} {:<16} AGENT", "NODE", "INTERNAL-IP")?;
        for (name, ip, ready) in &self.nodes {
            let ip = if ip.is_empty() { "-" } else { ip };
            writeln!(
                f,
                "{name:<16} {ip:<16} {}",
                if *ready { "ready" } else { "not ready" }
            )?;
        }
        writeln!(
            f,
            "nodes: {}/{} ready",
            self.ready_nodes(),
            self.nodes.len()
        )?;
        if !self.pod_rows.is_empty() {
            writeln!(f, "{:<40} {:<16} {:<10} IP", "POD", "NODE", "PHASE")?;
            for p in &self.pod_rows {
                let dash = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        s.to_string()
                    }
                };
                writeln!(
                    f,
                    "{:<40} {:<16} {:<10} {}",
                    p.name,
                    dash(&p.node),
                    dash(&p.phase),
                    dash(&p.ip)
                )?;
            }
        }
        match (self.pods, &self.api_error) {
            (Some(n), _) => writeln!(f, "pods: {n}")?,
            (None, Some(e)) => writeln!(f, "pods: unknown (API server: {e})")?,
            (None, None) => writeln!(f, "pods: unknown")?,
        }
        writeln!(f, "healthy: {}", if self.healthy() { "yes" } else { "no" })
    }
}

/// Looks at lab `name`.
pub async fn status(name: &str) -> ClusterResult<StatusReport> {
    preflight::require_root()?;
    let run_dir = TopologySpec::new(name, 1).run_root.join(name);
    let record = match ClusterRecord::load(&run_dir)? {
        Some(r) => r,
        // `up` writes the record last: a run dir without it is a lab being built or a crashed `up`.
        None if run_dir.exists() => return Err(ClusterError::Incomplete(name.into())),
        None => return Err(ClusterError::NoSuchLab(name.into())),
    };

    let (registered, pod_rows, api_error) = match ask_api(&record).await {
        Ok((nodes, pods)) => (nodes, pods, None),
        Err(e) => (Vec::new(), Vec::new(), Some(Chain(&e).to_string())),
    };
    let pods = api_error.is_none().then_some(pod_rows.len());
    let components: Vec<ComponentHealth> = record
        .components
        .iter()
        .map(|c| {
            let alive = c.alive();
            let ready = alive
                && match c.readyz {
                    Some(addr) => probe::http_status_in(&c.place, addr, "/readyz") == Some(200),
                    None => api_error.is_none(),
                };
            ComponentHealth {
                component: c.clone(),
                alive,
                ready,
            }
        })
        .collect();
    let nodes = record
        .nodes
        .iter()
        .map(|n| {
            let ip = registered
                .iter()
                .find(|(r, _)| r == n)
                .map(|(_, ip)| ip.clone());
            let agent_ready = components.iter().any(|c| {
                c.component.role == "agent" && &c.component.place == n && c.alive && c.ready
            });
            (
                n.clone(),
                ip.clone().unwrap_or_default(),
                ip.is_some() && agent_ready,
            )
        })
        .collect();
    Ok(StatusReport {
        name: name.to_string(),
        kubeconfig: record.kubeconfig.clone(),
        components,
        nodes,
        pods,
        pod_rows,
        api_error,
    })
}

async fn ask_api(
    record: &ClusterRecord,
) -> ClusterResult<(Vec<(String, String)>, Vec<api::PodRow>)> {
    let client = api::client(&record.kubeconfig).await?;
    let ask = async {
        let nodes = api::nodes(&client).await?;
        let pods = api::pods(&client).await?;
        Ok((nodes, pods))
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), ask)
        .await
        .map_err(|_| ClusterError::Api("no answer in 10 s".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(role: &str, alive: bool, ready: bool) -> ComponentHealth {
        ComponentHealth {
            component: Component {
                role: role.into(),
                place: "t-node1".into(),
                pid: 7,
                start_time: 1,
                readyz: None,
                log: "/x".into(),
            },
            alive,
            ready,
        }
    }

    #[test]
    fn a_dead_agent_makes_the_lab_unhealthy_and_shows() {
        let mut r = StatusReport {
            name: "t".into(),
            kubeconfig: "/run/cozyplane-lab/t/kubeconfig".into(),
            components: vec![health("apiserver", true, true), health("agent", true, true)],
            nodes: vec![("t-node1".into(), "198.18.0.11".into(), true)],
            pods: Some(1),
            pod_rows: vec![api::PodRow {
                name: "default/echo".into(),
                node: "t-node1".into(),
                phase: "Running".into(),
                ip: "10.244.0.5".into(),
            }],
            api_error: None,
        };
        assert!(r.healthy());
        let text = r.to_string();
        assert!(
            text.contains("nodes: 1/1 ready") && text.contains("pods: 1"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("default/echo"))
            .unwrap_or_else(|| panic!("no pod row:\n{text}"));
        assert!(
            row.contains("t-node1") && row.contains("Running") && row.contains("10.244.0.5"),
            "{row}"
        );
        r.components[1] = health("agent", false, false);
        r.nodes[0].2 = false;
        assert!(!r.healthy());
        let text = r.to_string();
        assert!(
            text.contains("gone") && text.contains("nodes: 0/1 ready"),
            "{text}"
        );
        assert!(text.contains("healthy: no"), "{text}");
    }
}

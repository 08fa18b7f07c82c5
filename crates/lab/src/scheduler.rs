//! The lab's trivial scheduler (`cozyplane lab scheduler`, hidden; one per
//! lab, in the fabric namespace).
//!
//! It binds every pod that has no `spec.nodeName` to the schedulable node
//! running the fewest unfinished pods (ties by name), with a merge patch of
//! `spec.nodeName` guarded by the pod's resourceVersion: a pod changed (or
//! bound) meanwhile is a conflict, and the next pass looks again. No
//! resources, affinities or taints: the lab's pods are small and equal.
//! A pass runs on every pod event and every 2 s (a pod that could not be
//! bound because there was no node yet gets bound once there is one).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

use crate::cluster::{ClusterError, ClusterResult};
use crate::kubelet::klog;

/// Arguments of `cozyplane lab scheduler`.
#[derive(Debug, Clone, clap::Args)]
pub struct SchedulerArgs {
    /// Kubeconfig of the lab's API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Where `/readyz` answers.
    #[arg(long, default_value = "127.0.0.1:9414")]
    pub readyz_bind: SocketAddr,
}

/// What the scheduler knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its resourceVersion (the guard of the binding patch).
    pub resource_version: String,
    /// The node it is bound to, if any.
    pub node: Option<String>,
    /// Succeeded or Failed (not counted against its node).
    pub finished: bool,
}

impl PodView {
    fn of(p: &Pod) -> Option<(String, PodView)> {
        let m = &p.metadata;
        if m.deletion_timestamp.is_some() {
            return None;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Some((
            m.uid.clone()?,
            PodView {
                namespace: m.namespace.clone().unwrap_or_default(),
                name: m.name.clone()?,
                resource_version: m.resource_version.clone().unwrap_or_default(),
                node: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty()),
                finished: matches!(phase, Some("Succeeded" | "Failed")),
            },
        ))
    }
}

/// The node for the next pod: fewest unfinished pods, then by name. `None` without nodes.
pub fn pick_node<'a>(
    nodes: &'a [String],
    pods: impl IntoIterator<Item = &'a PodView>,
) -> Option<&'a str> {
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for p in pods {
        if let Some(n) = p.node.as_deref().filter(|_| !p.finished) {
            if let Some(c) = load.get_mut(n) {
                *c += 1;
            }
        }
    }
    load.into_iter()
        .min_by_key(|(name, count)| (*count, *name))
        .map(|(n, _)| n)
}

/// The binding patch: spec.nodeName, guarded by resourceVersion.
pub fn binding_patch(node: &str, resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"nodeName": node},
    })
}

async fn schedulable_nodes(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Binds every unbound pod in `pods` (updating the view of those it bound).
async fn pass(client: &kube::Client, pods: &mut HashMap<String, PodView>) {
    let mut unbound: Vec<String> = pods
        .iter()
        .filter(|(_, p)| p.node.is_none() && !p.finished)
        .map(|(u, _)| u.clone())
        .collect();
    if unbound.is_empty() {
        return;
    }
    unbound.sort_by_key(|u| pods.get(u).map(|p| (p.namespace.clone(), p.name.clone())));
    let nodes = match schedulable_nodes(client).await {
        Ok(n) => n,
        Err(e) => {
            klog!("listing nodes: {e}");
            return;
        }
    };
    for uid in unbound {
        let Some(node) = pick_node(&nodes, pods.values()).map(str::to_string) else {
            klog!("no schedulable node yet");
            return;
        };
        let Some(p) = pods.get_mut(&uid) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
        let patch = binding_patch(&node, &p.resource_version);
        match api
            .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                klog!("bound {}/{} to {node}", p.namespace, p.name);
                p.node = Some(node);
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                // Changed or gone meanwhile: the watch brings the new version.
            }
            Err(e) => klog!("binding {}/{}: {e}", p.namespace, p.name),
        }
    }
}

/// Runs the scheduler until its watch ends.
pub async fn run(args: SchedulerArgs) -> ClusterResult<()> {
    let client = crate::cluster::api_client(&args.kubeconfig).await?;
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.readyz_bind)
        .await
        .map_err(|e| ClusterError::io("bind", args.readyz_bind.to_string(), e))?;
    tokio::spawn(crate::kubelet::serve_readyz(listener, ready.clone()));
    klog!("scheduler starting");
    let api: Api<Pod> = Api::all(client.clone());
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut pods: HashMap<String, PodView> = HashMap::new();
    let mut listing: HashMap<String, PodView> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else { break };
                match ev {
                    Ok(Event::Init) => listing.clear(),
                    Ok(Event::InitApply(p)) => listing.extend(PodView::of(&p)),
                    Ok(Event::InitDone) => {
                        pods = std::mem::take(&mut listing);
                        ready.store(true, Ordering::Relaxed);
                    }
                    Ok(Event::Apply(p)) => match PodView::of(&p) {
                        Some((uid, v)) => { pods.insert(uid, v); }
                        None => { if let Some(u) = p.metadata.uid { pods.remove(&u); } }
                    },
                    Ok(Event::Delete(p)) => { if let Some(u) = p.metadata.uid { pods.remove(&u); } }
                    Err(e) => { klog!("watching pods: {e} (retrying)"); continue; }
                }
                pass(&client, &mut pods).await;
            }
            _ = tick.tick() => pass(&client, &mut pods).await,
        }
    }
    Err(ClusterError::Api("the pod watch ended".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: Option<&str>, finished: bool) -> PodView {
        PodView {
            namespace: "d".into(),
            name: "p".into(),
            resource_version: "1".into(),
            node: node.map(str::to_string),
            finished,
        }
    }

    #[test]
    fn the_least_loaded_node_wins_and_ties_go_by_name() {
        let nodes = vec!["n2".to_string(), "n1".to_string(), "n3".to_string()];
        assert_eq!(pick_node(&nodes, &[]), Some("n1"));
        let pods = [
            view(Some("n1"), false),
            view(Some("n2"), false),
            view(Some("n3"), true),    // finished: does not count
            view(Some("gone"), false), // a node that no longer exists
            view(None, false),
        ];
        assert_eq!(pick_node(&nodes, &pods), Some("n3"));
        assert_eq!(pick_node(&[], &pods), None);
    }

    #[test]
    fn the_binding_is_guarded_by_the_resource_version() {
        let p = binding_patch("lab-node2", "42");
        assert_eq!(p["spec"]["nodeName"], "lab-node2");
        assert_eq!(p["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn deleted_pods_are_not_viewed_and_empty_node_names_are_unbound() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "d", "uid": "u", "resourceVersion": "7"},
            "spec": {"nodeName": "", "containers": []},
            "status": {"phase": "Succeeded"}}))
        .expect("pod");
        let (uid, v) = PodView::of(&p).expect("view");
        assert_eq!(uid, "u");
        assert_eq!(v.node, None);
        assert!(v.finished);
        let mut gone = p.clone();
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(PodView::of(&gone), None);
    }
}
